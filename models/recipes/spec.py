"""Recipes behind spec mode: collect frames, train the draft offsets, measure acceptance, calibrate the tree.

Frames are (talker hidden h [Ht], code-0 embedding C(c0) [Ht], codes [16]). With no audio encoder (the real
Qwen checkpoints) they come from the model's own ar generations over a text corpus.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from leapvox.engine.fast.predictor import loop_for, predict_codes
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.options import SynthesisOptions, validate
from leapvox.engine.prompt import build_prompt
from leapvox.engine.sampling import SamplingParams, temperature_top_k_top_p
from leapvox.engine.spec import DraftPlan, DraftTree, SpecStats, predict_codes_spec
from leapvox.engine.synthesis import Synthesizer


@dataclass
class Frames:
    hidden: torch.Tensor  # [N, Ht] final-normed talker hidden that produced code 0
    code0_embed: torch.Tensor  # [N, Ht]
    codes: torch.Tensor  # [N, 16]

    def split(self, fraction: float) -> tuple[Frames, Frames]:
        n = int(len(self.codes) * fraction)
        return Frames(self.hidden[:n], self.code0_embed[:n], self.codes[:n]), Frames(
            self.hidden[n:], self.code0_embed[n:], self.codes[n:]
        )


@torch.inference_mode()
def collect_frames(synth: Synthesizer, texts: list[str], opts: SynthesisOptions, progress=None) -> Frames:
    """Generate each text with ar and recover the talker hidden of every frame by teacher forcing."""
    parts = []
    for i, text in enumerate(texts):
        o = validate(replace(opts, seed=(opts.seed or 0) + i), synth.cfg)
        codes, _, _ = synth.generate_codes(text, o)
        if len(codes):
            parts.append(teacher_forced_frames(synth, text, codes, o))
        if progress:
            progress(i + 1, len(texts), sum(len(p.codes) for p in parts))
    return Frames(*(torch.cat([getattr(p, f) for p in parts]) for f in ("hidden", "code0_embed", "codes")))


@torch.inference_mode()
def teacher_forced_frames(synth: Synthesizer, text: str, codes: torch.Tensor, opts: SynthesisOptions) -> Frames:
    """Frames of `codes` [F, 16] (generated, or ground truth from encoded speech) spoken for `text`."""
    talker = synth.tts.talker
    opts = validate(opts, synth.cfg)
    prompt = build_prompt(talker, synth.cfg, synth.text_ids(text), opts.speaker, opts.language, opts.text_layout)
    steps = [talker.embed_frame(codes[k : k + 1]) + prompt.step_text(k) for k in range(len(codes) - 1)]
    hidden = talker.model.forward_train(torch.cat([prompt.embeds, *steps], dim=1))[0]  # [L + F - 1, Ht]
    L = prompt.embeds.shape[1]
    return Frames(hidden[L - 1 : L - 1 + len(codes)], talker.embed_codec(codes[:, 0]), codes)


def predictor_hidden(cp: CodePredictor, frames: Frames) -> torch.Tensor:
    """Teacher-forced normed hidden states of the code predictor, [N, 16, Hc] (positions 0..15)."""
    rows = [cp.prefill_rows(frames.hidden[:, None], frames.code0_embed[:, None])]
    rows += [cp.embed(g, frames.codes[:, g : g + 1]) for g in range(1, cp.num_heads)]
    return cp.model.forward_train(torch.cat(rows, dim=1))


def _head_weights(cp: CodePredictor) -> torch.Tensor:
    return torch.stack([h.weight for h in cp.lm_head])  # [15, V, Hc]


def draft_logits(H: torch.Tensor, W: torch.Tensor, offsets: torch.Tensor, j: int) -> torch.Tensor:
    """Draft logits at depth j for positions p = 1..15-j: heads p-1+j on H_p + b_j -> [N, 15-j, V]."""
    n = W.shape[0]
    b = offsets[j - 1] if offsets.dim() == 2 else offsets[: n - j, j - 1]  # [Hc] or per position [15-j, Hc]
    return torch.einsum("bph,pvh->bpv", H[:, 1 : n + 1 - j] + b, W[j:])


def offset_loss(H, W, codes, offsets, kind: str, params: SamplingParams) -> torch.Tensor:
    """(a) "ce": cross-entropy of the draft against the true code; (b) "kl": KL from the verifier's own
    processed distribution at position p+j to the draft (targets acceptance directly); (c) "tv": minus the
    acceptance rate of a single draft, sum_x min(p(x), q(x)) = 1 - TV(p, q), the quantity lossless acceptance
    realises."""
    n, total = W.shape[0], 0.0
    for j in range(1, offsets.shape[-2] + 1):
        logits = draft_logits(H, W, offsets, j)  # [N, P, V]
        if kind == "ce":
            total = total + F.cross_entropy(logits.flatten(0, 1), codes[:, 1 + j : n + 1].flatten())
            continue
        p = verifier_probs(H, W, j, params)
        if kind == "kl":
            log_q = torch.log_softmax(logits.flatten(0, 1) / params.temperature, -1)
            total = total + (p * (torch.log(p.clamp_min(1e-12)) - log_q)).sum(-1).mean()
        else:
            q = torch.softmax(temperature_top_k_top_p(logits.flatten(0, 1), params), -1)
            total = total - torch.minimum(p, q).sum(-1).mean()
    return total


def verifier_logits(H: torch.Tensor, W: torch.Tensor, j: int) -> torch.Tensor:
    """The verifier's raw logits at positions p+j (p = 1..15-j): heads p-1+j on H_{p+j} -> [N, 15-j, V]."""
    return torch.einsum("bph,pvh->bpv", H[:, 1 + j : W.shape[0] + 1], W[j:])


