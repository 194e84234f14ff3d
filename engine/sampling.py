"""Sampling chains as pure functions, in the exact order of the reference implementation.

Code 0 (talker): repetition penalty over the distinct code-0 history -> EOS masked until 2 codes exist ->
control range suppressed (EOS let through) -> [temperature -> top-k (ties kept) -> top-p] -> softmax ->
multinomial over the FULL vocabulary with an explicit generator (or argmax when greedy).
Codes 1..15 (code predictor): the same without penalty, EOS and suppression.
"""

from __future__ import annotations

import torch

from leapvox.engine.options import SamplingParams  # the options live with the others; sampled here

NEG_INF = float("-inf")


def repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive / multiply negative logits of every id in `history` [B, n] once."""
    if penalty == 1.0 or history.numel() == 0:
        return logits
    score = torch.gather(logits, 1, history)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter(1, history, score)


def temperature_top_k_top_p(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Warpers applied only when sampling: temperature, then top-k keeping ties, then nucleus."""
    if p.temperature != 1.0:
        logits = logits / p.temperature
    if p.top_k:
        k = min(p.top_k, logits.shape[-1])
        kth = torch.topk(logits, k)[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if p.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - p.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, NEG_INF)
    return logits


def pick(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Processed logits [B, V] -> token ids [B]: warp + softmax + multinomial, or argmax when greedy."""
    if not p.do_sample:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(temperature_top_k_top_p(logits, p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def code0_logits(
    logits: torch.Tensor,
    history: torch.Tensor,
    penalty: float,
    eos_id: int,
    suppress_mask: torch.Tensor,
    min_codes: int = 2,
) -> torch.Tensor:
    """Talker logits [B, V] (fp32) -> logits after penalty, minimum length and control suppression.

    `history` [B, n] holds the code-0 ids generated so far in this utterance; `suppress_mask` [V] is True
    for ids that may never be sampled (the control range without EOS).
    """
    logits = repetition_penalty(logits, history, penalty)
    if history.shape[1] < min_codes:
        logits = logits.clone()
        logits[:, eos_id] = NEG_INF
    return logits.masked_fill(suppress_mask, NEG_INF)


def suppress_mask_for(vocab_size: int, suppressed: range, eos_id: int, device=None) -> torch.Tensor:
    """Boolean [vocab_size] mask of the suppressed control ids, EOS excluded."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[suppressed.start : suppressed.stop] = True
    mask[eos_id] = False
    return mask
