"""Training data for the demo model: fortunes sentences -> teacher speech (augmented) -> demo-codec codes.

Two teachers (`TEACHERS`): `espeak` (the espeak-ng program, speed x pitch grid, IPA phonemes; the bundled model's
data) and `hibari` (hibari-tts from pip, its packaged voice "heart", a speed grid, misaki phonemes from its own
G2P; the teacher of issue #26's retrained model).

build_data(out_dir) writes (see models/recipes/demo/README.md for the layout):
  manifest.json          provenance, licence, espeak-ng version, filters, splits, variant grid, counts, timings
  train.pt / test.pt     per-split dict: text/phonemes/source per sentence; codes and per-utterance rows
  speech_tokenizer/      the demo codec, fitted on train sentences only
The test split is fixed by the seed and never used to fit the codec (nor, by the training recipe, the model).
Needs the `demo` extra (scipy, pocketsphinx for its dictionary, hibari-tts) and the Debian package fortunes;
the espeak teacher also the espeak-ng program.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
import torch

from leapvox.models.files import write_text_atomic
from leapvox.models.frontend import CANONICAL, VOICE, hibari_phonemes, phoneme_string

FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES_COPYRIGHT = Path("/usr/share/doc/fortunes/copyright")
# fortune files left out of the corpus: jokes built on ethnic and gender stereotypes have no place in a product voice
EXCLUDED_SOURCES = frozenset({"ethnic", "men-women"})
SPEEDS, PITCHES = (150, 175, 200), (40, 50, 60)
ALLOWED = re.compile(r"[A-Za-z ,.;:!?'\"-]+")
ABBREVIATION = re.compile(r"(^|\s)([A-Z]|Mr|Mrs|Ms|Dr|St|Jr|Sr|Ltd|Inc|Co|Prof|Gen|Col|Capt|Rev|vs|etc)\.$")


def log(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


# --- text ------------------------------------------------------------------------------------------------


def pocketsphinx_words() -> set[str]:
    """The words of pocketsphinx's bundled en-us dictionary (so ASR scores measure audio, not unknown words)."""
    from pocketsphinx import get_model_path

    with open(os.path.join(get_model_path(), "en-us", "cmudict-en-us.dict"), encoding="utf-8") as f:
        return {line.split(maxsplit=1)[0].split("(")[0] for line in f if line.strip()}


def words_of(sentence: str) -> list[str]:
    """Lower-case words with apostrophes kept, hyphens split, as the ASR scoring normalises them."""
    return re.sub(r"[^a-z' ]", " ", sentence.lower().replace("-", " ")).replace("' ", " ").split()


def sentence_ok(s: str, vocab: set[str] | None, words: tuple[int, int] = (5, 20)) -> bool:
    n = len(s.split())
    return (
        words[0] <= n <= words[1] and s[0].isupper() and s[-1] in ".!?" and ALLOWED.fullmatch(s) is not None
        and "--" not in s and ".." not in s and s.count('"') % 2 == 0 and not ABBREVIATION.search(s)
        and not any(len(w) > 1 and w.isupper() for w in re.findall(r"[A-Za-z]+", s))  # acronyms, shouting
        and (vocab is None or all(w.strip("'") in vocab for w in words_of(s)))
    )


def extra_sentence_ok(s: str, vocab: set[str] | None = None) -> bool:
    """The looser rule of the extra training sentences: 3-30 words, any word (espeak pronounces names and rare
    words too; only the test split needs pocketsphinx's dictionary), otherwise as `sentence_ok`."""
    return sentence_ok(s, None, (3, 30))


