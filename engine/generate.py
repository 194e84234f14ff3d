"""Plain autoregressive (`ar`) decoding: talker for code 0, code predictor for codes 1..15.

RNG draw order equals the reference: code 0 of frame 0, codes 1..15 of frame 0, code 0 of frame 1, ...
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .code_predictor import CodePredictor
from .options import SynthesisOptions
from .predictor_loop import loop_for, predict_codes_reference
from .prompt import Prompt
from .sampling import SamplingParams, code0_logits, pick, suppress_mask_for
from .spec import SpecDecoder, SpecStats
from .talker import Talker


@dataclass
class DecodeStats:
    """Counters of one utterance's decoding, filled as frames are produced."""

    frames: int = 0
    talker_calls: int = 0
    predictor_calls: int = 0
    talker_s: float = 0.0
    predictor_s: float = 0.0
    prefill_s: float = 0.0
    stop_reason: str = ""  # "eos", "max_frames" or "guard"
    kv_bytes: int = 0  # talker KV bytes in use after the last step (prefix + min(k+1, W) rows for windowed)
    attn_span: int = 0  # keys the talker attended to at the last step
    step_ms: list[float] = field(default_factory=list)  # per decode step: talker call + code-0 pick, ms
    codec_s: float = 0.0  # codec decoder time, filled by whoever decodes the frames
    notes: list[str] = field(default_factory=list)
    spec: SpecStats | None = None  # spec mode: calls, tokens, per-depth attempts and accepts


def predict_codes(
    cp: CodePredictor,
    talker_hidden: torch.Tensor,
    code0_embed: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Codes 1..15 of one frame [B, 15] from the talker's normed hidden [B, 1, H] and C(code 0) [B, 1, H].

    Batch 1 runs the overhead-free loop (predictor_loop.PredictorLoop: the same bits and random draws as the
    plain module loop, predict_codes_reference, which batches use)."""
    if talker_hidden.shape[0] == 1:
        return loop_for(cp)(talker_hidden, code0_embed, params, generator)
    return predict_codes_reference(cp, talker_hidden, code0_embed, params, generator)


class FullCache:
    """ar's talker cache: every row stays. Prompt rows at slots 0..L-1, frame row k at slot and position L+k."""

    def __init__(self, talker: Talker, prefix: int, max_frames: int):
        self.talker, self.prefix = talker, prefix
        talker.model.setup_cache(prefix + max_frames)

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.talker(x, 0)

    def step(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame row k [1, 1, H] -> (hidden, code-0 logits) of the next frame."""
        return self.talker(x, self.prefix + k)

    def span(self, k: int) -> int:
        """Keys attended by step k (= rows held after it)."""
        return self.prefix + k + 1

    def kv_bytes(self, k: int) -> int:
        return self.talker.model.kv_bytes(self.span(k))


@torch.inference_mode()
def generate_frames(
    talker: Talker,
    prompt: Prompt,
    opts: SynthesisOptions,
    max_frames: int,
    generator: torch.Generator | None,
    stats: DecodeStats,
    spec: SpecDecoder | None = None,
    backend=None,
) -> Iterator[torch.Tensor]:
    """Yield frames [16] (code 0..15) until EOS or `max_frames`; sets `stats.stop_reason` at the end.

    With `spec` (a draft tree and offsets) codes 1..15 come from speculative verify calls (`spec` mode).
    `backend` runs the networks (default: the torch engine, backend.TorchBackend)."""
    from .backend import TorchBackend  # backend.py builds on this module

    yield from frame_loop(backend or TorchBackend(talker), talker, prompt, opts, max_frames, generator, stats, spec)


def frame_loop(
    backend,
    talker: Talker,
    prompt: Prompt,
    opts: SynthesisOptions,
    max_frames: int,
    generator: torch.Generator | None,
    stats: DecodeStats,
    spec: SpecDecoder | None = None,
    window: int | None = None,
) -> Iterator[torch.Tensor]:
    """The frame loop shared by the modes; `backend` (backend.TorchBackend, coreml_runtime.CoreMLBackend) runs
    the talker steps (over a ring of `window` frames in windowed mode) and the code predictor."""
    cfg, cp = talker.cfg, talker.code_predictor
    eos = cfg.codec_eos_token_id
    suppress = suppress_mask_for(cfg.vocab_size, cfg.suppressed_ids, eos, prompt.embeds.device)
    if spec is not None:
        spec = SpecDecoder(spec.tree, spec.offsets)  # fresh counters for this utterance
        stats.spec = spec.stats
    max_frames = backend.setup(prompt.embeds.shape[1], max_frames, spec, window)  # a backend may hold fewer
    history = torch.zeros((1, 0), dtype=torch.long, device=prompt.embeds.device)

    def next_code0(logits: torch.Tensor) -> torch.Tensor:
        nonlocal history
        scores = code0_logits(logits[:, -1].float(), history, opts.repetition_penalty, eos, suppress)
        c0 = pick(scores, opts.talker, generator)  # [1]
        history = torch.cat([history, c0[:, None]], dim=1)
        return c0

    t0 = time.perf_counter()
    h, logits = backend.prefill(prompt.embeds)
    c0 = next_code0(logits)
    stats.prefill_s += time.perf_counter() - t0
    stats.talker_calls += 1
    h = h[:, -1:]
    for k in range(max_frames):
        if int(c0) == eos:
            stats.stop_reason = "eos"
            return
        t1 = time.perf_counter()
        c0_embed = talker.embed_codec(c0[:, None])
        if spec is None:
            rest = backend.predict(h, c0_embed, opts.predictor, generator)  # [1, 15]
            stats.predictor_calls += cp.num_heads
        else:
            calls = spec.stats.calls
            rest = backend.verify(h, c0_embed, opts.predictor, generator, spec)
            stats.predictor_calls += spec.stats.calls - calls
        t2 = time.perf_counter()
        frame = torch.cat([c0[:, None], rest], dim=1)  # [1, 16]
        stats.frames += 1
        stats.predictor_s += t2 - t1
        yield frame[0]
        t2 = time.perf_counter()
        if k + 1 < max_frames:
            h, logits = backend.decode(talker.embed_frame(frame) + prompt.step_text(k), k)
            c0 = next_code0(logits)
            stats.talker_calls += 1
            stats.kv_bytes, stats.attn_span = backend.kv_bytes(k), backend.span(k)
            stats.step_ms.append(1e3 * (time.perf_counter() - t2))
        stats.talker_s += time.perf_counter() - t2
    stats.stop_reason = "max_frames"
