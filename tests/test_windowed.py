"""windowed mode: exact while the window holds every frame, ring == naive masked attention, bounded memory."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from leapvox.engine.backend import TorchBackend
from leapvox.engine.caches import RingCache, window_mask
from leapvox.engine.decode import DecodeStats, SpecCodes, frame_loop
from leapvox.engine.errors import InputError
from leapvox.engine.options import SynthesisOptions, validate
from leapvox.engine.prompt import build_prompt
from leapvox.engine.spec import DraftPlan

from .conftest import FIXTURES

TEXT = "Hello world, this is a test."


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory):
    from leapvox.models.load import load_model

    mp = pytest.MonkeyPatch()
    mp.setenv("LEAPVOX_HOME", str(tmp_path_factory.mktemp("home")))  # no stored offsets or trees
    yield load_model(FIXTURES / "tiny-0b6")
    mp.undo()


@pytest.mark.parametrize("layout", ["non-streaming", "streaming"])
def test_windowed_equals_ar_when_the_window_holds_every_frame(fixture_model, layout):
    m = fixture_model
    synth = m.synthesizer()
    base = replace(m.defaults, max_frames=16, text_layout=layout, seed=7, runaway_guard=False)
    warnings = []
    for opts in (base.greedy(), base):
        ar, ar_stats, _ = synth.generate_codes(TEXT, opts)
        win, win_stats, w = synth.generate_codes(TEXT, replace(opts, mode="windowed", window=16))
        warnings += w
        assert len(ar) == 16 and win.tolist() == ar.tolist()
        assert win_stats.kv_bytes == ar_stats.kv_bytes and win_stats.attn_span == ar_stats.attn_span
        assert len(win_stats.step_ms) == win_stats.talker_calls - 1
    assert sum("approximation" in w for w in warnings) == 1  # said once per Synthesizer
    _, short_stats, _ = synth.generate_codes(TEXT, replace(base, mode="windowed", window=4, max_frames=len(ar)))
    assert short_stats.frames == len(ar)  # the last step saw the prompt + 4 frame rows, not + 15
    assert short_stats.attn_span == ar_stats.attn_span - 15 + 4
    assert short_stats.kv_bytes * ar_stats.attn_span == ar_stats.kv_bytes * short_stats.attn_span


def test_windowed_combines_with_spec(fixture_model):
    m = fixture_model
    synth = m.synthesizer()
    opts = replace(m.defaults, max_frames=10, mode="windowed", window=3).greedy()
    plain, _, _ = synth.generate_codes(TEXT, opts)
    prompt = build_prompt(synth.tts.talker, synth.cfg, synth.text_ids(TEXT), validate(opts, synth.cfg).speaker, "auto")
    stats = DecodeStats()
    backend = TorchBackend(synth.tts.talker)  # the loop is mode-agnostic: a ring cache with spec's verify calls
    cap = backend.setup(prompt.embeds.shape[1], 10, window=opts.window)
    codes = SpecCodes(backend, DraftPlan())
    stats.spec = codes.stats
    frames = list(frame_loop(backend, codes, synth.tts.talker, prompt, opts, cap, None, stats))
    assert torch.stack(frames).tolist() == plain.tolist()
    assert stats.spec.tokens == 15 * len(frames)


def test_window_mask_covers_prompt_and_written_ring_slots():
    assert window_mask(2, 3, 0).tolist() == [[True, True, True, False, False]]
    assert window_mask(2, 3, 1).tolist() == [[True, True, True, True, False]]
    assert window_mask(2, 3, 7).tolist() == [[True] * 5]


def test_ring_wraparound_equals_naive_masked_full_attention(tiny_model):
    _, model = tiny_model
    talker, naive = model.talker, copy.deepcopy(model.talker)
    L, W, steps = 7, 5, 15
    g = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, L, 64, generator=g)
    rows = torch.randn(1, steps, 64, generator=g)
    ring = RingCache(talker, L, W)
    naive.model.setup_cache(L + steps)
    with torch.inference_mode():
        h_ring, _ = ring.prefill(prompt)
        h_naive, _ = naive(prompt, 0)
        assert (h_ring - h_naive).abs().max() < 1e-5
        for k in range(steps):
            mask = torch.zeros(1, L + k + 1, dtype=torch.bool)
            mask[:, :L] = True
            mask[:, L + max(0, k - W + 1) :] = True  # the prompt and the last W frame rows
            h_ring, _ = ring.step(rows[:, k : k + 1], k)
            h_naive = naive.model(rows[:, k : k + 1], L + k, mask)
            assert (h_ring - h_naive).abs().max() < 1e-5, k
            for rc, nc in zip(talker.model.caches, naive.model.caches, strict=True):  # keys keep their rotation
                assert (rc.k[:, :, ring.slot(k)] - nc.k[:, :, L + k]).abs().max() < 1e-5


def test_memory_is_constant_over_2000_frames(tiny_model):
    _, model = tiny_model
    talker = model.talker
    L, W = 9, 48
    ring = RingCache(talker, L, W)
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(1, 16, 64, generator=g)

    def cache_bytes() -> int:
        return sum(c.k.nbytes + c.v.nbytes for c in talker.model.caches)

    with torch.inference_mode():
        ring.prefill(torch.randn(1, L, 64, generator=g))
        sizes = []
        for k in range(2000):
            h, _ = ring.step(rows[:, k % 16 : k % 16 + 1], k)
            if k >= W:
                sizes.append((cache_bytes(), ring.kv_bytes(k), ring.span(k)))
    row_bytes = 2 * 2 * 2 * 16 * 4  # K and V x layers x kv heads x head_dim x fp32
    assert set(sizes) == {((L + W) * row_bytes, (L + W) * row_bytes, L + W)}
    assert torch.isfinite(h).all()  # positions far past the RoPE table are computed, not indexed


def test_window_option_is_validated(tiny_model):
    cfg, _ = tiny_model
    with pytest.raises(InputError, match="window"):
        validate(SynthesisOptions(window=0), cfg)
    assert validate(SynthesisOptions(mode="windowed", window=1), cfg).window == 1


def test_cli_window_flag_reaches_the_options():
    from leapvox.app.cli import build_parser
    from leapvox.app.common import flag_values
    from leapvox.engine.options import build_options

    args = build_parser().parse_args(["speak", "hi", "-o", "x.wav", "--mode", "windowed", "--window", "12"])
    opts = build_options(flag_values(args), SynthesisOptions())
    assert (opts.mode, opts.window) == ("windowed", 12)
    args = build_parser().parse_args(["speak", "hi", "-o", "x.wav"])
    assert build_options(flag_values(args), SynthesisOptions()).window == 48


def test_bench_window_reports_flat_windowed_kv(tmp_path):
    from leapvox.app.recipes.window import bench_window, random_talker

    from .conftest import tiny_config_dict

    talker = random_talker(tiny_config_dict()["talker_config"])
    out = bench_window(talker, frames=40, every=10, window=8, prompt=5, repeats=1)
    w, a = out["modes"]["windowed"], out["modes"]["ar"]
    assert out["frames"] == [10, 20, 30, 40] and all(t > 0 for t in w["step_ms"] + a["step_ms"])
    assert w["attn_span"] == [13] * 4 and a["attn_span"] == [15, 25, 35, 45]
    assert len(set(w["kv_bytes"])) == 1 and a["kv_bytes"] == sorted(a["kv_bytes"])


def test_ar_reads_only_rows_it_wrote_and_a_ring_reusing_its_cache_zeroes_it(fixture_model):
    """ar's full cache is allocated unset (memory resident only as rows are written, not for the whole frame cap):
    NaN in every unwritten slot changes no code; windowed reusing that bigger cache gets its slots zeroed."""
    m = fixture_model
    synth, talker = m.synthesizer(), m.tts.talker
    opts = replace(m.defaults, max_frames=12, seed=3, runaway_guard=False)
    ar, _, _ = synth.generate_codes(TEXT, opts)
    win, _, _ = synth.generate_codes(TEXT, replace(opts, mode="windowed", window=4))
    talker.model.caches = None
    real_setup = type(talker.model).setup_cache

    def poisoned(self, max_len, batch=1, dtype=None, zeroed=True):
        fresh = self.caches is None or self.cache_len < max_len
        real_setup(self, max_len, batch, dtype, zeroed)
        if fresh and not zeroed:
            for c in self.caches:
                c.k.fill_(float("nan"))
                c.v.fill_(float("nan"))

    mp = pytest.MonkeyPatch()
    mp.setattr(type(talker.model), "setup_cache", poisoned)
    try:
        again, _, _ = synth.generate_codes(TEXT, replace(opts, max_frames=40))  # a bigger cache, NaN beyond each row
        assert again[:12].tolist() == ar.tolist()
        assert not torch.isfinite(talker.model.caches[0].k).all()  # rows past the last step are still unset
        for c in talker.model.caches:  # as if an earlier ar run had stopped before writing any row
            c.k.fill_(float("nan"))
            c.v.fill_(float("nan"))
        win_again, _, _ = synth.generate_codes(TEXT, replace(opts, mode="windowed", window=4))  # reuses it
        assert win_again.tolist() == win.tolist()
    finally:
        mp.undo()
        talker.model.caches = None