def read_corpus(folder: Path = FORTUNES_DIR, vocab: set[str] | None = None,
                rule=sentence_ok, exclude: frozenset[str] = EXCLUDED_SOURCES) -> tuple[list[tuple[str, str]], int]:
    """All filtered, de-duplicated sentences as (sentence, fortune file), plus the number of raw candidates."""
    seen, kept, candidates = set(), [], 0
    for path in sorted(p for p in folder.iterdir() if p.is_file() and "." not in p.name):
        if path.name in exclude:
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for entry in re.split(r"^%\s*$", text, flags=re.M):
            flat = " ".join(entry.split())
            for s in re.split(r"(?<=[.!?])\s+", flat):
                candidates += 1
                key = " ".join(words_of(s))
                if s and key not in seen and rule(s, vocab):
                    seen.add(key)
                    kept.append((s, path.name))
    return kept, candidates


def train_test_split(items: list, test_size: int, seed: int) -> tuple[list, list]:
    """A fixed random split: (train, test). Sorted first so the split does not depend on file order."""
    items = sorted(items)
    random.Random(seed).shuffle(items)
    return items[test_size:], items[:test_size]


def split_corpus(folder: Path, vocab: set[str] | None, test_size: int, seed: int) -> tuple[list, list, int, int]:
    """(train, test, candidates, kept): the split of the bundled model's data. The split is drawn over the corpus
    as it was first built, the EXCLUDED_SOURCES files included, so the test sentences (and their order) are the
    ones every WER in the model card was measured on; only train then drops the excluded files' sentences (the
    test split keeps its 24 of 500: scored, never trained on). Splitting the reduced corpus would draw another
    test split."""
    sentences, candidates = read_corpus(folder, vocab, exclude=frozenset())
    train, test = train_test_split(sentences, test_size, seed)
    return [x for x in train if x[1] not in EXCLUDED_SOURCES], test, candidates, len(sentences)


def variants_for(index: int, count: int, seed: int, teacher: str = "espeak") -> list[tuple[int, int]]:
    """(speed, pitch) per rendition: the teacher's canonical voice first, then distinct random grid points."""
    t = TEACHERS[teacher]
    grid = [v for v in t.grid if v != t.canonical]
    return [t.canonical, *random.Random(seed * 1_000_003 + index).sample(grid, count - 1)]


def max_variants(teacher: str) -> int:
    return len(TEACHERS[teacher].grid)


# --- speech ----------------------------------------------------------------------------------------------


def espeak_version() -> str:
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("Data at")[0].replace("eSpeak NG text-to-speech:", "").strip()


def espeak(text: str, speed: int = CANONICAL[0], pitch: int = CANONICAL[1], voice: str = VOICE) -> tuple:
    """Synthesise with the espeak-ng CLI: (int16 samples at 22,050 Hz, IPA phoneme lines)."""
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--ipa", "-w", f.name, "--", text]
        ipa = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        with wave.open(f.name) as w:
            if w.getframerate() != 22050 or w.getsampwidth() != 2:
                raise RuntimeError(f"espeak-ng wrote {w.getframerate()} Hz / {8 * w.getsampwidth()} bit audio")
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return pcm, [line.strip() for line in ipa.splitlines() if line.strip()]


def to_24k(pcm: np.ndarray) -> torch.Tensor:
    """int16 22,050 Hz -> float32 24 kHz."""
    from scipy.signal import resample_poly

    return torch.from_numpy(resample_poly(pcm.astype(np.float32) / 32768.0, 160, 147).astype(np.float32))


HIBARI_VOICE = "heart"  # packaged in the wheel: no download
HIBARI_CANONICAL = (100, 0)  # speed in percent of the teacher's pace; hibari has no pitch control (0 = n/a)
HIBARI_SPEEDS = (85, 92, 100, 108, 115)


def hibari_version() -> str:
    from importlib.metadata import version

    return version("hibari-tts")


