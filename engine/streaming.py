"""Streaming synthesis: audio chunks as frames are produced, sentence by sentence, each carrying one stats record.

Layering: `Synthesizer.frames` (one utterance, any mode) -> `stream_speech` (sentences, codec streaming,
crossfades, timings) -> callers (`speak --play`, the TUI, `compare`). Every mode yields the same `SpeechChunk`,
so callers never branch on the mode.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .errors import InputError
from .generate import DecodeStats
from .options import SynthesisOptions, validate
from .synthesis import Synthesizer, make_generator

SENTENCE_MAX_CHARS = 300  # longer sentences are cut at clauses, then at words
CROSSFADE_S = 0.015  # equal-power crossfade where two sentences join
FIRST_CHUNK_FRAMES = 2  # 160 ms: the first audio leaves early ...
MAX_CHUNK_FRAMES = 16  # ... later chunks double up to 1.28 s, fewer codec calls

# Abbreviations whose full stop does not end a sentence (compared lowercased, without the final dot).
_ABBREVIATIONS = """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx no nos fig figs vol vols ch sec p pp
ed eds inc ltd co corp dept univ gen col lt sgt capt rev hon jan feb mar apr jun jul aug sep sept oct nov dec"""
ABBREVIATIONS = frozenset(_ABBREVIATIONS.split())
_SENTENCE_END = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)"  # Latin: the mark(s), closing quotes/brackets, then a space
    r"|[\u3002\uff01\uff1f]+[\u201d\u300d\u300f)\uff09]*"  # CJK full-width marks need no space
)
_CLAUSE_END = re.compile(r"[,;:\u2013\u2014](?=\s)|[\uff0c\uff1b\uff1a\u3001]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


# ---- text -------------------------------------------------------------------------------------------------


def split_sentences(text: str, max_chars: int = SENTENCE_MAX_CHARS) -> list[str]:
    """Sentences of `text` in order, none longer than `max_chars`: cut at sentence ends (not after "Dr." or
    "e.g.", not inside "3.14"), then overlong ones at clauses, then at words, then anywhere."""
    text = " ".join(text.split())
    out: list[str] = []
    for sentence in _cut(text, _sentence_ends(text)):
        out += _fit(sentence, max_chars)
    return out


def _sentence_ends(text: str) -> list[int]:
    ends = []
    for m in _SENTENCE_END.finditer(text):
        if m.group().startswith(".") and not _ends_sentence(text, m.start(), m.end()):
            continue
        ends.append(m.end())
    return ends


def _ends_sentence(text: str, dot: int, after: int) -> bool:
    """A full stop ends a sentence unless it closes an abbreviation or initial, or lowercase text follows."""
    word = text[:dot].rsplit(" ", 1)[-1].lstrip("\"'(\u201c\u2018[").lower()
    if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return False
    rest = text[after:].lstrip()
    return not (rest[:1].islower())


def _cut(text: str, ends: list[int]) -> list[str]:
    pieces, start = [], 0
    for end in [*ends, len(text)]:
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    return pieces


def _fit(sentence: str, max_chars: int) -> list[str]:
    """`sentence` as pieces of at most max_chars: clauses packed greedily, then words, then hard cuts."""
    if len(sentence) <= max_chars:
        return [sentence]
    clauses = _cut(sentence, [m.end() for m in _CLAUSE_END.finditer(sentence)])
    if len(clauses) > 1:
        return _pack([p for c in clauses for p in _fit(c, max_chars)], max_chars, " ")
    words = sentence.split(" ")
    if len(words) > 1:
        return _pack([p for w in words for p in _fit(w, max_chars)], max_chars, " ")
    return [sentence[i : i + max_chars] for i in range(0, len(sentence), max_chars)]


def _pack(parts: list[str], max_chars: int, sep: str) -> list[str]:
    out: list[str] = []
    for p in parts:
        joiner = "" if out and (_CJK.search(out[-1][-1:]) or _CJK.search(p[:1])) else sep
        if out and len(out[-1]) + len(joiner) + len(p) <= max_chars:
            out[-1] += joiner + p
        else:
            out.append(p)
    return out


def estimate_audio_s(text: str) -> float:
    """Rough spoken length: ~14 characters a second for alphabetic text, ~4.5 for CJK characters."""
    cjk = len(_CJK.findall(text))
    return 0.22 * cjk + 0.07 * (len(text) - cjk)


# ---- stats ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamStats:
    """One record for every mode: counters and timings of a stream so far (totals over its sentences)."""

    mode: str
    frames: int = 0
    sentence: int = 0  # sentences started so far (1-based index of the current one)
    sentences: int = 0  # sentences in the text
    audio_s: float = 0.0  # audio handed out so far
    elapsed_s: float = 0.0  # wall time since the stream started
    first_audio_s: float | None = None  # wall time to the first audio chunk
    talker_calls: int = 0
    predictor_calls: int = 0
    predicted_codes: int = 0  # codes 1..15 the code predictor produced (accepted ones, for spec)
    kv_bytes: int = 0  # talker KV cache bytes in use (the ring's, for windowed)
    prefill_s: float = 0.0
    talker_s: float = 0.0  # decode steps, prefill excluded
    predictor_s: float = 0.0
    codec_s: float = 0.0
    est_remaining_s: float = 0.0  # audio still to come, estimated from the text and the speech so far
    stop_reasons: tuple[str, ...] = ()  # per finished sentence: eos, max_frames, guard, cancelled
    warnings: tuple[str, ...] = ()

    @property
    def xrt(self) -> float:
        """xRT: audio seconds per wall second (bigger is faster)."""
        return self.audio_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        """Talker steps (calls) per wall second."""
        return self.talker_calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def predictor_calls_per_s(self) -> float:
        return self.predictor_calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tok_per_call(self) -> float:
        """Codes accepted per code-predictor call: 1.0 for ar, more for spec."""
        return self.predicted_codes / self.predictor_calls if self.predictor_calls else 0.0

    @property
    def kv_mb(self) -> float:
        return self.kv_bytes / 2**20

    def stage_ms(self) -> dict[str, float]:
        """Mean milliseconds per frame for each stage (prefill spread over the frames is left out)."""
        n = max(self.frames, 1)
        return {"talker": 1e3 * self.talker_s / n, "predictor": 1e3 * self.predictor_s / n,
                "codec": 1e3 * self.codec_s / n}

    def as_dict(self) -> dict:
        """Raw numbers, derived ones included, for JSON."""
        d = asdict(self)
        d.update(xrt=self.xrt, steps_per_s=self.steps_per_s, predictor_calls_per_s=self.predictor_calls_per_s,
                 tok_per_call=self.tok_per_call, kv_mb=self.kv_mb,
                 **{f"{k}_ms_per_frame": v for k, v in self.stage_ms().items()})
        d["stop_reasons"], d["warnings"] = list(self.stop_reasons), list(self.warnings)
        return d


@dataclass(frozen=True)
class SpeechChunk:
    audio: np.ndarray  # [n] float32 in [-1, 1]; may be empty (the final record, a cancelled stream)
    sample_rate: int
    codes: torch.Tensor  # [f, 16] the frames whose audio this chunk carries (crossfade tails aside)
    sentence: int  # 0-based index of the sentence being spoken
    stats: StreamStats
    final: bool = False


@dataclass
class _Tally:
    """Mutable totals over the sentences of one stream; `snapshot` freezes them into a StreamStats."""

    mode: str
    sentences: list[str]
    t0: float = field(default_factory=time.perf_counter)
    done: DecodeStats = field(default_factory=DecodeStats)  # sums over finished sentences
    current: DecodeStats = field(default_factory=DecodeStats)
    codes_per_frame: int = 15
    sentence: int = 0
    audio_samples: int = 0  # handed out so far
    sentence_samples: int = 0  # decoded for the current sentence
    first_audio_s: float | None = None
    stop_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spoken_s: list[float] = field(default_factory=list)  # audio of each finished sentence

    def begin(self, index: int) -> DecodeStats:
        self.sentence, self.current, self.sentence_samples = index, DecodeStats(), 0
        return self.current

    def finish(self, stop_reason: str, sentence_audio_s: float) -> None:
        c, d = self.current, self.done
        for name in ("frames", "talker_calls", "predictor_calls", "talker_s", "predictor_s", "prefill_s", "codec_s"):
            setattr(d, name, getattr(d, name) + getattr(c, name))
        self.stop_reasons.append(stop_reason or c.stop_reason)
        self.spoken_s.append(sentence_audio_s)
        self.current = DecodeStats(kv_bytes=c.kv_bytes)

    def est_remaining(self, sample_rate: int) -> float:
        guess = [estimate_audio_s(s) for s in self.sentences]
        n = len(self.spoken_s)
        scale = sum(self.spoken_s) / max(sum(guess[:n]), 1e-6) if n else 1.0
        total = sum(self.spoken_s) + scale * sum(guess[n:])
        return max(0.0, total - self.audio_samples / sample_rate)

    def snapshot(self, sample_rate: int) -> StreamStats:
        c, d = self.current, self.done
        frames = d.frames + c.frames
        return StreamStats(
            mode=self.mode, frames=frames, sentence=self.sentence + 1, sentences=len(self.sentences),
            audio_s=self.audio_samples / sample_rate, elapsed_s=time.perf_counter() - self.t0,
            first_audio_s=self.first_audio_s, talker_calls=d.talker_calls + c.talker_calls,
            predictor_calls=d.predictor_calls + c.predictor_calls, predicted_codes=frames * self.codes_per_frame,
            kv_bytes=c.kv_bytes, prefill_s=d.prefill_s + c.prefill_s, talker_s=d.talker_s + c.talker_s,
            predictor_s=d.predictor_s + c.predictor_s, codec_s=d.codec_s + c.codec_s,
            est_remaining_s=self.est_remaining(sample_rate), stop_reasons=tuple(self.stop_reasons),
            warnings=tuple(self.warnings),
        )


# ---- joining sentences ------------------------------------------------------------------------------------


class _Joiner:
    """Holds back the last `n` samples of the audio so far, so that where a sentence ends they can be
    crossfaded (equal power) into the start of the next one. Within a sentence nothing is changed."""

    def __init__(self, n: int):
        t = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
        self.fade_in = np.sin(0.5 * math.pi * t).astype(np.float32)
        self.fade_out = np.cos(0.5 * math.pi * t).astype(np.float32)
        self.n, self.held, self.tail = n, np.zeros(0, np.float32), None

    def add(self, audio: np.ndarray) -> np.ndarray:
        if self.tail is not None and len(audio):
            m = min(len(self.tail), len(audio))
            mixed = self.tail[:m] * self.fade_out[:m] + audio[:m] * self.fade_in[:m]
            audio = np.concatenate([mixed, self.tail[m:] * self.fade_out[m : len(self.tail)], audio[m:]])
            self.tail = None
        run = np.concatenate([self.held, audio])
        cut = max(len(run) - self.n, 0)
        self.held = run[cut:]
        return run[:cut]

    def end_sentence(self) -> None:
        if len(self.held):
            self.tail, self.held = self.held, np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        rest = [x for x in (self.tail, self.held) if x is not None]
        self.tail, self.held = None, np.zeros(0, np.float32)
        return np.concatenate(rest) if rest else np.zeros(0, np.float32)


# ---- the stream -------------------------------------------------------------------------------------------


def stream_speech(
    synth: Synthesizer,
    text: str,
    opts: SynthesisOptions,
    *,
    split: bool = True,
    first_chunk: int = FIRST_CHUNK_FRAMES,
    max_chunk: int = MAX_CHUNK_FRAMES,
    crossfade_s: float = CROSSFADE_S,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[SpeechChunk]:
    """Speak `text` as a stream of SpeechChunks, checking `cancelled()` after every frame.

    Sentences (see split_sentences) are spoken in order with one random stream, one speaker and one set of
    options; the runaway guard applies to each. Chunks grow from `first_chunk` to `max_chunk` frames. The codec
    decodes with the official 300/25 chunking, so for one sentence the concatenated audio equals
    `Synthesizer.synthesize(text, opts).audio` bit for bit. The last chunk has `final=True`.
    """
    opts = validate(opts, synth.cfg)
    sentences = split_sentences(text) if split else [" ".join(text.split())]
    if not sentences:
        raise InputError("the text is empty", hint="give some words to speak")
    sr = synth.sample_rate
    tally = _Tally(opts.mode, sentences, codes_per_frame=synth.cfg.talker.num_code_groups - 1)
    sampling = opts.talker.do_sample or opts.predictor.do_sample
    generator = make_generator(opts.seed) if sampling else None
    codec = synth.codec.stream(official_chunking=True)
    joiner = _Joiner(int(round(crossfade_s * sr)))
    size, stop = first_chunk, False

    def emit(frames: list[torch.Tensor], index: int) -> SpeechChunk:
        codes = torch.stack(frames) if frames else torch.zeros((0, 16), dtype=torch.long)
        wav = np.zeros(0, np.float32)
        if frames:
            t = time.perf_counter()
            wav = codec.push(codes.T[None].to(synth.codec_device)).reshape(-1).float().cpu().numpy()  # [1920 f]
            tally.current.codec_s += time.perf_counter() - t
            tally.sentence_samples += len(wav)
        return _chunk(joiner.add(wav), codes, index)

    def _chunk(audio: np.ndarray, codes: torch.Tensor, index: int, final: bool = False) -> SpeechChunk:
        tally.audio_samples += len(audio)
        if len(audio) and tally.first_audio_s is None:
            tally.first_audio_s = time.perf_counter() - tally.t0
        return SpeechChunk(audio, sr, codes, index, tally.snapshot(sr), final)

    for index, sentence in enumerate(sentences):
        codec.reset()
        stats = tally.begin(index)
        frames = synth.frames(sentence, opts, stats, tally.warnings, generator)
        pending: list[torch.Tensor] = []
        try:
            for frame in frames:
                pending.append(frame)
                if cancelled is not None and cancelled():
                    stop = True
                    break
                if len(pending) >= size:
                    yield emit(pending, index)
                    pending, size = [], min(2 * size, max_chunk)
        finally:
            frames.close()
        if pending or stop:
            yield emit(pending, index)
        tally.finish("cancelled" if stop else "", tally.sentence_samples / sr)
        joiner.end_sentence()
        if stop:
            break
    yield _chunk(joiner.flush(), torch.zeros((0, 16), dtype=torch.long), tally.sentence, final=True)
