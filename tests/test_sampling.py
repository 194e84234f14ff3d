"""Sampling chain on hand-made distributions."""

import math

import torch

from leapvox.engine.sampling import (
    SamplingParams,
    code0_logits,
    pick,
    repetition_penalty,
    suppress_mask_for,
    temperature_top_k_top_p,
)

NEG = float("-inf")


def test_repetition_penalty_hits_each_distinct_id_once():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = repetition_penalty(logits, torch.tensor([[0, 0, 1, 0]]), 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0]]
    assert repetition_penalty(logits, torch.zeros((1, 0), dtype=torch.long), 2.0) is logits


def test_top_k_keeps_ties():
    logits = torch.tensor([[3.0, 3.0, 3.0, 1.0, 0.0]])
    out = temperature_top_k_top_p(logits, SamplingParams(temperature=1.0, top_k=2))
    assert out.tolist() == [[3.0, 3.0, 3.0, NEG, NEG]]


def test_temperature_divides_before_top_k():
    logits = torch.tensor([[1.8, 0.9, 0.0]])
    out = temperature_top_k_top_p(logits, SamplingParams(temperature=0.9, top_k=0))
    assert torch.allclose(out, torch.tensor([[2.0, 1.0, 0.0]]))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = temperature_top_k_top_p(probs.log(), SamplingParams(temperature=1.0, top_k=0, top_p=0.8))
    kept = torch.isfinite(out)[0].tolist()
    assert kept == [True, True, False, False]
    # a tiny top_p still keeps the most likely token
    out = temperature_top_k_top_p(probs.log(), SamplingParams(temperature=1.0, top_k=0, top_p=1e-6))
    assert torch.isfinite(out)[0].tolist() == [True, False, False, False]


def test_code0_chain_masks_eos_until_two_codes_and_suppresses_controls():
    vocab, eos = 16, 12
    mask = suppress_mask_for(vocab, range(8, 16), eos)
    assert mask.nonzero().flatten().tolist() == [8, 9, 10, 11, 13, 14, 15]
    logits = torch.zeros((1, vocab))
    early = code0_logits(logits, torch.tensor([[3]]), 1.05, eos, mask)
    assert early[0, eos] == NEG and torch.isinf(early[0, 8:]).all()
    later = code0_logits(logits, torch.tensor([[3, 4]]), 1.05, eos, mask)
    assert later[0, eos] == 0.0 and torch.isfinite(later[0, :8]).all()


def test_greedy_is_argmax_and_takes_no_random_draw():
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0]])
    assert pick(logits, SamplingParams(do_sample=False), g).tolist() == [1]  # first of the tied maxima
    assert torch.equal(g.get_state(), state)


def test_sampling_draws_match_global_seed_and_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0, 0.5]])
    p = SamplingParams(temperature=1.0, top_k=0)
    g = torch.Generator().manual_seed(123)
    ours = [pick(logits, p, g).item() for _ in range(4000)]
    torch.manual_seed(123)
    probs = torch.softmax(logits, -1)
    ref = [torch.multinomial(probs, 1).item() for _ in range(4000)]
    assert ours == ref
    freq = torch.bincount(torch.tensor(ours), minlength=5).float() / len(ours)
    # 4000 draws: standard error <= 0.008 per bin; 5 sigma
    assert (freq - probs[0]).abs().max() < 0.04
    assert math.isclose(float(freq.sum()), 1.0)
