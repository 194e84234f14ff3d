"""build-data on a fabricated fortunes folder: the split rule that keeps the bundled model's test sentences, and
a whole (tiny) build with the hibari teacher (its packaged voice: no network)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from leapvox.models.catalog import DEMO_DIR
from leapvox.models.recipes.demo import data as D

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


def sentence(i: int, n: int = 6) -> str:
    words = [WORDS[(i * 7 + k * 5) % len(WORDS)] for k in range(n)]
    return " ".join([words[0].capitalize(), *words[1:], f"number {WORDS[i % len(WORDS)]} {WORDS[i // len(WORDS)]}"]) \
        + "."


def fortunes(folder, per_file: int = 12):
    """Three fortune files, one of them an excluded source; entries split on '%'."""
    folder.mkdir()
    i = 0
    for name in ("science", "ethnic", "work"):
        entries = []
        for _ in range(per_file):
            entries.append(sentence(i))
            i += 1
        (folder / name).write_text("\n%\n".join(entries) + "\n")
        (folder / f"{name}.dat").write_bytes(b"\0")  # index files are not read
    return {w for w in WORDS + ["number"]}


def test_split_draws_over_the_whole_corpus_and_only_train_drops_excluded_sources(tmp_path):
    vocab = fortunes(tmp_path / "f")
    train, test, candidates, kept = D.split_corpus(tmp_path / "f", vocab, 10, seed=0)
    everything, _ = D.read_corpus(tmp_path / "f", vocab, exclude=frozenset())
    assert kept == len(everything) == 36 and candidates >= kept
    full_train, full_test = D.train_test_split(everything, 10, 0)
    assert test == full_test  # the bundled model's test sentences, in their order
    assert train == [x for x in full_train if x[1] not in D.EXCLUDED_SOURCES]
    assert any(src == "ethnic" for _, src in full_train) and all(src != "ethnic" for _, src in train)
    reduced, _ = D.read_corpus(tmp_path / "f", vocab)  # the old rule: split after excluding -> another test split
    assert D.train_test_split(reduced, 10, 0)[1] != test


def test_variants_keep_the_canonical_voice_first_and_stay_on_each_teachers_grid():
    for teacher, canonical in (("espeak", D.CANONICAL), ("hibari", D.HIBARI_CANONICAL)):
        grid = set(D.TEACHERS[teacher].grid)
        for i in range(20):
            v = D.variants_for(i, D.max_variants(teacher), 0, teacher)
            assert v[0] == canonical and len(set(v)) == len(v) == len(grid) and set(v) == grid
    assert D.variants_for(3, 3, 0, "espeak") == D.variants_for(3, 3, 0)  # espeak data is built as before
    assert D.utterance_seed(0, "test", 2, 1) != D.utterance_seed(0, "train", 2, 1)


def test_hibari_build_writes_codes_phonemes_and_provenance(tmp_path):
    pytest.importorskip("hibari", reason="hibari-tts (pip install 'leapvox[demo]') is not installed: the hibari "
                                        "teacher's build is not verified")
    from leapvox.models.frontend import hibari_phonemes

    vocab = fortunes(tmp_path / "f", per_file=4)
    out = tmp_path / "data"
    # a fitted codec in the folder is reused (k-means of 1,024 codewords needs more frames than a test makes)
    shutil.copytree(DEMO_DIR / "speech_tokenizer", out / "speech_tokenizer")
    manifest = D.build_data(out, tmp_path / "f", test_size=3, variants=2, fit_sentences=6, workers=1, fit_iters=2,
                            teacher="hibari", vocab=vocab)
    assert manifest["speech"]["teacher"] == "hibari" and manifest["speech"]["voice"] == "heart"
    assert "Apache-2.0" in manifest["speech"]["licence"] and "Kokoro-82M" in manifest["speech"]["distilled_from"]
    assert len(manifest["speech"]["caveats"]) == 3 and manifest["speech"]["native_rate"] == 24000
    assert json.loads((out / "manifest.json").read_text()) == manifest
    test = torch.load(out / "test.pt", weights_only=False)
    train = torch.load(out / "train.pt", weights_only=False)
    want_train, want_test, _, _ = D.split_corpus(tmp_path / "f", vocab, 3, 0)
    assert test["text"] == [t for t, _ in want_test] and train["text"] == [t for t, _ in want_train]
    assert "ethnic" not in train["source"] and 0 < len(train["text"]) < 9
    for split in (train, test):
        assert split["teacher"] == "hibari" and split["frontend"] == "hibari-g2p"
        assert tuple(split["canonical"]) == D.HIBARI_CANONICAL
        assert split["phonemes"] == [hibari_phonemes(t) for t in split["text"]]
        n = len(split["text"])
        assert split["sentence"].tolist() == [i for i in range(n) for _ in range(2)]
        assert split["speed"][::2].tolist() == [100] * n and all(s in D.HIBARI_SPEEDS for s in split["speed"].tolist())
        frames = (split["offsets"][1:] - split["offsets"][:-1]).tolist()
        assert frames == [-(-int(s) // 1920) for s in split["num_samples"]]  # whole 80 ms frames of 24 kHz audio
        assert split["codes"].dtype == torch.int16 and split["codes"].shape == (sum(frames), 16)
        assert int(split["codes"][:, 0].max()) < 1024 and int(split["codes"][:, 1:].max()) < 256
        # a faster rendition is shorter than the canonical one of the same sentence
        for i in range(n):
            fast = split["speed"][2 * i + 1] > 100
            assert (split["num_samples"][2 * i + 1] < split["num_samples"][2 * i]) == bool(fast)


def test_wer_finds_each_teachers_canonical_rendition():
    from leapvox.models.recipes.demo.quality import canonical_utterances

    split = {"sentence": torch.tensor([0, 0, 1, 1]), "speed": torch.tensor([92, 100, 100, 115]),
             "pitch": torch.zeros(4, dtype=torch.int16), "canonical": [100, 0]}
    assert canonical_utterances(split, 2) == [1, 2]
    old = {"sentence": torch.tensor([0, 0]), "speed": torch.tensor([150, 175]), "pitch": torch.tensor([40, 50])}
    assert canonical_utterances(old, 1) == [1]  # data built before teachers: espeak's canonical voice
