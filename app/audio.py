"""WAV files: 24 kHz mono float audio written as 16-bit PCM, atomically."""

from __future__ import annotations

import io
import os
import struct
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from leapvox.models.files import umask as _umask
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


STREAMING_SIZE = 0xFFFFFFFF  # RIFF and data sizes of a WAV whose length is unknown when its header goes out


def wav_header(sample_rate: int, n_samples: int | None = None) -> bytes:
    """A 44-byte header of 16-bit mono PCM; `n_samples` None: a streaming header (sizes 0xFFFFFFFF, which
    libsndfile, ffmpeg and browsers read to the end of the data)."""
    data = STREAMING_SIZE if n_samples is None else 2 * n_samples
    riff = STREAMING_SIZE if n_samples is None else 36 + data
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + fmt + b"data" + struct.pack("<I", data)


def pcm16(audio: np.ndarray) -> bytes:
    """float [-1, 1] -> little-endian 16-bit PCM, converted by libsndfile exactly as `wav_bytes` converts."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), 24000, format="RAW", subtype="PCM_16", endian="LITTLE")
    return buf.getvalue()


class WavWriter:
    """A WAV written as audio arrives, in bounded memory: to a file (a temp file beside it, renamed into place by
    `close()`; `abort()` or an exception leaves the target untouched) or to a binary stream such as stdout (a
    streaming header, patched with the real sizes when the stream can seek).

    A file's temp file is made at once, so that a folder that cannot be written fails before any work; with
    `sample_rate` None the header waits for `start(sample_rate)` (the rate is known once the model is loaded)."""

    def __init__(self, target: str | Path | BinaryIO, sample_rate: int | None):
        self.sample_rate, self.samples, self.path, self.tmp = None, 0, None, None
        if isinstance(target, (str, Path)):
            self.path = Path(target)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
            self.tmp = Path(tmp)
            try:
                os.chmod(fd, 0o666 & ~_umask())
                self.out = os.fdopen(fd, "wb")
            except BaseException:
                os.close(fd)
                self.tmp.unlink(missing_ok=True)
                raise
        else:
            self.out = target
        if sample_rate is not None:
            self.start(sample_rate)

    def start(self, sample_rate: int) -> None:
        """Write the header (once)."""
        if self.sample_rate is None:
            self.sample_rate = sample_rate
            self.out.write(wav_header(sample_rate))

    def write(self, audio: np.ndarray) -> None:
        if len(audio):
            self.out.write(pcm16(audio))
            self.samples += len(audio)

    def close(self) -> Path | None:
        """Finish the file: real sizes in the header, fsync, rename. Returns the path (None for a stream).
        On an error (a full disk, say) a file's temp file is removed and the error raised."""
        if self.path is None:
            try:
                if self.out.seekable():
                    self._patch_header()
            except OSError:  # a pipe that claims to seek: the streaming header stays
                pass
            self.out.flush()
            return None
        try:
            self._patch_header()
            self.out.flush()
            os.fsync(self.out.fileno())
            self.out.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def _patch_header(self) -> None:
        """The header with the real sizes, written over the streaming one."""
        self.out.seek(0)
        self.out.write(wav_header(self.sample_rate, self.samples))
        self.out.seek(0, os.SEEK_END)

    def abort(self) -> None:
        """Drop a file being written (the target is untouched), even when its buffered data cannot be written
        (a full disk); a stream is left as it is."""
        if self.path is not None:
            try:
                self.out.close()
            except OSError:
                pass
            finally:
                self.tmp.unlink(missing_ok=True)
