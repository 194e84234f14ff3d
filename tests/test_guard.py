"""The runaway guard follows the model: a model whose text tokens are not Qwen's BPE tokens (the demo reads IPA
phonemes) sets its own frames-per-token rate in config.json."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

from leapvox.engine.options import GUARD_BASE_FRAMES, guard_frames
from leapvox.engine.prompt import build_prompt
from leapvox.models.load import load_model

from .conftest import FIXTURES


def test_guard_rate_defaults_to_qwen_and_takes_the_models_own():
    assert guard_frames(100) == GUARD_BASE_FRAMES + 1200
    assert guard_frames(100, 2.25) == GUARD_BASE_FRAMES + 225
    assert guard_frames(3, 0.5) == GUARD_BASE_FRAMES + 2  # rounded up


def test_the_demo_sets_its_measured_rate():
    m = load_model("demo", "fp32")
    assert m.config.leapvox_guard_frames_per_token == 2.25  # tests/benchmarks/guard-demo-frames-per-token.json


def test_a_runaway_stops_at_the_models_cap(tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(FIXTURES / "tiny-0b6", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["leapvox_guard_frames_per_token"] = 0.25
    (folder / "config.json").write_text(json.dumps(cfg))
    m = load_model(folder)
    synth = m.synthesizer()
    opts = replace(m.defaults, seed=0, max_frames=400).greedy()
    text = "Hello world, this is a test."
    codes, stats, warnings = synth.generate_codes(text, opts)
    prompt = build_prompt(m.tts.talker, m.config, synth.text_ids(text), m.defaults.speaker, "auto")
    cap = GUARD_BASE_FRAMES + math.ceil(0.25 * prompt.n_text_tokens)
    assert stats.stop_reason == "guard" and len(codes) == cap  # the random tiny model never says EOS
    assert any("runaway cap" in w for w in warnings)
