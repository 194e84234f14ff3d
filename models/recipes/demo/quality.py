"""Intelligibility harness for the demo model: pocketsphinx word error rate with bootstrap confidence intervals.

Front end (from the feasibility study): peak-normalise to 0.9, add white noise sigma 3e-3 (espeak's exact
digital silence otherwise breaks pocketsphinx's noise estimate), resample to 16 kHz. Text on both sides:
lower-case, hyphens to spaces, everything but [a-z' ] dropped, quotes trimmed off words.

score_audio(texts, make_audio) scores any text -> audio callable: raw espeak (score_espeak), codec
resynthesis (score_codec) or the trained model later. Needs the `demo` extra (pocketsphinx, jiwer, scipy).
"""

from __future__ import annotations

import multiprocessing as mp
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from leapvox.models.recipes.stats import paired_ratio_delta, ratio_ci

NOISE_SIGMA = 3e-3
PEAK = 0.9


def log(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def normalise_text(text: str) -> str:
    words = re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " ")).split()
    return " ".join(w.strip("'") for w in words if w.strip("'"))


def asr_input(wav: np.ndarray, sample_rate: int, seed: int = 0) -> np.ndarray:
    """float audio at 24 kHz or 22,050 Hz -> int16 16 kHz with the noise floor."""
    from scipy.signal import resample_poly

    x = np.asarray(wav, dtype=np.float64).reshape(-1)
    x = x * (PEAK / max(np.abs(x).max(), 1e-9))
    x = x + np.random.default_rng(seed).normal(0.0, NOISE_SIGMA, x.shape)
    up, down = {24000: (2, 3), 22050: (320, 441), 16000: (1, 1)}[sample_rate]
    x = resample_poly(x, up, down)
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


_DECODER = None


def _init_asr() -> None:
    global _DECODER
    from pocketsphinx import Decoder

    _DECODER = Decoder(loglevel="FATAL")


def _transcribe(pcm16: np.ndarray) -> str:
    """One utterance, independent of what this decoder heard before: without `reinit_feat` the feature state
    carries over, so a hypothesis depended on which worker had transcribed which utterances (a few in 100
    changed from run to run)."""
    _DECODER.reinit_feat()
    _DECODER.start_utt()
    _DECODER.process_raw(pcm16.tobytes(), full_utt=True)
    _DECODER.end_utt()
    hyp = _DECODER.hyp()
    return hyp.hypstr if hyp is not None else ""


