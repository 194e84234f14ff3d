"""Where spec-mode assets live and how they are read: trained offsets and calibrated draft trees.

Offsets: `leapvox_offsets.safetensors` beside the checkpoint (a bundled model ships it there), else
`<data>/offsets/<model key>.safetensors`. Trees: `<data>/trees/<model key>-<backend>-<device>.json`, else the
default tree, drafting as deep as the offsets do.
The model key names the folder and hashes its resolved path (a Hugging Face snapshot path holds the commit).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from leapvox.engine.errors import CheckpointError
from leapvox.engine.spec import DraftTree, default_tree, rank_gap

from .paths import leapvox_dirs, model_key

BESIDE = "leapvox_offsets.safetensors"


def offsets_path(folder: Path) -> Path:
    return leapvox_dirs()["offsets"] / f"{model_key(folder)}.safetensors"


def tree_path(folder: Path, backend: str = "cpu", device: str = "cpu") -> Path:
    return leapvox_dirs()["trees"] / f"{model_key(folder)}-{backend}-{device}.json"


def save_offsets(path: Path, offsets: torch.Tensor, meta: dict) -> Path:
    from safetensors.torch import save as save_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    data = save_bytes({"offsets": offsets.detach().float().contiguous()}, {k: str(v) for k, v in meta.items()})
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def load_offsets(folder: Path, hidden: int) -> tuple[torch.Tensor | None, Path | None]:
    """Trained offsets [K, Hc] (or [15, K, Hc] per position) for the model in `folder`, if any."""
    from safetensors.torch import load_file

    for path in (Path(folder) / BESIDE, offsets_path(folder)):
        if path.is_file():
            try:
                b = load_file(path)["offsets"]
            except Exception as e:
                msg = f"spec offsets file {path} is damaged: {e}"
                raise CheckpointError(msg, hint="delete it and retrain") from None
            if b.shape[-1] != hidden:
                raise CheckpointError(
                    f"spec offsets in {path} have width {b.shape[-1]}, the code predictor has {hidden}",
                    hint="they belong to another model; delete the file or run leapvox recipe offsets",
                )
            return b, path
    return None, None


def save_tree(path: Path, tree: DraftTree, meta: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps({"paths": [list(p) for p in tree.paths()[1:]], **meta}, indent=1))
    tmp.replace(path)
    return path


def load_tree(folder: Path, backend: str = "cpu", device: str = "cpu",
              offsets: torch.Tensor | None = None) -> tuple[DraftTree, Path | None]:
    """The calibrated tree stored for (model, backend, device), else the default tree as deep as `offsets` draft
    (the paper's 3 without offsets)."""
    path = tree_path(folder, backend, device)
    if not path.is_file():
        return default_tree(3 if offsets is None else max(1, min(offsets.shape[-2], 14))), None
    try:
        paths = [tuple(p) for p in json.loads(path.read_text())["paths"]]
        gap = rank_gap(paths)  # from_paths would renumber it; a stored tree that skips a rank was not calibrated
        if gap is None:
            return DraftTree.from_paths(paths), path
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"calibrated tree {path} is damaged: {e}", hint="delete it and recalibrate") from None
    raise CheckpointError(f"calibrated tree {path} is not a valid draft tree: {gap}",
                          hint="spec mode would lose ar's distribution with it; delete it and recalibrate")
