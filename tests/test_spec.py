"""spec mode: draft tree, lossless acceptance, greedy equality with ar, KV commit."""

from __future__ import annotations

import contextlib
import itertools
import shutil

import pytest
import torch

from leapvox.engine.config import CodePredictorConfig
from leapvox.engine.fast.predictor import loop_for, predict_codes, predict_codes_reference
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.sampling import SamplingParams, temperature_top_k_top_p
from leapvox.engine.spec import (
    DEFAULT_TREE,
    DraftPlan,
    DraftTree,
    SpecStats,
    accept_child,
    chain,
    default_tree,
    predict_codes_spec,
    sample_without_replacement,
)

# chi-square critical values at false-alarm rate 1e-4 (one test of many; a true failure is far above these)
CHI2_CRIT = {5: 25.74, 63: 118.0}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled an outcome of probability zero"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_default_tree_drafts_as_deep_as_asked():
    assert default_tree(3) == DEFAULT_TREE == DraftTree.from_paths([(0, 0, 0), (1, 0), (2,), (0, 1)])
    assert default_tree(1).paths() == [(), (0,), (1,), (2,)]
    deep = default_tree(7)
    assert deep.max_depth == 7 and deep.size == 11 and (0,) * 7 in deep.paths() and (1, 0) in deep.paths()
    for bad in (0, 15):
        with pytest.raises(ValueError):
            default_tree(bad)


def test_tree_from_paths_orders_by_depth_and_masks_ancestors():
    tree = DraftTree.from_paths([(0, 0, 0), (1, 0), (2,), (0, 1)])
    assert tree.paths() == [(), (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert tree.depth == (0, 1, 1, 1, 2, 2, 2, 3) and tree.size == 7 and tree.widths() == [3, 2, 1]
    mask = tree.ancestor_mask()
    assert mask[7].nonzero().flatten().tolist() == [0, 1, 4, 7]  # (0,0,0) sees root, (0,), (0,0), itself
    assert mask[6].nonzero().flatten().tolist() == [0, 2, 6]
    assert not mask[1, 2] and not mask[4, 5]  # siblings never see each other
    assert tree.pruned(1).paths() == [(), (0,), (1,), (2,)]
    assert tree.children()[0] == [1, 2, 3]


@pytest.mark.parametrize("case", ["random", "equal", "peaked_q", "one_candidate"])
def test_acceptance_rule_is_lossless(case):
    """Output of the multi-candidate rule (candidates drawn from q without replacement) is distributed as p."""
    g = torch.Generator().manual_seed(1)
    V, trials = 6, 50_000
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q = {
        "random": torch.softmax(torch.randn(V, generator=g) * 1.5, -1),
        "equal": p.clone(),
        "peaked_q": torch.softmax(torch.tensor([6.0, 0, 0, 0, 0, -2]), -1),
        "one_candidate": torch.softmax(torch.randn(V, generator=g), -1),
    }[case]
    width = 1 if case == "one_candidate" else 3
    counts = torch.zeros(V)
    with _one_thread():
        for _ in range(trials):
            cands = sample_without_replacement(q, width, g).tolist()
            i, residual = accept_child(p, q, cands, g)
            x = cands[i] if i is not None else int(torch.multinomial(residual, 1, generator=g))
            counts[x] += 1
    assert chi_square(counts, p) < CHI2_CRIT[V - 1]


def _tiny_predictor(vocab=4, groups=4, seed=0):
    torch.manual_seed(seed)
    cfg = CodePredictorConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, vocab_size=vocab, num_code_groups=groups,
    )
    cp = CodePredictor(cfg, talker_hidden=16).eval()
    with torch.no_grad():
        for name, p in cp.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0 if "embedding" in name else 1.5 / p.shape[1] ** 0.5)
    cp.model.setup_cache(groups + 1 + 16)
    return cp


def _exact_joint(cp, h, e, params) -> torch.Tensor:
    """Exact ar distribution of codes 1..3 by enumeration: p1(c1) p2(c2|c1) p3(c3|c1,c2)."""
    V = cp.cfg.vocab_size
    joint = torch.zeros(V, V, V)
    with torch.inference_mode():
        for c1, c2 in itertools.product(range(V), repeat=2):
            codes = [cp.embed(1, torch.tensor([[c1]])), cp.embed(2, torch.tensor([[c2]]))]
            hid = cp.model(torch.cat([cp.prefill_rows(h, e), *codes], 1), 0)[0]  # positions 0..3
            probs = [torch.softmax(warp(params, cp.lm_head[i](hid[i + 1])), -1) for i in range(3)]
            joint[c1, c2] = probs[0][c1] * probs[1][c2] * probs[2]
    return joint


