"""WAV files: 24 kHz mono float audio written as 16-bit PCM, atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np

from leapvox.models.files import write_bytes_atomic


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """A complete WAV file (16-bit PCM, mono) in memory."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write atomically: the target is either the complete new file or untouched."""
    return write_bytes_atomic(path, wav_bytes(audio, sample_rate))


def write_wav_stream(out: BinaryIO, audio: np.ndarray, sample_rate: int) -> None:
    """Write a whole WAV to a binary stream such as stdout."""
    out.write(wav_bytes(audio, sample_rate))
    out.flush()