@dataclass
class WerResult:
    """Per-sentence counts; WER = errors / words over the whole set."""

    refs: list[str]
    hyps: list[str]
    errors: np.ndarray  # [S] substitutions + deletions + insertions
    words: np.ndarray  # [S] reference words
    sdi: tuple[int, int, int]

    @property
    def wer(self) -> float:
        return float(self.errors.sum() / self.words.sum())

    def ci(self, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
        return bootstrap_ci(self.errors, self.words, draws=draws, seed=seed)

    def summary(self) -> dict:
        lo, hi = self.ci()
        s, d, i = self.sdi
        return {"wer": round(self.wer, 4), "ci95": [round(lo, 4), round(hi, 4)], "sentences": len(self.refs),
                "words": int(self.words.sum()), "sub": s, "del": d, "ins": i,
                "exact": round(float((self.errors == 0).mean()), 4)}


def word_errors(refs: list[str], hyps: list[str]) -> WerResult:
    import jiwer

    errors, words, sdi = [], [], np.zeros(3, dtype=int)
    for r, h in zip(refs, hyps, strict=True):
        r, h = normalise_text(r), normalise_text(h)
        if not h:
            n = len(r.split())
            errors.append(n)
            words.append(n)
            sdi += (0, n, 0)
            continue
        o = jiwer.process_words(r, h)
        errors.append(o.substitutions + o.deletions + o.insertions)
        words.append(o.substitutions + o.deletions + o.hits)
        sdi += (o.substitutions, o.deletions, o.insertions)
    return WerResult(list(refs), list(hyps), np.array(errors), np.array(words), tuple(int(v) for v in sdi))


def bootstrap_ci(errors: np.ndarray, words: np.ndarray, draws: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap over sentences of sum(errors) / sum(words)."""
    return ratio_ci(errors, words, draws=draws, seed=seed, level=level)


def paired_delta(a: WerResult, b: WerResult, draws: int = 2000, seed: int = 0) -> dict:
    """WER(b) - WER(a) on the same sentences with a paired bootstrap CI (the same resampled sentences)."""
    return paired_ratio_delta(a.errors, a.words, b.errors, a.words, draws=draws, seed=seed)


def transcribe_all(audio: list[np.ndarray], workers: int = 2) -> list[str]:
    """16 kHz int16 clips -> pocketsphinx hypotheses, on `workers` processes."""
    t0, out = time.perf_counter(), []
    with mp.get_context("spawn").Pool(workers, _init_asr) as pool:
        for i, hyp in enumerate(pool.imap(_transcribe, audio, chunksize=4), 1):
            out.append(hyp)
            if i % 50 == 0 or i == len(audio):
                log(f"asr: {i}/{len(audio)} ({time.perf_counter() - t0:.0f} s)")
    return out


def score_audio(texts: list[str], make_audio: Callable[[str, int], tuple[np.ndarray, int]],
                workers: int = 2) -> WerResult:
    """WER of any text -> audio function: make_audio(text, index) -> (float waveform, sample rate)."""
    clips = []
    for i, text in enumerate(texts):
        wav, rate = make_audio(text, i)
        clips.append(asr_input(wav, rate, seed=i))
    return word_errors(texts, transcribe_all(clips, workers))


def teacher_audio(teacher: str = "espeak"):
    """text, index -> the teacher's canonical 24 kHz audio (hibari: noise seed = the index)."""
    from .data import TEACHERS

    t = TEACHERS[teacher]
    return lambda text, i: t.render(text, *t.canonical, i)[0]


def score_teacher(texts: list[str], teacher: str = "espeak", workers: int = 2) -> WerResult:
    """(a) Raw teacher audio, canonical voice, at 24 kHz as the codec sees it."""
    audio = teacher_audio(teacher)
    return score_audio(texts, lambda t, i: (audio(t, i).numpy(), 24000), workers)


def score_espeak(texts: list[str], workers: int = 2) -> WerResult:
    """(a) Raw espeak-ng audio (canonical voice, resampled to 24 kHz as the codec sees it)."""
    return score_teacher(texts, "espeak", workers)


def score_codec(texts: list[str], codec, workers: int = 2, teacher: str = "espeak") -> WerResult:
    """(b) Codec resynthesis: teacher audio -> encode -> one-shot decode."""
    audio = teacher_audio(teacher)

    def resynth(text, i):
        with torch.no_grad():
            codes = codec.encode(audio(text, i))  # [T, 16]
            return codec(codes.t()[None])[0, 0].numpy(), 24000

    return score_audio(texts, resynth, workers)


def canonical_utterances(split: dict, n: int) -> list[int]:
    """Utterance index of the canonical rendition of each sentence 0..n-1 of a build-data split (the split's own
    `canonical` (speed, pitch); espeak's for data built before teachers were recorded)."""
    from leapvox.models.frontend import CANONICAL

    canonical, out = tuple(split.get("canonical", CANONICAL)), {}
    for u in range(len(split["sentence"])):
        s = int(split["sentence"][u])
        if s < n and (int(split["speed"][u]), int(split["pitch"][u])) == canonical:
            out[s] = u
    return [out[s] for s in range(n)]


def canonical_frames(split: dict, n: int) -> list[int]:
    """Frames of the canonical rendition of sentences 0..n-1 of a build-data split (the length reference)."""
    return [int(split["offsets"][u + 1] - split["offsets"][u]) for u in canonical_utterances(split, n)]


def score_model(texts: list[str], synth, opts, ref_frames: list[int], workers: int = 2) -> tuple[WerResult, dict]:
    """WER of a model's free-running synthesis (sentence i sampled with seed i), plus length and stop statistics.

    Each utterance is capped at 3x its reference length + 20 frames (a run-away counts as stop reason
    max_frames), so one lost generation cannot stall the evaluation."""
    from dataclasses import replace

    ratios, stops, t_audio, t_wall = [], {}, 0.0, 0.0

    def make(text, i):
        nonlocal t_audio, t_wall
        r = synth.synthesize(text, replace(opts, seed=i, max_frames=min(opts.max_frames, 3 * ref_frames[i] + 20)))
        ratios.append(len(r.codes) / ref_frames[i])
        stops[r.stats.stop_reason] = stops.get(r.stats.stop_reason, 0) + 1
        t_audio, t_wall = t_audio + r.duration_s, t_wall + r.elapsed_s
        if (i + 1) % 25 == 0:
            log(f"synthesised {i + 1}/{len(texts)}")
        return r.audio, r.sample_rate

    result = score_audio(texts, make, workers)
    r = np.array(ratios)
    extra = {"duration_ratio_median": round(float(np.median(r)), 3),
             "within_20pct": round(float((np.abs(r - 1) <= 0.2).mean()), 3), "stop_reasons": stops,
             "xrt": round(t_audio / max(t_wall, 1e-9), 2)}
    return result, extra


@torch.inference_mode()
def teacher_forced_codes(loaded, split: dict, n: int, params=None, true_codes: int = 0) -> list[torch.Tensor]:
    """Codes [T, 16] for sentences 0..n-1 of a build-data split whose code 0 is the canonical rendition's own and
    whose codes 1..15 the model's code predictor samples (sentence i with seed i) from the talker run teacher-forced
    over those frames. Scoring them isolates the predictor's share of the WER gap from the talker's.

    `true_codes` = K keeps the rendition's own codes 1..K too, spliced over the same draw (codes K+1..15 are the
    ones drawn with K = 0): scoring K = 0, 3, 7 ... shows which residual groups the gap sits in."""
    from leapvox.engine.fast.predictor import PredictorLoop

    from .train import Example, make_batch, model_texts

    tts, cfg, tok = loaded.tts, loaded.config, loaded.tokenizer
    import json

    texts = model_texts(split, json.loads((loaded.path / "config.json").read_text()).get("leapvox_text_frontend"))
    tts.eval()
    role = tok("<|im_start|>assistant\n")
    params = params or loaded.defaults.predictor
    loop = PredictorLoop(tts.talker.code_predictor)
    out = []
    for s, u in enumerate(canonical_utterances(split, n)):
        codes = split["codes"][split["offsets"][u] : split["offsets"][u + 1]].long()
        x, _, starts, _ = make_batch(tts, cfg, [Example(role, tok(texts[s]), codes)])
        h = tts.talker.model.forward_train(x, 0.0)  # [1, S, H]; row L-1+k produced code 0 of frame k
        g, L, rows = torch.Generator().manual_seed(s), starts[0], []
        for k in range(len(codes)):
            c0 = codes[k : k + 1, :1]  # [1, 1]
            rows.append(torch.cat([c0, loop(h[:, L - 1 + k][:, None], tts.talker.embed_codec(c0), params, g)], 1))
        out.append(torch.cat([codes[:, : 1 + true_codes], torch.cat(rows)[:, 1 + true_codes :]], 1))
    return out


def codec_space_error(codes: list[torch.Tensor], split: dict, codec) -> dict | None:
    """Where each residual code moves a frame, for `codes` from teacher_forced_codes (the same sentences): the mean
    squared distance, summed over the codec's PCA dimensions, between each frame's true codeword sum and its true
    code 0's codeword plus the codewords of `codes`' codes 1..k, for k = 0..15; and how often code k equals the
    rendition's own. A code whose codeword is unrelated to the frame raises the error. None for a codec without
    codebooks in one space (the 12 Hz Qwen codec)."""
    books = getattr(codec, "codebooks", None)
    if books is None:
        return None
    books = [b.detach().float() for b in books]
    true = torch.cat([split["codes"][split["offsets"][u] : split["offsets"][u + 1]].long()
                      for u in canonical_utterances(split, len(codes))])
    pred = torch.cat(codes)
    target = sum(books[q][true[:, q]] for q in range(len(books)))
    acc = books[0][true[:, 0]]
    errors = [float(((target - acc) ** 2).sum(1).mean())]
    for q in range(1, len(books)):
        acc = acc + books[q][pred[:, q]]
        errors.append(float(((target - acc) ** 2).sum(1).mean()))
    return {"frames": len(true), "error_after_code": [round(e, 2) for e in errors],
            "match": [round(float((pred[:, q] == true[:, q]).float().mean()), 3) for q in range(1, len(books))]}


def score_codes(texts: list[str], codes: list[torch.Tensor], codec, workers: int = 2) -> WerResult:
    """Decode stored codes [T, 16] (e.g. the dataset's, or a model's output) and score them."""
    return score_audio(texts, lambda t, i: (codec(codes[i].long().t()[None])[0, 0].numpy(), 24000), workers)
