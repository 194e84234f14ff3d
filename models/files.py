"""Writing the files leapvox makes, one rule for all: a regular file (or a new one) whole or not at all (a temp file
beside it, fsync, rename; nothing half written, even on Ctrl-C), through a symlink to the file it names; a character
device or a FIFO written straight into (it cannot be replaced or synced). Shared by the app (WAVs, JSON reports) and
the model manager (Hub manifests, dataset manifests, voices)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def path_kind(path: str | Path) -> str:
    """What `path` is, symlinks followed: "new" (nothing there, or a dangling symlink), "file", "device" (a character
    device), "fifo", "folder", "block device" or "socket"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "new"
    for test, kind in ((stat.S_ISREG, "file"), (stat.S_ISCHR, "device"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISDIR, "folder"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "socket"


def output_problem(path: str | Path) -> str | None:
    """Why `path` cannot be written (its folder missing, a folder, a block device, a socket), or None."""
    try:
        kind = path_kind(path)
    except OSError as e:  # a loop of symlinks, a file where a folder should be, no permission to look
        return e.strerror or str(e)
    if kind == "new" and not Path(os.path.realpath(path)).parent.is_dir():
        return "its folder does not exist"
    return None if kind in ("new", "file", "device", "fifo") else f"it is a {kind}"


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same inode (symlinks and hard links included), or, for paths not made
    yet, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class Output:
    """A file being written to `path` as its kind asks: a regular or new file through a temp file beside the file a
    symlink chain ends at, renamed into place by `commit()` (`abort()` or an error leaves the target untouched); a
    character device or a FIFO opened as it is (`direct`: no temp file, no rename, no fsync). A folder, a block
    device or a socket: an OSError."""

    def __init__(self, path: str | Path):
        self.path = self.target = Path(path)
        self.tmp, kind = None, path_kind(self.path)
        self.direct = kind in ("device", "fifo")
        if self.direct:
            self.file = open(self.path, "wb")  # noqa: SIM115 - closed by commit() or abort()
            return
        if kind not in ("new", "file"):
            raise (IsADirectoryError if kind == "folder" else OSError)(
                errno.EISDIR if kind == "folder" else errno.EINVAL, f"it is a {kind}", str(path))
        self.target = Path(os.path.realpath(self.path))  # a symlink stays; the file it names is replaced
        fd, tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=".part", dir=self.target.parent)
        self.tmp = Path(tmp)
        try:
            os.chmod(fd, 0o666 & ~umask())  # the mode a plain open() would give, not mkstemp's owner-only 0600
            self.file = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise

    def commit(self) -> Path:
        """Finish: flush, and for a temp file fsync and rename it into place. On an error (a full disk) the temp
        file is removed and the error raised."""
        try:
            self.file.flush()
            if self.tmp is not None:
                os.fsync(self.file.fileno())
            self.file.close()
            if self.tmp is not None:
                os.replace(self.tmp, self.target)
        except BaseException:  # KeyboardInterrupt included: never leave the temp file behind
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop what was written (a device or FIFO keeps what it got), even when buffered data cannot be written."""
        try:
            self.file.close()
        except OSError:
            pass
        finally:
            if self.tmp is not None:
                self.tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all (a device or FIFO: straight in; see `Output`)."""
    out = Output(path)
    try:
        out.file.write(data)
    except BaseException:
        out.abort()
        raise
    return out.commit()


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))
