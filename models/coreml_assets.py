"""The Core ML exports a runtime needs: where they live, which is the newest for a model, and which backend
`--backend auto` means here. Making exports is the recipe models/recipes/coreml_export.py. The Core ML runtime is
imported only where a backend is loaded, so a CPU run imports no Core ML module."""

from __future__ import annotations

import glob
import json
from pathlib import Path

from leapvox.engine import backend
from leapvox.engine.errors import InputError
from leapvox.engine.nets.talker import Talker

from .paths import leapvox_dirs, model_key, model_revision

MANIFEST = "manifest.json"  # what marks an export folder (coreml_export writes it, coreml_runtime reads it)


def export_root() -> Path:
    return leapvox_dirs()["coreml"]


def find_export(folder: Path) -> Path | None:
    """The newest export of the model in `folder` (this revision) that holds a talker and a predictor, or None."""
    root, best = export_root(), None
    pattern = f"{glob.escape(f'{model_key(folder)}-{model_revision(folder)}-')}*/{MANIFEST}"
    for manifest in root.glob(pattern) if root.is_dir() else []:
        try:
            d = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if {"talker", "predictor"} <= set(d.get("parts", {})) and (best is None or d.get("created", 0) > best[0]):
            best = (d.get("created", 0), manifest.parent)
    return best[1] if best else None


def resolve_backend(requested: str, folder: Path) -> str:
    """`auto` -> `ane` where Core ML predictions run (macOS 15+, coremltools) and the model has an export, else
    `cpu`; `cpu` and `ane` stay as they are."""
    if requested != "auto":
        return requested
    return "ane" if backend.ane_unavailable_reason() is None and find_export(folder) is not None else "cpu"


def load_ane_backend(folder: Path, talker: Talker, compute_units: str = "cpu_and_ne", model_name: str | None = None):
    """The Core ML backend over this model's newest export; one-line errors (exit 2) with a hint otherwise."""
    from leapvox.engine.coreml import runtime as coreml_runtime

    coreml_runtime.check_available()
    export = find_export(folder)
    if export is None:
        raise InputError(f"no Core ML export of this model in {export_root()}",
                         hint=f"leapvox recipe coreml --model {model_name or folder}, or use --backend cpu")
    return coreml_runtime.load_backend(export, talker, compute_units)
