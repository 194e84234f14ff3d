"""Offset training, acceptance tables and greedy tree growth."""

import torch

from leapvox.engine.spec import DraftTree
from leapvox.models.load import load_model
from leapvox.models.recipes import spec as R

from .conftest import FIXTURES


def test_grow_tree_follows_acceptance_and_expected_length_grows():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.1], [0.4]]
    tree = R.grow_tree(acc, 3)
    assert tree.paths() == [(), (0,), (1,), (0, 0)]  # 0.6, then 0.6*0.5 = 0.3 > 0.2 (rank 1) ... > 0.12
    assert R.grow_tree(acc, 4).paths()[-1] == (0, 0, 0)  # 0.6*0.5*0.4 = 0.12 > 0.1 and > 0.06
    sizes = [R.expected_accepted(R.grow_tree(acc, n), acc) for n in range(1, 8)]
    assert all(b >= a for a, b in zip(sizes, sizes[1:], strict=False))
    assert abs(R.expected_accepted(DraftTree.from_paths([(0, 0)]), acc) - (0.6 + 0.3)) < 1e-9


def test_expected_tokens_per_call_follows_the_frame_loop():
    """The estimate `recipe tree` ranks trees by equals what spec_frame yields when every verify call's accepted
    path follows the same acceptance model: simulated over many frames with the real per-frame loop."""
    import random

    from leapvox.engine.spec import SpecStats, spec_frame

    chain = DraftTree.from_paths([(0, 0, 0)])
    assert R.expected_tokens_per_call(chain, [[1.0], [1.0], [1.0]]) == 3.0  # 1 + 4 + 4 + 4 + 2 codes in 5 calls
    assert R.expected_tokens_per_call(chain, [[0.0], [0.0], [0.0]]) == 1.0
    acc = [[0.7, 0.15, 0.05], [0.8, 0.1], [0.85, 0.05]]
    tree = DraftTree.from_paths([(0, 0, 0), (1, 0), (2,), (0, 1)])
    rng, n = random.Random(0), 15

    def call(k, tok):
        t = tree.pruned(min(tree.max_depth, n - k))
        node, path = 0, []
        while True:
            d = t.depth[node]
            if d >= t.max_depth:
                break
            choice = rng.choices(range(len(acc[d]) + 1), weights=[*acc[d], 1 - sum(acc[d])])[0]
            nxt = [i for i in range(1, len(t.parent)) if t.parent[i] == node and t.rank[i] == choice]
            if not nxt:
                break
            node = nxt[0]
            path.append(0)
        return path, (None if k + len(path) == n else 0)

    stats = SpecStats()
    for _ in range(20000):
        assert len(spec_frame(0, n, stats, call)) == n
    expected = R.expected_tokens_per_call(tree, acc, n)
    assert abs(stats.tokens_per_call - expected) < 0.02, (stats.tokens_per_call, expected)
    assert expected < 1 + R.expected_accepted(tree, acc)  # a call in isolation overstates it


def test_offset_training_lowers_its_loss_on_frozen_model():
    m = load_model(FIXTURES / "tiny-0b6")
    s = m.synthesizer()
    frames = R.collect_frames(s, ["Hello world, this is a test.", "Good morning."], m.defaults)
    assert frames.codes.shape[1] == 16 and frames.hidden.shape == (len(frames.codes), 64)
    cp = m.tts.talker.code_predictor
    before = {k: v.clone() for k, v in cp.state_dict().items()}
    with torch.no_grad():
        H, W = R.predictor_hidden(cp, frames), R._head_weights(cp)
    for kind, per_position in (("ce", False), ("kl", True)):
        zero = torch.zeros((15, 3, 64) if per_position else (3, 64))
        b = R.train_offsets(cp, frames, kind=kind, per_position=per_position, steps=60, batch=64)
        assert b.shape == zero.shape and b.abs().sum() > 0
        with torch.no_grad():
            l0 = R.offset_loss(H, W, frames.codes, zero, kind, m.defaults.predictor)
            l1 = R.offset_loss(H, W, frames.codes, b, kind, m.defaults.predictor)
        assert l1 < l0
    assert all(torch.equal(before[k], v) for k, v in cp.state_dict().items())  # the predictor stays frozen


def _tiny_frames():
    m = load_model(FIXTURES / "tiny-0b6")
    frames = R.collect_frames(m.synthesizer(), ["Hello world, this is a test.", "Good morning."], m.defaults)
    return m, m.tts.talker.code_predictor, frames


