"""Training data for the demo model: fortunes sentences -> espeak-ng speech (augmented) -> demo-codec codes.

build_data(out_dir) writes (see models/recipes/demo/README.md for the layout):
  manifest.json          provenance, licence, espeak-ng version, filters, splits, variant grid, counts, timings
  train.pt / test.pt     per-split dict: text/phonemes/source per sentence; codes and per-utterance rows
  speech_tokenizer/      the demo codec, fitted on train sentences only
The test split is fixed by the seed and never used to fit the codec (nor, by the training recipe, the model).
Needs the `demo` extra (scipy, pocketsphinx for its dictionary) and the Debian packages espeak-ng and fortunes.
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
from leapvox.models.frontend import CANONICAL, VOICE, phoneme_string

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
                rule=sentence_ok) -> tuple[list[tuple[str, str]], int]:
    """All filtered, de-duplicated sentences as (sentence, fortune file), plus the number of raw candidates."""
    seen, kept, candidates = set(), [], 0
    for path in sorted(p for p in folder.iterdir() if p.is_file() and "." not in p.name):
        if path.name in EXCLUDED_SOURCES:
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


def variants_for(index: int, count: int, seed: int) -> list[tuple[int, int]]:
    """(speed, pitch) per rendition: the canonical voice first, then distinct random grid points."""
    grid = [(s, p) for s in SPEEDS for p in PITCHES if (s, p) != CANONICAL]
    return [CANONICAL, *random.Random(seed * 1_000_003 + index).sample(grid, count - 1)]


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


# --- worker processes -------------------------------------------------------------------------------------

_CODEC = None


def _init_worker(codec_dir: str | None) -> None:
    global _CODEC
    torch.set_num_threads(1)
    if codec_dir:
        from .codec_fit import load_codec

        _CODEC = load_codec(codec_dir)


def _render(job: tuple[str, int, int]) -> tuple:
    """(text, speed, pitch) -> (codes int16 [T, 16], or the 24 kHz wav without a codec; samples; IPA clauses)."""
    text, speed, pitch = job
    pcm, clauses = espeak(text, speed, pitch)
    wav = to_24k(pcm)
    out = wav if _CODEC is None else _CODEC.encode(wav).to(torch.int16)
    return out.numpy(), wav.shape[0], clauses  # numpy: torch tensors would cross as file descriptors


def render_all(jobs: list, workers: int, codec_dir: str | None, what: str) -> list:
    """Run jobs on `workers` processes, in order, with progress on stderr."""
    t0, out, step = time.perf_counter(), [], max(1, len(jobs) // 20)
    with mp.get_context("spawn").Pool(workers, _init_worker, (codec_dir,)) as pool:
        for i, r in enumerate(pool.imap(_render, jobs, chunksize=8), 1):
            out.append(r)
            if i % step == 0 or i == len(jobs):
                log(f"{what}: {i}/{len(jobs)} ({time.perf_counter() - t0:.0f} s)")
    return out


# --- the build --------------------------------------------------------------------------------------------


def build_data(out_dir: str | Path, fortunes_dir: str | Path = FORTUNES_DIR, test_size: int = 500,
               variants: int = 3, fit_sentences: int = 2400, workers: int = 2, seed: int = 0,
               limit: int | None = None, fit_iters: int = 25, refit: bool = False) -> dict:
    """Build the demo dataset and fit the demo codec into `out_dir`. Returns the manifest.

    `limit` keeps only that many train sentences (for quick trials); `fit_sentences` train sentences, each in
    one random rendition, fit the codec; a codec already fitted in `out_dir` is reused unless `refit`."""
    from .codec_fit import fit_codec, is_demo_codec, save_codec

    out, t_start, timings = Path(out_dir), time.perf_counter(), {}
    out.mkdir(parents=True, exist_ok=True)
    sentences, candidates = read_corpus(Path(fortunes_dir), pocketsphinx_words())
    log(f"corpus: {len(sentences)} sentences kept of {candidates} candidates")
    train, test = train_test_split(sentences, test_size, seed)
    train = train[:limit] if limit else train

    t = time.perf_counter()
    rng = random.Random(seed)
    fit_idx = sorted(rng.sample(range(len(train)), min(fit_sentences, len(train))))
    fit_jobs = [(train[i][0], *rng.choice(variants_for(i, variants, seed))) for i in fit_idx]
    codec_dir = out / "speech_tokenizer"
    if refit or not is_demo_codec(codec_dir):
        fit_wavs = [torch.from_numpy(r[0]) for r in render_all(fit_jobs, workers, None, "codec fit audio")]
        timings["fit_audio_s"] = round(time.perf_counter() - t, 1)
        torch.set_num_threads(workers)
        codec, stats = fit_codec(fit_wavs, iters=fit_iters, seed=seed)
        del fit_wavs
        save_codec(codec, codec_dir, {
            "data": "fortunes train split, espeak-ng en-us (see ../manifest.json)", "sentences": len(fit_idx),
            "frames": stats["frames"], "kmeans_iters": fit_iters, "seed": seed, "fit_seconds": stats["fit_seconds"],
            "pca_explained": round(stats["pca_explained"], 5), "stage_mse": [round(m, 5) for m in stats["stage_mse"]],
        })
    else:
        log(f"reusing the fitted codec in {codec_dir} (refit=True fits again)")
    timings["codec_fit_s"] = json.loads((codec_dir / "config.json").read_text())["fit"].get("fit_seconds")

    counts = {}
    for name, items in (("train", train), ("test", test)):
        t = time.perf_counter()
        split = encode_split(items, variants, seed, workers, str(codec_dir), name)
        torch.save(split, out / f"{name}.pt")
        timings[f"{name}_s"] = round(time.perf_counter() - t, 1)
        counts[name] = {"sentences": len(items), "utterances": len(split["speed"]), "frames": split["codes"].shape[0],
                        "hours": round(split["num_samples"].sum().item() / 24000 / 3600, 2),
                        "phonemes_aligned": split.pop("_aligned")}
    timings["total_s"] = round(time.perf_counter() - t_start, 1)
    manifest = make_manifest(Path(fortunes_dir), candidates, len(sentences), counts, variants, seed, timings)
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    log(f"done in {timings['total_s']:.0f} s: {out}")
    return manifest


def new_sentences(sentences: list[tuple[str, str]], train: list[str], test: list[str]) -> list[tuple[str, str]]:
    """The (sentence, source) pairs whose words equal no train or test sentence's and contain no test sentence's
    (compared as `words_of`, so case and punctuation do not matter)."""
    def key(s: str) -> str:
        return " ".join(words_of(s))

    seen, tests = {key(x) for x in train + test}, [f" {key(x)} " for x in test]
    return [(s, src) for s, src in sentences if key(s) not in seen and not any(k in f" {key(s)} " for k in tests)]


def build_extra(data_dir: str | Path, fortunes_dir: str | Path = FORTUNES_DIR, variants: int = 3, workers: int = 2,
                seed: int = 0) -> dict:
    """Add `extra.pt` (train.pt's layout) to a built dataset: the fortunes sentences that only the looser
    `extra_sentence_ok` admits, encoded with the dataset's own codec. A sentence whose words equal a train or test
    sentence's, or contain a test sentence's, is left out, so the test split stays unseen. Returns the counts,
    also recorded in manifest.json under "extra"."""
    data, t = Path(data_dir), time.perf_counter()
    texts = {name: torch.load(data / f"{name}.pt", weights_only=False)["text"] for name in ("train", "test")}
    sentences, _ = read_corpus(Path(fortunes_dir), None, extra_sentence_ok)
    items = new_sentences(sentences, texts["train"], texts["test"])
    log(f"extra: {len(items)} new sentences of {len(sentences)} under the looser rule")
    split = encode_split(items, variants, seed, workers, str(data / "speech_tokenizer"), "extra")
    aligned = split.pop("_aligned")
    tmp = data / "extra.pt.part"
    torch.save(split, tmp)
    tmp.replace(data / "extra.pt")
    counts = {"sentences": len(items), "utterances": len(split["speed"]), "frames": split["codes"].shape[0],
              "hours": round(split["num_samples"].sum().item() / 24000 / 3600, 2), "phonemes_aligned": aligned,
              "rule": "3-30 words, any word, otherwise the main filter; no sentence equal to a train or test "
                      "sentence or containing a test sentence", "seconds": round(time.perf_counter() - t, 1)}
    manifest_path = data / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        manifest["extra"] = counts
        write_text_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return counts


def encode_split(items: list, variants: int, seed: int, workers: int, codec_dir: str, name: str) -> dict:
    """Render every sentence `variants` times and encode it; rows are utterances, codes are concatenated."""
    jobs, sentence, speed, pitch = [], [], [], []
    for i, (text, _) in enumerate(items):
        for s, p in variants_for({"train": 0, "test": 10_000_000, "extra": 20_000_000}[name] + i, variants, seed):
            jobs.append((text, s, p))
            sentence.append(i)
            speed.append(s)
            pitch.append(p)
    results = render_all(jobs, workers, codec_dir, f"{name} audio + codes")
    phonemes, aligned = [""] * len(items), 0
    for j, (_, _, clauses) in enumerate(results):
        if speed[j] == CANONICAL[0] and pitch[j] == CANONICAL[1]:
            phonemes[sentence[j]], ok = phoneme_string(items[sentence[j]][0], clauses)
            aligned += ok
    lengths = torch.tensor([r[0].shape[0] for r in results])
    codes = torch.from_numpy(np.concatenate([r[0] for r in results]))  # int16 [sum T, 16]
    return {
        "text": [t for t, _ in items], "phonemes": phonemes, "source": [src for _, src in items],
        "codes": codes,
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),  # utterance u: offsets[u]:[u+1]
        "sentence": torch.tensor(sentence, dtype=torch.int32),
        "speed": torch.tensor(speed, dtype=torch.int16),
        "pitch": torch.tensor(pitch, dtype=torch.int16),
        "num_samples": torch.tensor([r[1] for r in results], dtype=torch.long),
        "_aligned": aligned,
    }


def make_manifest(folder: Path, candidates: int, kept: int, counts: dict, variants: int, seed: int,
                  timings: dict) -> dict:
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and "." not in p.name)
    digest = hashlib.sha256(b"".join((folder / f).read_bytes() for f in files)).hexdigest()
    return {
        "source": {
            "package": "fortunes (Debian, main)", "version": _dpkg_version("fortunes"), "folder": str(folder),
            "files": files, "sha256_of_concatenated_files": digest,
            "licence": "BSD-3-Clause-style (University of California, fortune-mod); see "
                       f"{FORTUNES_COPYRIGHT} for the per-file notes",
        },
        "filter": {
            "rule": "split entries on '%' and sentence ends; keep sentences that start upper-case, end in .!?, "
                    "have 5-20 words, only letters, spaces and ,.;:!?'\"- (no digits or other symbols), every word "
                    "in pocketsphinx's cmudict-en-us.dict; de-duplicated on normalised words",
            "candidates": candidates, "kept": kept,
        },
        "speech": {
            "synth": f"espeak-ng {espeak_version()} (Debian {_dpkg_version('espeak-ng')})", "voice": VOICE,
            "native_rate": 22050, "resample": "scipy.signal.resample_poly 160/147 -> 24000 Hz",
            "variants_per_sentence": variants, "canonical": {"speed": CANONICAL[0], "pitch": CANONICAL[1]},
            "grid": {"speed": list(SPEEDS), "pitch": list(PITCHES)},
        },
        "phonemes": "espeak-ng --ipa, voice en-us, canonical rendition; one IPA line per clause, the text's clause "
                    "punctuation re-attached (phoneme_string)",
        "split": {"seed": seed, **counts},
        "timings": timings,
    }


def _dpkg_version(package: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return r.stdout.strip() or None