class EspeakTeacher:
    """espeak-ng CLI, voice en-us, speed x pitch grid; phonemes: its IPA with the clause punctuation re-attached."""

    name, canonical, frontend = "espeak", CANONICAL, "espeak-ng-ipa"
    grid = tuple((s, p) for s in SPEEDS for p in PITCHES)

    def render(self, text: str, speed: int, pitch: int, seed: int) -> tuple[torch.Tensor, str, bool]:
        pcm, clauses = espeak(text, speed, pitch)
        return to_24k(pcm), *phoneme_string(text, clauses)

    def describe(self) -> dict:
        return {
            "teacher": "espeak", "synth": f"espeak-ng {espeak_version()} (Debian {_dpkg_version('espeak-ng')})",
            "voice": VOICE, "native_rate": 22050, "resample": "scipy.signal.resample_poly 160/147 -> 24000 Hz",
            "canonical": {"speed": CANONICAL[0], "pitch": CANONICAL[1]},
            "grid": {"speed": list(SPEEDS), "pitch": list(PITCHES)},
            "licence": "espeak-ng is GPL-3.0-or-later; its generated speech carries no licence restriction of its own",
            "phonemes": "espeak-ng --ipa, voice en-us, canonical rendition; one IPA line per clause, the text's clause "
                        "punctuation re-attached (phoneme_string)",
        }


class HibariTeacher:
    """hibari-tts (pip), its packaged voice "heart", 24 kHz; speed in percent of its pace, a fixed noise seed per
    utterance; phonemes: its own G2P's misaki string for the text (`frontend.hibari_phonemes`, what the
    synthesiser reads)."""

    name, canonical, frontend = "hibari", HIBARI_CANONICAL, "hibari-g2p"
    grid = tuple((s, 0) for s in HIBARI_SPEEDS)

    def __init__(self):
        self._tts = None

    def render(self, text: str, speed: int, pitch: int, seed: int) -> tuple[torch.Tensor, str, bool]:
        if self._tts is None:
            from hibari import SAMPLE_RATE, Hibari

            if SAMPLE_RATE != 24000:
                raise RuntimeError(f"hibari-tts {hibari_version()} makes {SAMPLE_RATE} Hz audio, not 24 kHz")
            self._tts = Hibari(voice=HIBARI_VOICE, threads=1)
        wav = self._tts(text, speed=speed / 100, seed=seed)
        return torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)), hibari_phonemes(text), True

    def describe(self) -> dict:
        from hibari.voices import VOICES, sha256_of, voice_path

        return {
            "teacher": "hibari", "synth": f"hibari-tts {hibari_version()} (PyPI)", "voice": HIBARI_VOICE,
            "voice_file_sha256": sha256_of(voice_path(HIBARI_VOICE)), "distilled_from": "Kokoro-82M "
            + VOICES[HIBARI_VOICE]["kokoro"], "native_rate": 24000, "resample": None,
            "canonical": {"speed": HIBARI_CANONICAL[0] / 100}, "grid": {"speed": [v / 100 for v in HIBARI_SPEEDS]},
            "noise_seed": "seed * 1_000_003 + (split offset + sentence index) * 16 + rendition (utterance_seed)",
            "licence": "hibari-tts code and weights Apache-2.0 (Maureese Williams); its voice is distilled from "
                       "Kokoro-82M's af_heart (hexgrad, Apache-2.0), so training on its output is allowed",
            "caveats": ["hibari-tts 0.2.1 is a young release with a single maintainer",
                        "Kokoro-82M's own training mix is largely synthetic audio",
                        "the licence of hibari's text corpus (for its distillation) is not verified"],
            "phonemes": "hibari's own G2P (misaki conventions, US lexicon + OOV net), sentence by sentence, joined by "
                        "spaces (leapvox.models.frontend.hibari_phonemes; the string the synthesiser reads)",
        }


TEACHERS = {"espeak": EspeakTeacher(), "hibari": HibariTeacher()}


# --- worker processes -------------------------------------------------------------------------------------

_CODEC = None
_TEACHER = None


def _init_worker(codec_dir: str | None, teacher: str = "espeak") -> None:
    global _CODEC, _TEACHER
    torch.set_num_threads(1)
    _TEACHER = TEACHERS[teacher]
    if codec_dir:
        from .codec_fit import load_codec

        _CODEC = load_codec(codec_dir)


