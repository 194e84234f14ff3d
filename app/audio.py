"""Audio out: 24 kHz mono float audio as 16-bit WAV (or FLAC, MP3, Ogg Opus), written as it arrives to a file
(models/files.py's rule: atomically, or straight into a device or FIFO) or a stream; the server's encoders."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from leapvox.models.files import Output, write_bytes_atomic


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


# format -> (Content-Type, libsndfile format and subtype, streamed). wav and pcm are written by leapvox (the same
# bytes as `leapvox speak -o -` and its samples); the others by libsndfile where it has them. Opus (in Ogg) is
# written strictly in order, so it streams; libsndfile goes back to finish FLAC's and MP3's headers at the end
# (total length, the MP3 info frame), so those are sent when synthesis ends (into a file: written as they come).
FORMATS = {
    "wav": ("audio/wav", None, True),
    "pcm": ("audio/pcm", None, True),
    "flac": ("audio/flac", ("FLAC", "PCM_16"), False),
    "mp3": ("audio/mpeg", ("MP3", "MPEG_LAYER_III"), False),
    "opus": ("audio/ogg; codecs=opus", ("OGG", "OPUS"), True),
}
EXTENSIONS = {".wav": "wav", ".flac": "flac", ".mp3": "mp3", ".ogg": "opus", ".opus": "opus"}  # of `speak -o`


def supported_formats() -> list[str]:
    """The formats this installation can write (libsndfile's MP3 and Opus depend on how it was built)."""
    import soundfile as sf

    formats, subtypes = sf.available_formats(), {}
    ok = []
    for name, (_, lib, _) in FORMATS.items():
        if lib is None:
            ok.append(name)
            continue
        fmt, sub = lib
        subtypes.setdefault(fmt, sf.available_subtypes(fmt) if fmt in formats else {})
        if sub in subtypes[fmt]:
            ok.append(name)
    return ok


def file_format(name: str | Path) -> str:
    """The format a file name asks for by its extension (any case); none: wav. ValueError naming the extensions
    this installation writes for any other, or one whose format libsndfile here lacks."""
    ext = Path(name).suffix.lower()
    if not ext:
        return "wav"
    ok = supported_formats()
    if EXTENSIONS.get(ext) not in ok:
        known = ", ".join(e for e, f in EXTENSIONS.items() if f in ok)
        raise ValueError(f"leapvox writes {known} (the format follows the extension; none: .wav)")
    return EXTENSIONS[ext]


class _Sink:
    """A write-only file for libsndfile that keeps what it writes; `take()` returns the bytes appended since the last
    call. Bytes rewritten behind that point (a header finished at the end) are kept for a whole-file format only."""

    def __init__(self):
        self.data, self.pos, self.taken = bytearray(), 0, 0

    def write(self, b) -> int:
        b = bytes(b)
        self.data[self.pos : self.pos + len(b)] = b
        self.pos += len(b)
        return len(b)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else len(self.data) + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        out = bytes(self.data[self.taken :])
        self.taken = len(self.data)
        return out


class _FileSink:
    """libsndfile's file when it writes into a seekable file `f` as the audio comes: calls go to `f`; an OSError (a
    full disk) is kept in `error`, to be raised in place of libsndfile's "System error" (a callback cannot raise)."""

    def __init__(self, f: BinaryIO):
        self.f, self.error = f, None

    def write(self, b) -> int:
        try:
            return self.f.write(bytes(b))
        except OSError as e:
            self.error = self.error or e
            return 0

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def read(self, n: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        return b""  # all of it is in the file


class Encoder:
    """Float audio -> the bytes of one format, chunk by chunk: `audio()` for each chunk, `end()` once. With `into` (a
    seekable file), libsndfile writes into it as the audio comes and both return nothing."""

    def __init__(self, fmt: str, sample_rate: int, into: BinaryIO | None = None):
        self.fmt, self.sample_rate = fmt, sample_rate
        self.content_type, lib, self.streamed = FORMATS[fmt]
        self.head = wav_header(sample_rate) if fmt == "wav" else b""  # a streaming header: length unknown
        self.file = self.sink = None
        if lib is not None:
            import soundfile as sf

            self.sink = _Sink() if into is None else _FileSink(into)
            self.file = self._check(sf.SoundFile, self.sink, "w", sample_rate, 1, lib[1], format=lib[0])

    def _check(self, fn, *a, **k):
        """fn(*a, **k); the file's OSError, if it had one, in place of what libsndfile made of it."""
        try:
            return fn(*a, **k)
        except Exception:
            if getattr(self.sink, "error", None) is not None:
                raise self.sink.error from None
            raise

    def audio(self, audio: np.ndarray) -> bytes:
        if self.file is None:
            out, self.head = self.head + (pcm16(audio) if len(audio) else b""), b""
            return out
        if len(audio):  # as 16-bit samples, converted as wav and pcm convert them: a FLAC holds exactly those
            self._check(self.file.write, np.frombuffer(pcm16(audio), dtype="<i2"))
        return self.sink.take() if self.streamed else b""

    def end(self) -> bytes:
        if self.file is None:
            out, self.head = self.head, b""
            return out
        self._check(self.file.close)
        return self.sink.take() if self.streamed or isinstance(self.sink, _FileSink) else bytes(self.sink.data)


class WavWriter:
    """Audio written as it arrives, in bounded memory, as a WAV (or `fmt`: FLAC, MP3, Ogg Opus) to a file (an
    `Output`: a temp file renamed into place by `close()`, where `abort()` or an exception leaves the target
    untouched; or a device or FIFO written straight into) or to a binary stream such as stdout. A WAV's header is a
    streaming one, patched with the real sizes where the file can be (a regular file, a stream that seeks).
    FLAC and MP3 go into a regular file as they come; into a device, FIFO or stream when synthesis ends.

    A file's temp file is made (a device or FIFO opened) at once, so that a folder that cannot be written fails
    before any work; with `sample_rate` None the header waits for `start(sample_rate)` (the rate is known once the
    model is loaded)."""

    def __init__(self, target: str | Path | BinaryIO, sample_rate: int | None, fmt: str = "wav"):
        self.sample_rate, self.samples, self.fmt, self.encoder = None, 0, fmt, None
        self.output = Output(target) if isinstance(target, (str, Path)) else None
        self.path = None if self.output is None else self.output.path
        self.out = target if self.output is None else self.output.file
        if sample_rate is not None:
            self.start(sample_rate)

    def start(self, sample_rate: int) -> None:
        """Write the header (once)."""
        if self.sample_rate is None:
            self.sample_rate = sample_rate
            if self.fmt == "wav":
                self.out.write(wav_header(sample_rate))
            else:  # libsndfile seeks back in a regular file only: elsewhere it writes into memory
                into = self.out if self.output is not None and not self.output.direct else None
                self.encoder = Encoder(self.fmt, sample_rate, into)

    def write(self, audio: np.ndarray) -> None:
        if len(audio):
            self.out.write(pcm16(audio) if self.encoder is None else self.encoder.audio(audio))
            self.samples += len(audio)

    def close(self) -> Path | None:
        """Finish the file: real sizes in the header, fsync, rename. Returns the path (None for a stream).
        On an error (a full disk) a file's temp file is removed and the error raised."""
        try:
            if self.encoder is not None:
                self.out.write(self.encoder.end())
            elif self.output is None or not self.output.direct:
                self._patch_header()
            if self.output is None:
                self.out.flush()
                return None
            return self.output.commit()
        except BaseException:
            self.abort()
            raise

    def _patch_header(self) -> None:
        """The header with the real sizes, written over the streaming one; a stream that cannot seek (a pipe, or one
        that claims to) keeps the streaming header."""
        try:
            if self.out.seekable():
                self.out.seek(0)
                self.out.write(wav_header(self.sample_rate, self.samples))
                self.out.seek(0, os.SEEK_END)
        except OSError:
            if self.output is not None:
                raise

    def abort(self) -> None:
        """Drop a file being written (the target is untouched), even when its buffered data cannot be written
        (a full disk); a stream, device or FIFO keeps what it got."""
        if self.output is not None:
            self.output.abort()
