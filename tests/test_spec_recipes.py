"""Offset training, acceptance tables and greedy tree growth."""

import torch

from leapvox.engine.spec import DraftTree
from leapvox.models import spec_recipes as R
from leapvox.models.checkpoint import load_model

from .conftest import FIXTURES


def test_grow_tree_follows_acceptance_and_expected_length_grows():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.1], [0.4]]
    tree = R.grow_tree(acc, 3)
    assert tree.paths() == [(), (0,), (1,), (0, 0)]  # 0.6, then 0.6*0.5 = 0.3 > 0.2 (rank 1) ... > 0.12
    assert R.grow_tree(acc, 4).paths()[-1] == (0, 0, 0)  # 0.6*0.5*0.4 = 0.12 > 0.1 and > 0.06
    sizes = [R.expected_accepted(R.grow_tree(acc, n), acc) for n in range(1, 8)]
    assert all(b >= a for a, b in zip(sizes, sizes[1:], strict=False))
    assert abs(R.expected_accepted(DraftTree.from_paths([(0, 0)]), acc) - (0.6 + 0.3)) < 1e-9


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