def warp(params, logits):
    return temperature_top_k_top_p(logits[None].float(), params)[0]


# 50k calls a case, on one thread (tiny products): CI runs them (-m slow); test_acceptance_rule_is_lossless checks the
# same rule exactly
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["zero_offsets", "random_offsets", "one_node"])
def test_spec_output_distribution_equals_ar(variant):
    cp = _tiny_predictor()
    g = torch.Generator().manual_seed(5)
    h, e = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
    params = SamplingParams(temperature=0.9, top_k=3)
    offsets = torch.randn(3, 16, generator=g) if variant == "random_offsets" else None
    tree = chain(1) if variant == "one_node" else DEFAULT_TREE
    spec, stats = DraftPlan(tree, offsets), SpecStats()
    exact = _exact_joint(cp, h, e, params).flatten()
    counts = torch.zeros(64)
    n = 50_000  # the issue asks for >= 50k samples per case
    with torch.inference_mode(), _one_thread():
        for _ in range(n):
            c = predict_codes_spec(cp, h, e, params, g, spec, stats)[0].tolist()
            counts[c[0] * 16 + c[1] * 4 + c[2]] += 1
    assert chi_square(counts, exact) < CHI2_CRIT[63]
    assert stats.tokens == 3 * n


@pytest.mark.parametrize("tree", [DEFAULT_TREE, chain(3), chain(1), DraftTree.from_paths([(0, 0), (1, 1), (3, 0)]),
                                  default_tree(7), default_tree(14)])
def test_greedy_spec_equals_greedy_ar(tree):
    cp = _tiny_predictor(vocab=32, groups=16, seed=3)
    g = torch.Generator().manual_seed(0)
    greedy = SamplingParams(do_sample=False)
    spec = DraftPlan(tree, torch.randn(tree.max_depth, 16, generator=g) * 0.5)  # offsets as deep as the tree
    stats = SpecStats()
    assert spec.depth == tree.max_depth
    with torch.inference_mode():
        for _ in range(40):
            h, e = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
            ar = predict_codes(cp, h, e, greedy, None)
            sp = predict_codes_spec(cp, h, e, greedy, None, spec, stats)
            assert sp.tolist() == ar.tolist()
    assert stats.tokens == 40 * 15 and stats.calls < 40 * 15


def test_greedy_spec_with_offsets_runs_in_bf16_and_equals_ar():
    """bf16 weights (`--weights bf16`) with trained offsets: the fp32 offsets meet bf16 hidden states (they crashed
    there: a float input to a bf16 head); spec still gives greedy ar's codes."""
    cp = _tiny_predictor(vocab=32, groups=16, seed=5).to(torch.bfloat16)
    cp.model.setup_cache(16 + 1 + 16)
    g = torch.Generator().manual_seed(1)
    greedy = SamplingParams(do_sample=False)
    plan = DraftPlan(DEFAULT_TREE, torch.randn(DEFAULT_TREE.max_depth, 16, generator=g) * 0.5)  # fp32, as stored
    stats = SpecStats()
    with torch.inference_mode():
        for _ in range(20):
            h, e = (torch.randn(1, 1, 16, generator=g).bfloat16() for _ in range(2))
            assert predict_codes_spec(cp, h, e, greedy, None, plan, stats).tolist() == \
                predict_codes(cp, h, e, greedy, None).tolist()
    assert stats.tokens == 20 * 15 and stats.calls < 20 * 15


def test_kv_cache_after_spec_equals_ar():
    cp = _tiny_predictor(vocab=32, groups=16, seed=4)
    g = torch.Generator().manual_seed(2)
    h, e = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
    greedy = SamplingParams(do_sample=False)
    with torch.inference_mode():
        # the module loop fills cp.model.caches; spec runs on the hot loop's own buffers (loop_for(cp))
        ar = predict_codes_reference(cp, h, e, greedy, None)
        assert predict_codes(cp, h, e, greedy, None).tolist() == ar.tolist()
        kv_ar = [(c.k[0, :, :16].clone(), c.v[0, :, :16].clone()) for c in cp.model.caches]
        loop = loop_for(cp)
        for buf in loop.keys + loop.values:  # poison the buffers so stale rows cannot pass for committed ones
            buf.fill_(7.0)
        sp = predict_codes_spec(cp, h, e, greedy, None, DraftPlan(DEFAULT_TREE), SpecStats())
        kv_sp = [loop.kv(layer, 16) for layer in range(len(loop.keys))]
    assert sp.tolist() == ar.tolist()
    assert len(kv_sp) == len(kv_ar) == len(cp.model.layers)
    for (k_a, v_a), (k_s, v_s) in zip(kv_ar, kv_sp, strict=True):
        assert (k_a - k_s).abs().max() < 1e-5 and (v_a - v_s).abs().max() < 1e-5


