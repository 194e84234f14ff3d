"""`leapvox recipe window`: the training mask is windowed mode's attention, the loss terms, the schedule, the run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from leapvox.engine.caches import RingCache
from leapvox.models.recipes.window import WindowSchedule, skew_kl, window_bias


def test_hard_training_mask_equals_windowed_inference(tiny_model):
    """Teacher forcing under window_bias gives, row for row, the hiddens of the ring-cache decoder."""
    _, model = tiny_model
    talker = model.talker
    L, W, frames = 6, 4, 13
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, L + frames, 64, generator=g)
    with torch.no_grad():
        h_train = talker.model.forward_train(x, 0.0, window_bias([L], L + frames, W))
    ring = RingCache(talker, L, W)
    with torch.inference_mode():
        h_prompt, _ = ring.prefill(x[:, :L])
        assert (h_prompt - h_train[:, :L]).abs().max() < 1e-5
        for k in range(frames):
            h, _ = ring.step(x[:, L + k : L + k + 1], k)
            assert (h[0, 0] - h_train[0, L + k]).abs().max() < 1e-5, k


def test_bias_is_causal_and_a_wide_window_is_plain_causal_attention(tiny_model):
    _, model = tiny_model
    b = window_bias([3, 5], 12, 4)
    assert b.shape == (2, 1, 12, 12)
    future = torch.ones(12, 12, dtype=torch.bool).triu(1)
    assert (b[:, 0][:, future] <= -1e4).all()  # never the future
    assert (b[1, 0, 11, :5] == 0).all() and (b[1, 0, 11, 8:] == 0).all() and (b[1, 0, 11, 5:8] <= -1e4).all()
    x = torch.randn(2, 12, 64)
    with torch.no_grad():
        causal = model.talker.model.forward_train(x)
        wide = model.talker.model.forward_train(x, 0.0, window_bias([3, 5], 12, 12))
    assert (causal - wide).abs().max() < 1e-5


def test_soft_mask_damps_gradually_and_hardens():
    soft = window_bias([2], 20, 5, tau=2.0)[0, 0]
    row = soft[19, 2:20].flip(0)  # frame keys 0, 1, 2, .. frames back from the query
    assert (row[:-1] >= row[1:]).all()  # further back, more damped
    assert row[0] > -0.2 and -1.0 < row[4] < -0.3 and row[10] < -2.5  # inside ~0, at the edge ~log 0.5, far: strong
    hard = window_bias([2], 20, 5, tau=0.0)[0, 0]
    assert (hard[19, 15:20] == 0).all() and (hard[19, 2:15] <= -1e4).all()


def test_skew_kl():
    t, s = torch.randn(5, 7), torch.randn(5, 7)
    assert skew_kl(t, t, 0.1).abs() < 1e-6
    ref = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")
    assert torch.allclose(skew_kl(t, s, 0.0), ref, atol=1e-6)
    assert 0 < skew_kl(t, s, 0.5) < skew_kl(t, s, 0.1) < skew_kl(t, s, 0.0)  # skewing bounds the divergence
    assert skew_kl(t, s, 0.1) <= -math.log(0.1) + 1e-6


def test_schedule_anneals_window_and_softness():
    s = WindowSchedule(16, start=128, tau0=4.0, anneal=0.5)
    assert s.at(0, 100) == (128.0, 4.0)
    w_mid, tau_mid = s.at(25, 100)
    assert 16 < w_mid < 128 and 0 < tau_mid < 4
    assert s.at(50, 100) == (16.0, 0.0) and s.at(99, 100) == (16.0, 0.0)
    ws = [s.at(i, 100)[0] for i in range(51)]
    assert all(a >= b for a, b in zip(ws[:-1], ws[1:], strict=True))


def test_train_window_end_to_end_on_the_demo_model(tmp_path):
    """A few steps on the bundled demo model with synthetic data: adapted checkpoint written, loadable, picked up."""
    from leapvox.app.cli import main
    from leapvox.models.catalog import DEMO_DIR
    from leapvox.models.load import load_model

    data = tmp_path / "data"
    data.mkdir()
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 6), ("test", 2)):
        lengths = [20 + 3 * i for i in range(n)]
        codes = torch.cat([torch.randint(0, 256, (f, 16), generator=g) for f in lengths]).short()
        torch.save({
            "phonemes": ["həlˈoʊ wˈɜːld.", "ðə kwˈɪk bɹˈaʊn fˈɑːks."] * n, "source": ["test"] * (2 * n),
            "codes": codes, "offsets": torch.tensor([0] + lengths).cumsum(0), "sentence": torch.arange(n) % 2,
        }, data / f"{split}.pt")
    out = tmp_path / "adapted"
    rc = main(["recipe", "window", "--model", str(DEMO_DIR), "--data", str(data), "--out", str(out), "--window", "8",
               "--start-window", "16", "--steps", "3", "--batch", "2"])
    assert rc == 0
    report = json.loads((out / "leapvox_window_report.json").read_text())
    assert report["steps"] == 3 and len(report["history"]) == 1
    ce = report["heldout_ce"]
    assert all(math.isfinite(v) for rec in ce.values() for v in rec.values())
    loaded = load_model(out)
    assert loaded.config.leapvox_window == 8 and loaded.defaults.window == 8
    original = load_model(DEMO_DIR)
    changed = [k for k, v in loaded.tts.state_dict().items() if not torch.equal(v, original.tts.state_dict()[k])]
    assert changed  # the student was trained
    synth = loaded.synthesizer()
    opts = loaded.defaults.greedy()
    from dataclasses import replace

    result = synth.synthesize("Hello world.", replace(opts, mode="windowed", max_frames=20))
    assert not any("approximation" in w for w in result.warnings)  # the adapted window is not an approximation
    result = synth.synthesize("Hello world.", replace(opts, mode="windowed", window=4, max_frames=20))
    assert any("adapted to a 8-frame window" in w for w in result.warnings)


@pytest.mark.parametrize("bad", [["--window", "0"], ["--steps", "0"], ["--window", "64", "--start-window", "32"],
                                 ["--alpha", "1.0"]])
def test_train_window_rejects_bad_options(tmp_path, capsys, bad):
    from leapvox.app.cli import main

    rc = main(["recipe", "window", "--model", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o"),
               *bad])
    assert rc == 2
    assert "leapvox:" in capsys.readouterr().err
