"""The decoding modes and compute backends this build offers, listed in one place.

A new mode is one entry in MODES plus its frame loop in `synthesis.frame_loop`; everything that lists modes
(option validation, `leapvox compare`, the TUI selector) reads MODES.
"""

from __future__ import annotations

MODES: tuple[str, ...] = ("ar", "spec", "windowed")

MODE_HELP = {
    "ar": "plain autoregressive: one talker step and 15 code-predictor calls per frame",
    "spec": "speculative: the code predictor drafts several codes per call and verifies them",
    "windowed": "windowed: the talker attends to the prompt and a ring of the last W frames (bounded cache)",
}


def available_backends() -> tuple[str, ...]:
    """Backends usable on this machine: `cpu` (torch) always, `cuda` when torch sees a GPU."""
    import torch

    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
