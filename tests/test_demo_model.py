"""The bundled demo model: present, small, the default --model, and it speaks offline through the real CLI.

These tests load the shipped weights; the model's quality (WER) is measured by `leapvox recipe demo wer`, outside CI,
and recorded in its model card."""

from __future__ import annotations

import json
import shutil
import wave
from dataclasses import replace

import pytest

from leapvox.models.catalog import CATALOG, DEMO_DIR, bundled_ready, default_model

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="the demo model's text front end needs the espeak-ng program (apt install "
                                       "espeak-ng); .ci/run installs it")


def test_bundled_demo_is_complete_small_and_default(monkeypatch):
    assert bundled_ready(CATALOG["demo"])
    for name in ("config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
                 "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
                 "README.md"):
        assert (DEMO_DIR / name).is_file(), name
    size = sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file())
    assert size < 40 * 2**20, f"bundled demo model is {size / 2**20:.1f} MiB"
    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    assert cfg["tts_model_type"] == "custom_voice" and cfg["leapvox_text_frontend"] == "espeak-ng-ipa"
    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    assert default_model() == "demo"
    monkeypatch.setenv("LEAPVOX_MODEL", "/somewhere/else")
    assert default_model() == "/somewhere/else"


def test_speak_without_model_uses_the_demo_offline(tmp_path, monkeypatch, capsys):
    from leapvox.app.cli import main

    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing cached: the demo needs no download
    # the parser reads the default when it is built, so build it after the environment is set
    out = tmp_path / "hello.wav"
    assert main(["speak", "Hello world.", "-o", str(out), "--seed", "0"]) == 0
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        seconds = w.getnframes() / 24000
    assert 0.4 < seconds < 4.0  # "Hello world." is about 1 s; the guard would stop a runaway at ~2.4 s + 1 s/token
    assert "guard" not in capsys.readouterr().err


def test_demo_stops_by_itself_with_plausible_lengths():
    """Seeded sampling, default settings: every utterance ends on the end-of-speech code, longer text longer."""
    from leapvox.models.load import load_model

    m = load_model(DEMO_DIR)
    synth = m.synthesizer()
    short = synth.synthesize("Good morning.", replace(m.defaults, seed=1))
    long = synth.synthesize("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
                            "woods.", replace(m.defaults, seed=1))
    assert short.stats.stop_reason == long.stats.stop_reason == "eos"
    assert long.duration_s > 2 * short.duration_s
    assert 0.1 < abs(long.audio).max() <= 1.0  # audible, not clipped


def test_demo_streams_like_the_tui_and_play_do():
    """Synthesizer.stream (behind speak, the TUI and compare) runs on the demo codec's streaming decoder."""
    import numpy as np

    from leapvox.models.load import load_model

    m = load_model(DEMO_DIR)
    chunks = list(m.synthesizer().stream("Hello there. How are you today?", replace(m.defaults, seed=2)))
    audio = np.concatenate([c.audio for c in chunks])
    assert len(chunks) >= 2 and len(audio) > 24000 // 2 and np.isfinite(audio).all()


def test_demo_ships_trained_spec_offsets_and_spec_stays_exact(tmp_path, monkeypatch):
    """The bundle's leapvox_offsets.safetensors (7 drafts deep) is what spec mode drafts with (no zero-offsets
    notice), and with it greedy spec still equals greedy ar token for token (verification never sees the offsets)."""
    import torch

    from leapvox.models.load import load_model
    from leapvox.models.spec_assets import BESIDE, load_offsets

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))  # nothing from the data folder: only what ships
    m = load_model(DEMO_DIR, "fp32")
    offsets, path = load_offsets(DEMO_DIR, m.tts.talker.code_predictor.cfg.hidden_size)
    assert path == DEMO_DIR / BESIDE and offsets.shape == (7, m.tts.talker.code_predictor.cfg.hidden_size)
    assert offsets.abs().sum() > 0  # trained, not the zero baseline
    synth = m.synthesizer()
    assert synth.plan.offsets is not None
    assert synth.plan.tree.max_depth == synth.plan.depth == 7  # no calibrated tree: the default drafts 7 deep
    opts = replace(m.defaults, max_frames=30).greedy()
    ar, _, _ = synth.generate_codes("The quick brown fox.", opts)
    sp, stats, warnings = synth.generate_codes("The quick brown fox.", replace(opts, mode="spec"))
    assert torch.equal(sp, ar)
    assert not any("zero offsets" in w for w in warnings)
    assert stats.spec.tokens == 15 * len(sp) and stats.spec.calls < stats.spec.tokens  # it drafted ahead


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "w8a8", "w4a8", "int4"])
def test_demo_speaks_in_every_weight_format_and_mode(weights, tmp_path, monkeypatch):
    """Every `--weights` format with every mode on the shipped model (its trained offsets included): audio comes out.
    bf16 crashed here twice over: the demo codec's weights went bf16 beside its fp32 filterbank, and the stored fp32
    offsets met bf16 hidden states in spec's drafts."""
    import numpy as np

    from leapvox.engine.fast.quant import format_unavailable_reason
    from leapvox.engine.options import MODES, WEIGHT_FORMATS
    from leapvox.models.load import load_model

    assert weights in WEIGHT_FORMATS
    if why := format_unavailable_reason(weights):
        pytest.skip(f"{weights} does not run on this machine: {why}")
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))  # only what ships: the bundle's offsets, no tune profile
    m = load_model(DEMO_DIR, weights)
    synth = m.synthesizer()
    for mode in MODES:
        result = synth.synthesize("Good morning.", replace(m.defaults, seed=3, mode=mode, max_frames=10))
        assert result.stats.frames > 0 and np.isfinite(result.audio).all() and abs(result.audio).max() > 0.01, mode