def _render(job: tuple) -> tuple:
    """(text, speed, pitch, seed) -> (codes int16 [T, 16], or the 24 kHz wav without a codec; samples; phoneme
    string; whether its punctuation aligned)."""
    text, speed, pitch, seed = job
    wav, phonemes, aligned = _TEACHER.render(text, speed, pitch, seed)
    out = wav if _CODEC is None else _CODEC.encode(wav).to(torch.int16)
    return out.numpy(), wav.shape[0], phonemes, aligned  # numpy: torch tensors would cross as file descriptors


def render_all(jobs: list, workers: int, codec_dir: str | None, what: str, teacher: str = "espeak") -> list:
    """Run jobs on `workers` processes, in order, with progress on stderr."""
    t0, out, step = time.perf_counter(), [], max(1, len(jobs) // 20)
    with mp.get_context("spawn").Pool(workers, _init_worker, (codec_dir, teacher)) as pool:
        for i, r in enumerate(pool.imap(_render, jobs, chunksize=8), 1):
            out.append(r)
            if i % step == 0 or i == len(jobs):
                log(f"{what}: {i}/{len(jobs)} ({time.perf_counter() - t0:.0f} s)")
    return out


# --- the build --------------------------------------------------------------------------------------------


def build_data(out_dir: str | Path, fortunes_dir: str | Path = FORTUNES_DIR, test_size: int = 500,
               variants: int = 3, fit_sentences: int = 2400, workers: int = 2, seed: int = 0,
               limit: int | None = None, fit_iters: int = 25, refit: bool = False, teacher: str = "espeak",
               vocab: set[str] | None = None) -> dict:
    """Build the demo dataset and fit the demo codec into `out_dir`. Returns the manifest.

    `teacher` speaks the sentences (`TEACHERS`). `limit` keeps only that many train sentences (for quick trials);
    `fit_sentences` train sentences, each in one random rendition, fit the codec; a codec already fitted in
    `out_dir` is reused unless `refit`. `vocab` replaces pocketsphinx's dictionary (tests)."""
    from .codec_fit import fit_codec, is_demo_codec, save_codec

    if teacher not in TEACHERS:
        raise ValueError(f"teacher must be one of {sorted(TEACHERS)}, got {teacher!r}")
    out, t_start, timings = Path(out_dir), time.perf_counter(), {}
    out.mkdir(parents=True, exist_ok=True)
    train, test, candidates, kept = split_corpus(Path(fortunes_dir), vocab or pocketsphinx_words(), test_size, seed)
    log(f"corpus: {kept} sentences kept of {candidates} candidates; {len(train)} train, {len(test)} test "
        f"(teacher {teacher})")
    train = train[:limit] if limit else train

    t = time.perf_counter()
    rng = random.Random(seed)
    fit_idx = sorted(rng.sample(range(len(train)), min(fit_sentences, len(train))))
    fit_jobs = []
    for i in fit_idx:
        v = rng.choice(range(variants))
        speed, pitch = variants_for(i, variants, seed, teacher)[v]
        fit_jobs.append((train[i][0], speed, pitch, utterance_seed(seed, "train", i, v)))
    codec_dir = out / "speech_tokenizer"
    if refit or not is_demo_codec(codec_dir):
        fit_wavs = [torch.from_numpy(r[0]) for r in render_all(fit_jobs, workers, None, "codec fit audio", teacher)]
        timings["fit_audio_s"] = round(time.perf_counter() - t, 1)
        torch.set_num_threads(workers)
        codec, stats = fit_codec(fit_wavs, iters=fit_iters, seed=seed)
        del fit_wavs
        save_codec(codec, codec_dir, {
            "data": f"fortunes train split, teacher {teacher} (see ../manifest.json)", "sentences": len(fit_idx),
            "frames": stats["frames"], "kmeans_iters": fit_iters, "seed": seed, "fit_seconds": stats["fit_seconds"],
            "pca_explained": round(stats["pca_explained"], 5), "stage_mse": [round(m, 5) for m in stats["stage_mse"]],
        })
    else:
        log(f"reusing the fitted codec in {codec_dir} (refit=True fits again)")
    timings["codec_fit_s"] = json.loads((codec_dir / "config.json").read_text())["fit"].get("fit_seconds")

    counts = {}
    for name, items in (("test", test), ("train", train)):  # test first: WER can start while train renders
        t = time.perf_counter()
        split = encode_split(items, variants, seed, workers, str(codec_dir), name, teacher)
        tmp = out / f"{name}.pt.part"
        torch.save(split, tmp)
        tmp.replace(out / f"{name}.pt")
        timings[f"{name}_s"] = round(time.perf_counter() - t, 1)
        counts[name] = split_counts(split)
    timings["total_s"] = round(time.perf_counter() - t_start, 1)
    manifest = make_manifest(Path(fortunes_dir), candidates, kept, counts, variants, seed, timings, teacher)
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    log(f"done in {timings['total_s']:.0f} s: {out}")
    return manifest


def split_counts(split: dict) -> dict:
    return {"sentences": len(split["text"]), "utterances": len(split["speed"]), "frames": split["codes"].shape[0],
            "hours": round(split["num_samples"].sum().item() / 24000 / 3600, 2),
            "phonemes_aligned": split.pop("_aligned")}


def new_sentences(sentences: list[tuple[str, str]], train: list[str], test: list[str]) -> list[tuple[str, str]]:
    """The (sentence, source) pairs whose words equal no train or test sentence's and contain no test sentence's
    (compared as `words_of`, so case and punctuation do not matter)."""
    def key(s: str) -> str:
        return " ".join(words_of(s))

    seen, tests = {key(x) for x in train + test}, [f" {key(x)} " for x in test]
    return [(s, src) for s, src in sentences if key(s) not in seen and not any(k in f" {key(s)} " for k in tests)]


def build_extra(data_dir: str | Path, fortunes_dir: str | Path = FORTUNES_DIR, variants: int = 3, workers: int = 2,
                seed: int = 0, teacher: str | None = None) -> dict:
    """Add `extra.pt` (train.pt's layout) to a built dataset: the fortunes sentences that only the looser
    `extra_sentence_ok` admits, encoded with the dataset's own codec and spoken by its teacher (from its
    manifest; espeak for data built before teachers were recorded). A sentence whose words equal a train or test
    sentence's, or contain a test sentence's, is left out, so the test split stays unseen. Returns the counts,
    also recorded in manifest.json under "extra"."""
    data, t = Path(data_dir), time.perf_counter()
    manifest_path = data / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    teacher = teacher or dataset_teacher(manifest)
    texts = {name: torch.load(data / f"{name}.pt", weights_only=False)["text"] for name in ("train", "test")}
    sentences, _ = read_corpus(Path(fortunes_dir), None, extra_sentence_ok)
    items = new_sentences(sentences, texts["train"], texts["test"])
    log(f"extra: {len(items)} new sentences of {len(sentences)} under the looser rule")
    split = encode_split(items, variants, seed, workers, str(data / "speech_tokenizer"), "extra", teacher)
    tmp = data / "extra.pt.part"
    torch.save(split, tmp)
    tmp.replace(data / "extra.pt")
    counts = {**split_counts(split), "teacher": teacher,
              "rule": "3-30 words, any word, otherwise the main filter; no sentence equal to a train or test "
                      "sentence or containing a test sentence", "seconds": round(time.perf_counter() - t, 1)}
    if manifest is not None:
        manifest["extra"] = counts
        write_text_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return counts


def dataset_teacher(manifest: dict | None) -> str:
    """The teacher a built dataset's manifest names (espeak for data built before teachers were recorded)."""
    return ((manifest or {}).get("speech") or {}).get("teacher", "espeak")


SPLIT_OFFSETS = {"train": 0, "test": 10_000_000, "extra": 20_000_000}


def utterance_seed(seed: int, name: str, index: int, rendition: int) -> int:
    """The teacher's noise seed of rendition `rendition` of sentence `index` of split `name` (hibari draws a
    noise component; espeak ignores it)."""
    return seed * 1_000_003 + (SPLIT_OFFSETS[name] + index) * 16 + rendition


def encode_split(items: list, variants: int, seed: int, workers: int, codec_dir: str, name: str,
                 teacher: str = "espeak") -> dict:
    """Render every sentence `variants` times and encode it; rows are utterances, codes are concatenated."""
    jobs, sentence, speed, pitch = [], [], [], []
    for i, (text, _) in enumerate(items):
        for r, (s, p) in enumerate(variants_for(SPLIT_OFFSETS[name] + i, variants, seed, teacher)):
            jobs.append((text, s, p, utterance_seed(seed, name, i, r)))
            sentence.append(i)
            speed.append(s)
            pitch.append(p)
    results = render_all(jobs, workers, codec_dir, f"{name} audio + codes", teacher)
    canonical = TEACHERS[teacher].canonical
    phonemes, aligned = [""] * len(items), 0
    for j, (_, _, string, ok) in enumerate(results):
        if (speed[j], pitch[j]) == canonical:
            phonemes[sentence[j]] = string
            aligned += ok
    lengths = torch.tensor([r[0].shape[0] for r in results])
    codes = torch.from_numpy(np.concatenate([r[0] for r in results]))  # int16 [sum T, 16]
    return {
        "text": [t for t, _ in items], "phonemes": phonemes, "source": [src for _, src in items],
        "teacher": teacher, "canonical": list(canonical), "frontend": TEACHERS[teacher].frontend,
        "codes": codes,
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),  # utterance u: offsets[u]:[u+1]
        "sentence": torch.tensor(sentence, dtype=torch.int32),
        "speed": torch.tensor(speed, dtype=torch.int16),
        "pitch": torch.tensor(pitch, dtype=torch.int16),
        "num_samples": torch.tensor([r[1] for r in results], dtype=torch.long),
        "_aligned": aligned,
    }


