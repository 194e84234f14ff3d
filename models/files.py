"""Atomic file writes: a temp file beside the target, fsync, rename. Nothing half written, even on Ctrl-C.
Shared by the app (WAVs, JSON reports) and the model manager (Hub manifests, dataset manifests)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all. The file gets the mode a plain open() would give it (0666 less
    the umask), not mkstemp's owner-only 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        os.chmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt included: never leave the temp file behind
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))