def test_spec_mode_end_to_end_greedy_equals_ar_and_counts_calls(tmp_path, monkeypatch):
    from dataclasses import replace

    from leapvox.models.load import load_model

    from .conftest import FIXTURES

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))  # no stored offsets or trees
    m = load_model(FIXTURES / "tiny-0b6")
    synth = m.synthesizer()
    warnings = []
    for layout in ("non-streaming", "streaming"):
        opts = replace(m.defaults, max_frames=12, text_layout=layout).greedy()
        ar, ar_stats, _ = synth.generate_codes("Hello world, this is a test.", opts)
        sp, sp_stats, w = synth.generate_codes("Hello world, this is a test.", replace(opts, mode="spec"))
        warnings += w
        assert sp.tolist() == ar.tolist()
        assert ar_stats.predictor_calls == 15 * len(ar)
        assert sp_stats.predictor_calls == sp_stats.spec.calls <= 15 * len(sp)
        assert sp_stats.spec.tokens == 15 * len(sp)
    assert sum("zero offsets" in w for w in warnings) == 1  # said once


# ------------------------------------------------------------------ draft trees: sibling ranks, tiny support


def test_tree_whose_siblings_skip_a_rank_is_refused_or_renumbered():
    from leapvox.engine.spec import rank_gap

    with pytest.raises(ValueError, match="ranks"):
        DraftTree(parent=(-1, 0, 0), depth=(0, 1, 1), rank=(0, 0, 2))  # children of the root: ranks 0 and 2
    with pytest.raises(ValueError, match="ranks"):
        DraftTree(parent=(-1, 0, 1), depth=(0, 1, 2), rank=(0, 0, 1))  # an only child of rank 1
    with pytest.raises(ValueError):
        DraftTree(parent=(-1, 0, 0), depth=(0, 1, 1), rank=(0, 0, 0))  # two siblings of one rank
    with pytest.raises(ValueError):
        DraftTree.from_paths([(0, -1)])
    assert "not 2" in rank_gap([(0, 0), (1, 1), (3, 0)]) and rank_gap(DEFAULT_TREE.paths()) is None
    # from_paths renumbers a gap in order (same shape, same node order): what the walk can treat losslessly
    fixed = DraftTree.from_paths([(0, 0), (1, 1), (3, 0)])
    assert fixed == DraftTree.from_paths([(0, 0), (1, 0), (2, 0)])
    assert DraftTree.from_paths([(0,), (2, 5)]).paths() == [(), (0,), (1,), (1, 0)]


def test_stored_tree_that_skips_a_rank_is_a_checkpoint_error(tmp_path, monkeypatch):
    import json

    from leapvox.engine.errors import CheckpointError
    from leapvox.models.spec_assets import load_tree, tree_path

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))
    folder = tmp_path / "model"
    folder.mkdir()
    path = tree_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"paths": [[0, 0], [2]]}))  # root's children: ranks 0 and 2
    with pytest.raises(CheckpointError, match="rank") as err:
        load_tree(folder)
    assert err.value.hint and "recalibrate" in err.value.hint
    path.write_text(json.dumps({"paths": [[0, 0], [1]]}))
    assert load_tree(folder) == (DraftTree.from_paths([(0, 0), (1,)]), path)


TINY_SUPPORT = {"top_k_1": SamplingParams(top_k=1), "top_k_2": SamplingParams(top_k=2),
                "tiny_top_p": SamplingParams(top_k=0, top_p=1e-4)}


@pytest.mark.parametrize("case", list(TINY_SUPPORT))
@pytest.mark.parametrize("tree", [DEFAULT_TREE, default_tree(7)])
def test_spec_with_fewer_candidates_than_the_tree_asks_for(case, tree):
    """top-k 1 or 2, or a tiny top-p, leave a depth fewer candidates than the tree's width: the nodes whose path
    has an out-of-range rank are dropped (they used to come back as prefixes and index past the candidates).
    With a support of one code spec is deterministic and equals ar."""
    params = TINY_SUPPORT[case]
    cp = _tiny_predictor(vocab=32, groups=16, seed=3)
    g = torch.Generator().manual_seed(0)
    plan, stats = DraftPlan(tree, torch.randn(tree.max_depth, 16, generator=g) * 0.5), SpecStats()
    with torch.inference_mode(), _one_thread():
        for _ in range(6):
            h, e = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
            sp = predict_codes_spec(cp, h, e, params, g, plan, stats)
            assert sp.shape == (1, 15)
            if case != "top_k_2":
                assert sp.tolist() == predict_codes(cp, h, e, params, g).tolist()
    assert stats.tokens == 6 * 15 and stats.calls < 6 * 15