def verifier_probs(H: torch.Tensor, W: torch.Tensor, j: int, params: SamplingParams) -> torch.Tensor:
    """The verifier's processed distribution at positions p+j (p = 1..15-j), flattened to [N * (15-j), V]."""
    return torch.softmax(temperature_top_k_top_p(verifier_logits(H, W, j).flatten(0, 1), params), -1)


@torch.no_grad()
def acceptance_rate(cp: CodePredictor, frames: Frames, offsets: torch.Tensor | None, depth: int,
                    params: SamplingParams) -> torch.Tensor:
    """Exact single-draft acceptance rate per frame and depth, [N, K]: the mean over positions of
    sum_x min(p(x), q(x)) for the processed target p and draft q (teacher-forced on the frames' codes). No
    sampling noise, so trained and zero offsets compare frame by frame."""
    H, W = predictor_hidden(cp, frames), _head_weights(cp)
    b = offsets if offsets is not None else torch.zeros(depth, cp.cfg.hidden_size)
    out = []
    for j in range(1, depth + 1):
        q = torch.softmax(temperature_top_k_top_p(draft_logits(H, W, b, j).flatten(0, 1), params), -1)
        out.append(torch.minimum(verifier_probs(H, W, j, params), q).sum(-1).view(len(frames.codes), -1).mean(-1))
    return torch.stack(out, dim=1)


@torch.inference_mode()
def self_sampled(cp: CodePredictor, frames: Frames, params: SamplingParams, seed: int = 0,
                 chunk: int = 512) -> Frames:
    """The same frames with codes 1..15 re-drawn by the predictor itself (batched ar): drafting then trains on
    the prefixes it meets at inference instead of encoded speech."""
    g = torch.Generator().manual_seed(seed)
    codes = frames.codes.clone()
    for i in range(0, len(codes), chunk):
        sl = slice(i, i + chunk)
        cp.model.setup_cache(cp.cfg.num_code_groups, batch=len(codes[sl]))
        codes[sl, 1:] = predict_codes(cp, frames.hidden[sl, None], frames.code0_embed[sl, None], params, g)
    cp.model.setup_cache(cp.cfg.num_code_groups)
    return Frames(frames.hidden, frames.code0_embed, codes)


def train_offsets(
    cp: CodePredictor,
    frames: Frames,
    depth: int = 3,
    kind: str = "ce",
    per_position: bool = False,
    steps: int = 300,
    batch: int = 32,
    lr: float = 1e-3,
    params: SamplingParams | None = None,
    seed: int = 0,
    progress=None,
) -> torch.Tensor:
    """Adam on the offsets only; the predictor stays frozen. Returns b [K, Hc] or [15, K, Hc]."""
    params = params or SamplingParams()
    hc, n = cp.cfg.hidden_size, cp.num_heads
    shape = (n, depth, hc) if per_position else (depth, hc)
    offsets = torch.zeros(shape, requires_grad=True)
    opt = torch.optim.Adam([offsets], lr=lr)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        H = predictor_hidden(cp, frames)
        W = _head_weights(cp)
    for step in range(steps):
        idx = torch.randint(len(frames.codes), (min(batch, len(frames.codes)),), generator=g)
        loss = offset_loss(H[idx], W, frames.codes[idx], offsets, kind, params)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress:
            progress(step + 1, steps, float(loss))
    return offsets.detach()


