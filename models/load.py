"""`load_model`: a `--model` value (catalog name, Hub repo or folder) -> a ready model, with the backend that will run
it attached at construction. The one entry point of speak, compare, the TUI and the recipes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .catalog import resolve_model
from .checkpoint import DamagedFileError, LoadedModel, load_checkpoint
from .coreml_assets import load_ane_backend, resolve_backend
from .hub import ensure


def _quiet(msg: str) -> None:
    pass


def load_model(
    name_or_path: str | Path,
    weights: str = "fp32",
    backend: str = "cpu",
    *,
    compute_units: str = "cpu_and_ne",
    device: str = "cpu",
    pull: bool = False,
    say: Callable[[str], None] = _quiet,
    progress: bool = False,
) -> LoadedModel:
    """Resolve the model (pulling a missing Hub model when `pull`), load it in the `weights` format and attach the
    backend: `cpu` (torch), `ane` (the model's Core ML export; a one-line error where that cannot run) or `auto`
    (ane where Core ML runs and the model has an export, else cpu)."""
    spec = resolve_model(str(name_or_path))
    folder = ensure(spec, pull, say, progress)
    try:
        model = load_checkpoint(folder, weights, device)
    except DamagedFileError as e:
        if spec.on_hub:  # in the Hugging Face cache: verify finds the damaged file, pull fetches it again
            e.hint = f"run: leapvox models verify {spec.name}; then leapvox models pull {spec.name}"
        raise
    if resolve_backend(backend, folder) != "ane":
        return model
    ane = load_ane_backend(folder, model.tts.talker, compute_units, str(name_or_path))
    say(f"backend ane: Core ML ({compute_units}), {ane.export_dir.name}")
    return replace(model, backend=ane)