def make_manifest(folder: Path, candidates: int, kept: int, counts: dict, variants: int, seed: int,
                  timings: dict, teacher: str = "espeak") -> dict:
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and "." not in p.name)
    digest = hashlib.sha256(b"".join((folder / f).read_bytes() for f in files)).hexdigest()
    t = TEACHERS[teacher].describe()
    return {
        "source": {
            "package": "fortunes (Debian, main)", "version": _dpkg_version("fortunes"), "folder": str(folder),
            "files": files, "sha256_of_concatenated_files": digest,
            "licence": "BSD-3-Clause-style (University of California, fortune-mod); see "
                       f"{FORTUNES_COPYRIGHT} for the per-file notes (not verified file by file)",
        },
        "filter": {
            "rule": "split entries on '%' and sentence ends; keep sentences that start upper-case, end in .!?, "
                    "have 5-20 words, only letters, spaces and ,.;:!?'\"- (no digits or other symbols), every word "
                    "in pocketsphinx's cmudict-en-us.dict; de-duplicated on normalised words",
            "candidates": candidates, "kept": kept,
            "excluded_sources": sorted(EXCLUDED_SOURCES),
            "split_rule": "sorted, shuffled with the seed over every kept sentence (excluded files included, as the "
                          "corpus was first built), the first test_size are test; train then drops the excluded "
                          "files' sentences (split_corpus)",
        },
        "speech": {**{k: v for k, v in t.items() if k != "phonemes"}, "variants_per_sentence": variants},
        "phonemes": t["phonemes"],
        "split": {"seed": seed, **counts},
        "timings": timings,
    }


def _dpkg_version(package: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return r.stdout.strip() or None