def test_exact_acceptance_rate_is_the_tv_objective_and_bounded():
    m, cp, frames = _tiny_frames()
    params = m.defaults.predictor
    b = torch.randn(3, 64)
    a = R.acceptance_rate(cp, frames, b, 3, params)
    assert a.shape == (len(frames.codes), 3) and (a >= 0).all() and (a <= 1 + 1e-6).all()
    with torch.no_grad():
        H, W = R.predictor_hidden(cp, frames), R._head_weights(cp)
        loss = R.offset_loss(H, W, frames.codes, b, "tv", params)
    assert torch.allclose(-loss, a.mean(0).sum(), atol=1e-5)  # minus the summed per-depth acceptance
    # A draft head that is the verifier itself accepts always: give depth j the target's own hidden state by
    # comparing the verifier's distribution with itself.
    p = R.verifier_probs(H, W, 1, params)
    assert torch.allclose(torch.minimum(p, p).sum(-1), torch.ones(len(p)), atol=1e-5)


def test_tv_offset_training_raises_the_acceptance_rate():
    m, cp, frames = _tiny_frames()
    params = m.defaults.predictor
    zero = R.acceptance_rate(cp, frames, None, 3, params).mean()
    b = R.train_offsets(cp, frames, kind="tv", steps=60, batch=64, lr=1e-2, params=params)
    assert R.acceptance_rate(cp, frames, b, 3, params).mean() > zero


def test_self_sampled_frames_keep_code0_and_match_unbatched_greedy():
    from dataclasses import replace

    from leapvox.engine.fast.predictor import predict_codes

    m, cp, frames = _tiny_frames()
    greedy = replace(m.defaults.predictor, do_sample=False)
    out = R.self_sampled(cp, frames, greedy, chunk=5)  # several batches, the last one short
    assert torch.equal(out.codes[:, 0], frames.codes[:, 0])
    cp.model.setup_cache(cp.cfg.num_code_groups)
    for i in range(len(frames.codes)):
        one = predict_codes(cp, frames.hidden[i : i + 1, None], frames.code0_embed[i : i + 1, None], greedy, None)
        assert torch.equal(out.codes[i, 1:], one[0])
    sampled = R.self_sampled(cp, frames, m.defaults.predictor, seed=3)
    assert torch.equal(sampled.codes, R.self_sampled(cp, frames, m.defaults.predictor, seed=3).codes)


def test_run_spec_counts_every_frame():
    from leapvox.engine.spec import DEFAULT_TREE, DraftPlan

    m, cp, frames = _tiny_frames()
    r = R.run_spec(cp, frames, DraftPlan(DEFAULT_TREE, None), m.defaults.predictor)
    assert (r.tokens == 15).all() and (r.calls >= 1).all() and (r.calls <= 15).all()
    assert r.tokens_per_call == r.tokens.sum() / r.calls.sum()


def test_train_offsets_command_reports_paired_intervals(tmp_path, monkeypatch, capsys):
    import json

    from leapvox.app.cli import main

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "home"))
    out = tmp_path / "offsets.json"
    argv = ["recipe", "offsets", "--model", str(FIXTURES / "tiny-0b6"), "--weights", "fp32", "--utterances", "3",
            "--variants", "tv,ce-pp", "--steps", "10", "--depth", "5", "--json", str(out)]
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    assert set(rec["variants"]) == {"zero", "tv", "ce-pp"} and rec["depth"] == 5
    assert all(len(v["exact_draft_acceptance_per_depth"]) == 5 for v in rec["variants"].values())
    for name in ("tv", "ce-pp"):
        d = rec["variants"][name]["vs_zero_tokens_per_call"]
        assert d["ci95"][0] <= d["delta"] <= d["ci95"][1]
    assert "tok/call" in capsys.readouterr().out
    assert main(["recipe", "offsets", "--model", str(FIXTURES / "tiny-0b6"), "--variants", "nope"]) == 2
    assert main(["recipe", "offsets", "--model", str(FIXTURES / "tiny-0b6"), "--depth", "15"]) == 2


def test_default_tree_follows_the_offsets_depth_until_a_tree_is_calibrated(tmp_path, monkeypatch):
    from leapvox.engine.spec import DEFAULT_TREE, chain, default_tree
    from leapvox.models.spec_assets import load_tree, save_tree, tree_path

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "home"))
    folder = tmp_path / "model"
    folder.mkdir()
    assert load_tree(folder) == (DEFAULT_TREE, None)  # no offsets: the paper's depth 3
    assert load_tree(folder, offsets=torch.zeros(7, 16)) == (default_tree(7), None)
    assert load_tree(folder, offsets=torch.zeros(15, 5, 16))[0] == default_tree(5)  # per-position offsets
    path = save_tree(tree_path(folder), chain(2), {"N": 2})
    assert load_tree(folder, offsets=torch.zeros(7, 16)) == (chain(2), path)  # a calibrated tree wins
