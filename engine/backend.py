"""The compute backend behind the frame loop: the one seam between host logic and whatever runs the networks.

A backend runs the talker (prompt prefill, one decode step per frame) and the code predictor (codes 1..15 of a
frame, plainly or with speculative verify calls). Everything else stays on the host and is shared: prompt and
embedding lookups, sampling, the spec walk, stop rules and counters (`decode.frame_loop`).

    setup(prefix, max_frames, window) -> frame cap           allocate caches for one utterance (window: a ring)
    prefill(x) -> (hidden, logits)                           prompt rows [1, L, H]
    decode(x, k) -> (hidden, logits)                         frame row k [1, 1, H] at position L + k
    predict(h, c0_embed, params, generator) -> [1, 15]       codes 1..15, one predictor call per code (ar)
    verify(h, c0_embed, params, generator, plan, stats)      codes 1..15 [1, 15] with fused draft + verify calls
    span(k), kv_bytes(k)                                     talker keys attended / KV bytes held after step k
    reset()                                                  drop the caches

`TorchBackend` is the PyTorch engine (CPU, or CUDA where the model lives there); `coreml.runtime.CoreMLBackend`
runs exported Core ML functions on macOS. Whether that can run here is answered without importing it, so a CPU run
imports no Core ML module.
"""

from __future__ import annotations

import platform
import sys
from importlib.util import find_spec

import torch

from leapvox.engine.caches import FullCache, RingCache
from leapvox.engine.fast.predictor import predict_codes
from leapvox.engine.nets.talker import Talker
from leapvox.engine.sampling import SamplingParams
from leapvox.engine.spec import DraftPlan, SpecStats, predict_codes_spec


class TorchBackend:
    """The torch engine: talker steps through a full cache (`FullCache`) or a window ring (`RingCache`), codes
    1..15 from `predict_codes` / `predict_codes_spec`."""

    name = "cpu"

    def __init__(self, talker: Talker):
        self.talker = talker
        self.cache: FullCache | RingCache | None = None

    def setup(self, prefix: int, max_frames: int, window: int | None = None) -> int:
        # the code predictor runs on its hot loop (predictor.PredictorLoop), which keeps and sizes its own buffers
        self.cache = RingCache(self.talker, prefix, window) if window else FullCache(self.talker, prefix, max_frames)
        return max_frames

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.prefill(x)

    def decode(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.step(x, k)

    def predict(self, h, c0_embed, params: SamplingParams, generator) -> torch.Tensor:
        return predict_codes(self.talker.code_predictor, h, c0_embed, params, generator)

    def verify(self, h, c0_embed, params: SamplingParams, generator, plan: DraftPlan, stats: SpecStats):
        return predict_codes_spec(self.talker.code_predictor, h, c0_embed, params, generator, plan, stats)

    def span(self, k: int) -> int:
        return self.cache.span(k)

    def kv_bytes(self, k: int) -> int:
        return self.cache.kv_bytes(k)

    def reset(self) -> None:
        self.cache = None


def available_backends() -> tuple[str, ...]:
    """Backends usable on this machine: `cpu` (torch) always, `cuda` when torch sees a GPU, `ane` when Core ML
    predictions can run (macOS 15+ with coremltools; the model still needs an export)."""
    out = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return out + ("ane",) if ane_unavailable_reason() is None else out


def ane_unavailable_reason() -> str | None:
    """Why Core ML predictions cannot run here (one line), or None when they can (coremltools is found, not
    imported: a broken install fails where the backend loads)."""
    if sys.platform != "darwin":
        where = "Linux" if sys.platform.startswith("linux") else sys.platform
        return f"the ane backend needs macOS (Core ML predictions are unavailable on {where})"
    release = platform.mac_ver()[0]
    if release and int(release.split(".")[0]) < 15:
        return f"the ane backend needs macOS 15 or later (stateful Core ML models); this is macOS {release}"
    if find_spec("coremltools") is None:
        return "the ane backend needs coremltools (pip install 'leapvox[coreml]')"
    return None
