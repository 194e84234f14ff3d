"""`open_model`: a `--model` value (catalog name, Hub repo or folder) resolved once per request, with what is known
before the weights load (config.json, the default options); `load_model`: that model ready, with the backend that
will run it attached at construction. The one entry point of speak, compare, serve, the TUI and the recipes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from leapvox.engine.config import TTSConfig
from leapvox.engine.options import SynthesisOptions

from .catalog import ModelSpec, resolve_model
from .checkpoint import DamagedFileError, LoadedModel, load_checkpoint, load_config, model_defaults
from .coreml_assets import load_ane_backend, resolve_backend
from .hub import ensure


def _quiet(msg: str) -> None:
    pass


@dataclass(frozen=True)
class ModelFolder:
    """A model named once: what the name names, its checkpoint folder, its config.json and the options it speaks
    with unless told otherwise (generation_config.json). Enough to check a request before the weights load."""

    spec: ModelSpec
    path: Path
    config: TTSConfig
    defaults: SynthesisOptions


def _hinted(e: DamagedFileError, spec: ModelSpec) -> DamagedFileError:
    if spec.on_hub:  # in the Hugging Face cache: verify finds the damaged file, pull fetches it again
        e.hint = f"run: leapvox models verify {spec.name}; then leapvox models pull {spec.name}"
    return e


def open_model(name_or_path: str | Path, *, pull: bool = False, say: Callable[[str], None] = _quiet,
               progress: bool = False) -> ModelFolder:
    """Resolve the model (pulling a missing Hub model when `pull`) and read its config.json and defaults."""
    spec = resolve_model(str(name_or_path))
    folder = ensure(spec, pull, say, progress)
    try:
        cfg = load_config(folder)
    except DamagedFileError as e:
        raise _hinted(e, spec) from None
    return ModelFolder(spec, folder, cfg, model_defaults(folder, cfg))


def load_model(
    model: str | Path | ModelFolder,
    weights: str = "fp32",
    backend: str = "cpu",
    *,
    compute_units: str = "cpu_and_ne",
    device: str = "cpu",
    pull: bool = False,
    say: Callable[[str], None] = _quiet,
    progress: bool = False,
) -> LoadedModel:
    """The model (a name, or a ModelFolder opened already: nothing is resolved or read again) loaded in the
    `weights` format, with the backend attached: `cpu` (torch), `ane` (the model's Core ML export; a one-line error
    where that cannot run) or `auto` (ane where Core ML runs and the model has an export, else cpu)."""
    m = model if isinstance(model, ModelFolder) else open_model(model, pull=pull, say=say, progress=progress)
    try:
        loaded = load_checkpoint(m.path, weights, device, m.config, m.defaults)
    except DamagedFileError as e:
        raise _hinted(e, m.spec) from None
    if resolve_backend(backend, m.path) != "ane":
        return loaded
    ane = load_ane_backend(m.path, loaded.tts.talker, compute_units, m.spec.name)
    say(f"backend ane: Core ML ({compute_units}), {ane.export_dir.name}")
    return replace(loaded, backend=ane)