@contextlib.contextmanager
def _one_thread():
    """Tiny products: one thread is ~10x faster than two on a shared, busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _wilson_hilferty_crit(df: int, z: float = 3.719) -> float:
    """Chi-square critical value with `df` degrees of freedom at false-alarm rate 1e-4 (z of 1 - 1e-4)."""
    a = 2 / (9 * df)
    return df * (1 - a + z * a**0.5) ** 3


def _pooled_chi_square(counts: torch.Tensor, probs: torch.Tensor, n: int, min_expected: float = 5.0):
    """Chi-square with the cells expected fewer than `min_expected` times pooled into one; (statistic, df)."""
    expected = probs * n
    assert counts[probs == 0].sum() == 0, "sampled an outcome of probability zero"
    big = expected >= min_expected
    c = torch.cat([counts[big], counts[~big & (probs > 0)].sum()[None]])
    e = torch.cat([expected[big], expected[~big & (probs > 0)].sum()[None]])
    keep = e > 0
    return float(((c[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum()) - 1


def _accept_child_without_renormalising_q(p, q, candidates, generator):
    """accept_child with a bug: after a rejection the candidate leaves q, but q is not renormalised."""
    q = q.clone()
    for i, x in enumerate(candidates):
        u = torch.rand((), generator=generator)
        if q[x] > 0 and u * q[x] < p[x]:
            return i, p
        residual = (p - q).clamp_min(0)
        total = residual.sum()
        if total > 0:
            p = residual / total
        else:
            p = p.clone()
            p[x] = 0
            p = p / p.sum()
        q[x] = 0
        if q.sum() <= 0:
            break
    return None, p


@pytest.mark.parametrize("variant", ["lossless", "tiny_support", "q_not_renormalised"])
def test_spec_joint_of_codes_1_to_3_fits_the_exact_ar_joint(variant, monkeypatch):
    """The talker state fixed: the exact ar joint of codes 1..3 (enumerated) against spec samples through the
    default tree (3 candidates at depth 1, 2 below the first). The acceptance rule with q not renormalised
    after a rejection must fail the same test (so the test can tell)."""
    import leapvox.engine.spec as spec_module

    if variant == "q_not_renormalised":
        monkeypatch.setattr(spec_module, "accept_child", _accept_child_without_renormalising_q)
    cp = _tiny_predictor()
    g = torch.Generator().manual_seed(5)
    h, e = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
    # vocab 4 and top-k 2 (tiny_support): 2 candidates where the tree asks for 3
    params = SamplingParams(temperature=1.0, top_k=2 if variant == "tiny_support" else 0)
    exact = _exact_joint(cp, h, e, params).flatten()
    plan, stats = DraftPlan(DEFAULT_TREE), SpecStats()
    counts, n = torch.zeros(64), 1500
    with torch.inference_mode(), _one_thread():
        for _ in range(n):
            c = predict_codes_spec(cp, h, e, params, g, plan, stats)[0].tolist()
            counts[c[0] * 16 + c[1] * 4 + c[2]] += 1
    chi2, df = _pooled_chi_square(counts, exact, n)
    assert stats.tokens == 3 * n and sum(stats.attempts) > sum(stats.accepts) > 0  # rejections happened
    if variant == "q_not_renormalised":  # measured: ~216 on 28 df (critical value ~65); the bug is caught
        assert chi2 > _wilson_hilferty_crit(df), (chi2, df)
    else:  # measured: ~24 on 28 df (lossless), ~4 on 7 df (tiny_support)
        assert chi2 < _wilson_hilferty_crit(df), (chi2, df)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the demo model's text front end needs espeak-ng")
@pytest.mark.parametrize("flags", [["--top-k", "1"], ["--top-k", "2"], ["--top-p", "0.0001"]])
def test_cli_spec_on_the_demo_model_with_tiny_support(tmp_path, monkeypatch, flags):
    """`leapvox speak --mode spec --top-k 1 "Hello there."` used to die with an IndexError in the walk."""
    from leapvox.app.cli import main

    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)  # the default --model: the bundled demo
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "hello.wav"
    assert main(["speak", "Hello there.", "-o", str(out), "--mode", "spec", *flags, "--seed", "0",
                 "--max-frames", "6"]) == 0
    assert out.stat().st_size > 44
