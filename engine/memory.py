"""Memory housekeeping for long-lived CPU processes."""

from __future__ import annotations

import functools
import sys


@functools.cache
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None


def return_freed_memory() -> None:
    """Give the C heap's freed pages back to the OS (glibc's malloc_trim; elsewhere nothing). Quantizing layer by
    layer frees a few temporaries of each weight's size, which glibc keeps for reuse and the process's RSS would
    count (about half the loaded model's size). Called after quantizing and after each codec chunk; the codec's
    activations differ in size from chunk to chunk, and without it the heap grows over a sentence's chunks."""
    trim = _malloc_trim()
    if trim is not None and sys.platform.startswith("linux"):
        trim(0)
