"""The frame loop shared by every mode: talker step for code 0, a predictor strategy for codes 1..15.

The loop is mode-agnostic and builds nothing: the caller (synthesis.decode_frames) has set up the backend's talker
cache (full or ring) and chosen the predictor strategy (`ArCodes` or `SpecCodes`) once, from the options.

RNG draw order equals the reference: code 0 of frame 0, codes 1..15 of frame 0, code 0 of frame 1, ...
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from leapvox.engine.nets.talker import Talker
from leapvox.engine.options import SynthesisOptions
from leapvox.engine.prompt import Prompt
from leapvox.engine.sampling import SamplingParams, code0_logits, pick, suppress_mask_for
from leapvox.engine.spec import DraftPlan, SpecStats


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


class ArCodes:
    """Codes 1..15 with one code-predictor call per code (`ar`, and `windowed`, whose change is the talker's)."""

    def __init__(self, backend):
        self.backend, self.stats = backend, None

    def __call__(self, h, c0_embed, params: SamplingParams, generator) -> tuple[torch.Tensor, int]:
        """Codes [1, 15] and the predictor calls they took."""
        rest = self.backend.predict(h, c0_embed, params, generator)
        return rest, rest.shape[1]


class SpecCodes:
    """Codes 1..15 with speculative verify calls over `plan` (`spec`); `stats` counts calls and acceptances."""

    def __init__(self, backend, plan: DraftPlan):
        self.backend, self.plan, self.stats = backend, plan, SpecStats()

    def __call__(self, h, c0_embed, params: SamplingParams, generator) -> tuple[torch.Tensor, int]:
        calls = self.stats.calls
        rest = self.backend.verify(h, c0_embed, params, generator, self.plan, self.stats)
        return rest, self.stats.calls - calls


@torch.inference_mode()
def frame_loop(
    backend,
    codes: ArCodes | SpecCodes,
    talker: Talker,
    prompt: Prompt,
    opts: SynthesisOptions,
    max_frames: int,
    generator: torch.Generator | None,
    stats: DecodeStats,
) -> Iterator[torch.Tensor]:
    """Yield frames [16] (code 0..15) until EOS or `max_frames`; sets `stats.stop_reason` at the end.

    `backend` (backend.TorchBackend, coreml.runtime.CoreMLBackend), already set up for this prompt, runs the talker
    steps; `codes` gives codes 1..15 of each frame."""
    cfg = talker.cfg
    eos = cfg.codec_eos_token_id
    suppress = suppress_mask_for(cfg.vocab_size, cfg.suppressed_ids, eos, prompt.embeds.device)
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
        rest, calls = codes(h, talker.embed_codec(c0[:, None]), opts.predictor, generator)  # [1, 15]
        stats.predictor_calls += calls
        t2 = time.perf_counter()
        frame = torch.cat([c0[:, None], rest], dim=1)  # [1, 16]
        stats.frames += 1
        stats.predictor_s += t2 - t1
        yield frame[0]
        text = prompt.step_text(k) if k + 1 < max_frames else None  # a sentence still being written: may wait
        t2 = time.perf_counter()
        if k + 1 < max_frames:
            h, logits = backend.decode(talker.embed_frame(frame) + text, k)
            c0 = next_code0(logits)
            stats.talker_calls += 1
            stats.kv_bytes, stats.attn_span = backend.kv_bytes(k), backend.span(k)
            stats.step_ms.append(1e3 * (time.perf_counter() - t2))
        stats.talker_s += time.perf_counter() - t2
    stats.stop_reason = "max_frames"