@torch.no_grad()
def rank_acceptance(cp: CodePredictor, frames: Frames, offsets: torch.Tensor | None, depth: int, ranks: int = 8):
    """a[j][r]: how often the verifier's own choice at depth j (its argmax at position p+j, teacher-forced) is the
    draft's rank-r candidate (rank by draft probability): the acceptance of that node under greedy decoding given
    a correct path, and a proxy for sampling."""
    H, W = predictor_hidden(cp, frames), _head_weights(cp)
    b = offsets if offsets is not None else torch.zeros(depth, cp.cfg.hidden_size)
    table = []
    for j in range(1, depth + 1):
        top = torch.topk(draft_logits(H, W, b, j), ranks, dim=-1).indices  # [N, P, R]
        target = verifier_logits(H, W, j).argmax(-1)  # the verifier's choice at position p+j
        table.append((top == target[..., None]).float().mean(dim=(0, 1)).tolist())
    return table


def grow_tree(acceptance: list[list[float]], size: int) -> DraftTree:
    """Greedy: repeatedly add the child (of an existing node) with the largest probability of being accepted,
    i.e. the product of its path's per-depth rank acceptances, until `size` draft nodes exist."""
    chosen = {(): 1.0}
    for _ in range(size):
        best, best_p = None, -1.0
        for path, p in chosen.items():
            d = len(path)
            if d >= len(acceptance):
                continue
            r = 0
            while path + (r,) in chosen:
                r += 1
            if r < len(acceptance[d]) and p * acceptance[d][r] > best_p:
                best, best_p = path + (r,), p * acceptance[d][r]
        if best is None:
            break
        chosen[best] = best_p
    return DraftTree.from_paths(p for p in chosen if p)


def expected_accepted(tree: DraftTree, acceptance: list[list[float]]) -> float:
    """Expected accepted drafts of one unconstrained verify call: the sum over nodes of P(its path is accepted)."""
    return sum(_accepted_at_depth(tree, acceptance)[1:])


def _accepted_at_depth(tree: DraftTree, acceptance: list[list[float]]) -> list[float]:
    """P(the accepted path reaches depth j), j = 0..max depth: the sum over the depth-j nodes of their path's
    product of rank acceptances (one path is accepted, so the nodes of one depth are exclusive outcomes)."""
    reach, at = [1.0], [1.0] + [0.0] * tree.max_depth
    for i in range(1, len(tree.parent)):
        reach.append(reach[tree.parent[i]] * acceptance[tree.depth[i] - 1][tree.rank[i]])
        at[tree.depth[i]] += reach[-1]
    return at


def expected_tokens_per_call(tree: DraftTree, acceptance: list[list[float]], codes: int = 15) -> float:
    """Expected codes per code-predictor call over whole frames of `codes` residual codes, as spec_frame runs them:
    the first call samples code 1 alone; each verify call with r codes left drafts from the tree cut to depth r
    and yields its accepted drafts plus one sampled code (none when the drafts finish the frame). So a depth-3
    tree gives at most 15 / 5 = 3 per call on a 15-code frame, not the 4 of a call in isolation."""
    at = _accepted_at_depth(tree, acceptance)
    calls = [0.0] * codes  # calls[r]: expected verify calls to finish r remaining codes
    for r in range(1, codes):
        d = min(tree.max_depth, r)
        ge = at[: d + 1] + [0.0]  # P(accepted >= a), a = 0..d, then 0
        calls[r] = 1.0 + sum((ge[a] - ge[a + 1]) * calls[r - min(a + 1, r)] for a in range(d + 1))
    return codes / (1.0 + calls[codes - 1])


@torch.inference_mode()
def verify_cost(cp: CodePredictor, nodes: int, prefix: int = 8, repeats: int = 20) -> float:
    """Median seconds of one code-predictor call over `nodes` + 1 rows after `prefix` cached rows."""
    return _call_times(cp, nodes, prefix, repeats)[0]


