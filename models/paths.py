"""Where leapvox's own files live (platformdirs, or $LEAPVOX_HOME), the key that names a model's assets, and the
check that a folder is a checkpoint."""

from __future__ import annotations

import hashlib
from pathlib import Path

from leapvox.engine.dirs import base_dirs
from leapvox.engine.errors import ModelNotFoundError


def leapvox_dirs() -> dict[str, Path]:
    """leapvox's own folders (platformdirs, appname "leapvox"); $LEAPVOX_HOME puts them all under one folder
    (engine.dirs)."""
    data, config, cache = base_dirs().values()
    return {
        "data": data,
        "config": config,
        "cache": cache,
        "manifests": data / "manifests",
        "offsets": data / "offsets",
        "trees": data / "trees",
        "coreml": data / "coreml",
        "kernels": cache / "kernels",  # engine/fast/kernels' compiled libraries (engine.fast.kernels.cache_dir)
        "settings": config / "settings.json",
    }


def model_key(folder: Path) -> str:
    """The folder's name and a hash of its resolved path (a Hugging Face snapshot path holds the commit)."""
    folder = Path(folder).resolve()
    return f"{folder.name}-{hashlib.sha1(str(folder).encode()).hexdigest()[:10]}"


def model_revision(folder: Path) -> str:
    """The Hub commit for a Hugging Face snapshot folder (its name), else 'local'."""
    folder = Path(folder).resolve()
    return folder.name[:12] if folder.parent.name == "snapshots" else "local"


def check_folder(path: Path) -> Path:
    """A folder with config.json, or a one-line error saying what was expected."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"no model at {path}", hint="give a checkpoint folder (config.json, model.safetensors, speech_tokenizer/)"
        )
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} is not a Qwen3-TTS checkpoint folder (no config.json)",
            hint="a checkpoint folder holds config.json, model.safetensors, vocab.json, merges.txt, speech_tokenizer/",
        )
    return path
