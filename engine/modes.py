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


# --backend: `cpu` = the torch engine, `ane` = Core ML on macOS (coreml_runtime), `auto` = ane where it can run
# and the model has a Core ML export, else cpu. --compute-units: where Core ML may run the ane backend's functions.
BACKEND_CHOICES: tuple[str, ...] = ("auto", "cpu", "ane")
COMPUTE_UNIT_CHOICES: tuple[str, ...] = ("cpu_and_ne", "all", "cpu_only")


def available_backends() -> tuple[str, ...]:
    """Backends usable on this machine: `cpu` (torch) always, `cuda` when torch sees a GPU, `ane` when Core ML
    predictions can run (macOS 15+ with coremltools; the model still needs an export)."""
    import torch

    from .coreml_runtime import unavailable_reason

    out = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return out + ("ane",) if unavailable_reason() is None else out