@torch.inference_mode()
def verify_over_ar(cp: CodePredictor, nodes: int, prefix: int = 8, repeats: int = 20) -> float:
    """Median over repeats of (verify call with `nodes` drafts) / (ar call), timed back to back so that
    load changes on a shared machine hit both alike."""
    return _call_times(cp, nodes, prefix, repeats)[1]


def call_timings(cp: CodePredictor, nodes: int, prefix: int, repeats: int) -> tuple[list[float], list[float]]:
    """An ar call and a verify call over `nodes` drafts, each timed `repeats` times back to back as spec and ar run
    them at batch 1 (on the predictor's hot loop, engine.predictor): the seconds of each (ar, verify), in order."""
    loop = loop_for(cp)
    loop.reserve(prefix + nodes + 2)
    hc = cp.cfg.hidden_size
    dtype = cp.model.norm.weight.dtype
    x0, x1 = torch.randn(prefix, hc).to(dtype), torch.randn(1, hc).to(dtype)
    x = torch.randn(nodes + 1, hc).to(dtype)
    mask = torch.ones(nodes + 1, prefix + nodes + 1, dtype=torch.bool)
    positions = torch.arange(prefix, prefix + nodes + 1)
    ar, verify = [], []
    for i in range(repeats + 2):
        loop.hidden(x0, 0)
        t0 = time.perf_counter()
        loop.hidden(x1, prefix)
        t1 = time.perf_counter()
        loop.rows(x, prefix, mask, positions)
        t2 = time.perf_counter()
        if i >= 2:  # the first calls warm the buffers
            ar.append(t1 - t0)
            verify.append(t2 - t1)
    return ar, verify


def _call_times(cp: CodePredictor, nodes: int, prefix: int, repeats: int) -> tuple[float, float]:
    """The median verify call's seconds and the median of the verify / ar ratios (call_timings)."""
    ar, verify = call_timings(cp, nodes, prefix, repeats)
    ratios = [v / a for a, v in zip(ar, verify, strict=True)]
    return sorted(verify)[len(verify) // 2], sorted(ratios)[len(ratios) // 2]


@dataclass
class SpecRun:
    """spec decoding over a set of frames: per-frame tokens and calls, per-depth acceptance, seconds."""

    tokens: np.ndarray  # [N] codes produced per frame (15 each)
    calls: np.ndarray  # [N] predictor calls per frame
    per_depth: list[float]
    seconds: float

    @property
    def tokens_per_call(self) -> float:
        return float(self.tokens.sum() / max(self.calls.sum(), 1))


@torch.inference_mode()
def run_spec(cp: CodePredictor, frames: Frames, plan: DraftPlan, params: SamplingParams, seed: int = 0) -> SpecRun:
    """Run spec decoding on every frame's (h, C(c0)), recording each frame's calls."""
    g = torch.Generator().manual_seed(seed) if params.do_sample else None
    s, calls, tokens = SpecStats(), [], []
    t = time.perf_counter()
    for i in range(len(frames.codes)):
        c0, k0 = s.calls, s.tokens
        predict_codes_spec(cp, frames.hidden[i : i + 1, None], frames.code0_embed[i : i + 1, None], params, g, plan, s)
        calls.append(s.calls - c0)
        tokens.append(s.tokens - k0)
    elapsed = time.perf_counter() - t
    per_depth = [a / t if t else math.nan for a, t in zip(s.accepts, s.attempts, strict=True)]
    return SpecRun(np.array(tokens), np.array(calls), per_depth, elapsed)


def measure_spec(cp: CodePredictor, frames: Frames, plan: DraftPlan, params: SamplingParams, seed: int = 0):
    """(tokens per call, per-depth acceptance, seconds) of spec decoding over the frames."""
    r = run_spec(cp, frames, plan, params, seed)
    return r.tokens_per_call, r.per_depth, r.seconds


@torch.inference_mode()
def measure_ar(cp: CodePredictor, frames: Frames, params: SamplingParams, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed) if params.do_sample else None
    t = time.perf_counter()
    for i in range(len(frames.codes)):
        predict_codes(cp, frames.hidden[i : i + 1, None], frames.code0_embed[i : i + 1, None], params, g)
    return time.perf_counter() - t
