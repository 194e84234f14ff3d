"""Real-time playback: a callback-driven output stream fed from a ring buffer, with an adaptive pre-buffer.

The synthesis side calls `Player.feed` with each chunk (and the latest speed figures); the audio device pulls
blocks from the ring in its own thread. Playback starts once the pre-buffer holds enough audio that, at the
measured generation speed, the ring never runs dry before synthesis ends; if it does run dry anyway, that is
an underrun: it is counted and the player pre-buffers again. sounddevice is imported only when a real stream
is opened, so everything here works (and is tested) with an injected fake stream and without PortAudio.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from leapvox.engine.errors import InputError, LeapvoxError

MIN_PREBUFFER_S = 0.25  # even a fast producer gets this much head start (scheduling jitter)
PREBUFFER_MARGIN = 1.25  # on top of the computed need, for speed that wobbles


class AudioUnavailable(LeapvoxError):
    """No audio output here: PortAudio missing, no output device, or the device refused the stream."""


# libasound (ALSA, under PortAudio on Linux) prints its errors straight to fd 2 unless given a handler, among them
# "ALSA lib pcm.c:...:(snd_pcm_recover) underrun occurred" mid-playback; the player counts underruns itself (PortAudio
# reports them to its callback), so the handler drops these lines and counts them in ALSA_MESSAGES.
_ALSA_HANDLER_TYPE = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p
)
_alsa_handler = None  # kept referenced: libasound calls it for as long as the process runs
ALSA_MESSAGES = {"count": 0}


def _on_alsa_message(file, line, function, err, fmt) -> None:  # variadic in C; the format's arguments are ignored
    ALSA_MESSAGES["count"] += 1


def quiet_alsa() -> bool:
    """Install the handler above in libasound, once; False where there is no libasound (not Linux, no ALSA)."""
    global _alsa_handler
    if _alsa_handler is not None:
        return True
    name = ctypes.util.find_library("asound")
    try:
        lib = ctypes.CDLL(name or "libasound.so.2")  # the copy PortAudio uses: one per process
        set_handler = lib.snd_lib_error_set_handler
    except (OSError, AttributeError):
        return False
    handler = _ALSA_HANDLER_TYPE(_on_alsa_message)
    set_handler.argtypes = [_ALSA_HANDLER_TYPE]
    set_handler.restype = ctypes.c_int
    if set_handler(handler) != 0:
        return False
    _alsa_handler = handler
    return True


def load_sounddevice():
    """The sounddevice module, or AudioUnavailable with a hint when PortAudio is missing."""
    try:
        import sounddevice
    except OSError:  # sounddevice raises OSError when the PortAudio library is not installed
        raise AudioUnavailable(
            "no audio output: the PortAudio library is not installed",
            hint="install libportaudio2 (Debian/Ubuntu) or portaudio (Homebrew); -o out.wav works without it",
        ) from None
    quiet_alsa()
    return sounddevice


@dataclass(frozen=True)
class OutputDevice:
    index: int
    name: str
    channels: int
    default_samplerate: float
    is_default: bool


def output_devices() -> list[OutputDevice]:
    """Devices that can play audio, as PortAudio lists them."""
    sd = load_sounddevice()
    try:
        default = sd.query_devices(kind="output")["index"]
    except (sd.PortAudioError, ValueError):
        default = None
    return [
        OutputDevice(i, d["name"], d["max_output_channels"], d["default_samplerate"], i == default)
        for i, d in enumerate(sd.query_devices())
        if d["max_output_channels"] > 0
    ]


def resolve_device(spec: str | int | None, devices: list[OutputDevice] | None = None) -> int | None:
    """--device value -> PortAudio device index: an index, or a unique part of a device name; None = default."""
    if spec is None or spec == "":
        return None
    devices = output_devices() if devices is None else devices
    if str(spec).isdigit():
        if any(d.index == int(spec) for d in devices):
            return int(spec)
        raise InputError(f"no output device number {spec}", hint="'leapvox devices' lists them")
    hits = [d for d in devices if str(spec).lower() in d.name.lower()]
    if len(hits) == 1:
        return hits[0].index
    what = "no output device" if not hits else f"{len(hits)} output devices"
    raise InputError(f"{what} named like {spec!r}", hint="'leapvox devices' lists them; give the number")


def check_device(spec: str | int | None) -> int | None:
    """resolve_device(spec) where there is something to play on, asked of PortAudio without opening a stream (fast,
    before a model loads): AudioUnavailable (exit 1) with no output device at all, or none as the default."""
    devices = output_devices()
    if not devices:
        raise AudioUnavailable("no audio output device", hint="on a machine without sound, write the audio with "
                               "-o out.wav ('leapvox devices' lists the devices)")
    if spec in (None, "") and not any(d.is_default for d in devices):
        raise AudioUnavailable("no default audio output device", hint="pick one with --device ('leapvox devices' "
                               "lists them)")
    return resolve_device(spec, devices)


def prebuffer_s(xrt: float | None, remaining_s: float | None, minimum: float = MIN_PREBUFFER_S) -> float:
    """Audio to hold before playing so that a producer at `xrt` (audio s per wall s) with `remaining_s` of audio
    still to make never lets the buffer run dry: while it makes R seconds of audio, R / xrt seconds play, so the
    buffer must already hold R (1 - xrt) / xrt (times a margin)."""
    if xrt is None or remaining_s is None:
        return max(minimum, 1.0)  # nothing measured yet
    if xrt >= 1.0 / PREBUFFER_MARGIN:
        return minimum
    need = remaining_s * (1.0 - xrt) / max(xrt, 1e-3)
    return max(minimum, PREBUFFER_MARGIN * need)


class RingBuffer:
    """Single-producer single-consumer float32 ring that grows instead of blocking or dropping audio."""

    def __init__(self, capacity: int):
        self._data = np.zeros(max(capacity, 1), np.float32)
        self._start = self._size = 0
        self._lock = threading.Lock()

    @property
    def available(self) -> int:
        return self._size

    def write(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32).reshape(-1)
        with self._lock:
            if self._size + len(x) > len(self._data):
                self._grow(self._size + len(x))
            cap = len(self._data)
            end = (self._start + self._size) % cap
            first = min(len(x), cap - end)
            self._data[end : end + first] = x[:first]
            self._data[: len(x) - first] = x[first:]
            self._size += len(x)

    def read_into(self, out: np.ndarray) -> int:
        """Copy up to len(out) samples into `out`; returns how many."""
        with self._lock:
            n = min(len(out), self._size)
            cap = len(self._data)
            first = min(n, cap - self._start)
            out[:first] = self._data[self._start : self._start + first]
            out[first:n] = self._data[: n - first]
            self._start = (self._start + n) % cap
            self._size -= n
            return n

    def _grow(self, need: int) -> None:
        cap = len(self._data)
        new = np.zeros(max(need, 2 * cap), np.float32)
        first = min(self._size, cap - self._start)
        new[:first] = self._data[self._start : self._start + first]
        new[first : self._size] = self._data[: self._size - first]
        self._data, self._start = new, 0


@dataclass(frozen=True)
class PlaybackStats:
    underruns: int  # times the buffer ran dry while synthesis was still going, or the device did
    prebuffer_s: float  # the current pre-buffer target
    buffered_s: float  # audio waiting in the ring
    played_s: float


def sounddevice_stream(**kwargs):
    """The real output stream (sounddevice.OutputStream); AudioUnavailable if the device refuses."""
    sd = load_sounddevice()
    try:
        return sd.OutputStream(**kwargs)
    except (sd.PortAudioError, ValueError) as e:
        raise AudioUnavailable(
            f"cannot open the audio output: {e}", hint="pick another with --device ('leapvox devices' lists them)"
        ) from None


class Player:
    """Plays a stream of float32 mono chunks through a callback-driven output stream.

    `stream_factory(samplerate=, channels=, dtype=, callback=, device=, blocksize=)` builds the output stream
    (sounddevice.OutputStream by default; tests pass a fake). Use: start(), feed(...) per chunk, end(), wait().
    """

    def __init__(
        self,
        sample_rate: int,
        device: int | None = None,
        *,
        stream_factory: Callable | None = None,
        blocksize: int = 1024,
        min_prebuffer_s: float = MIN_PREBUFFER_S,
    ):
        self.sample_rate, self.device, self.blocksize = sample_rate, device, blocksize
        self.min_prebuffer_s = min_prebuffer_s
        self._factory = stream_factory or sounddevice_stream
        self._ring = RingBuffer(sample_rate * 30)
        self._target = int(prebuffer_s(None, None, min_prebuffer_s) * sample_rate)
        self._playing = self._ended = self._stopped = False
        self._drained = threading.Event()
        self.underruns = self._played = 0
        self._stream, self._flush_left = None, blocksize

    def start(self) -> Player:
        self._stream = self._factory(
            samplerate=self.sample_rate, channels=1, dtype="float32", callback=self._callback,
            device=self.device, blocksize=self.blocksize,
        )
        latency = getattr(self._stream, "latency", 0.0)  # seconds of audio the device buffers after us
        self._flush_left = int((latency if isinstance(latency, float) else 0.0) * self.sample_rate) + self.blocksize
        self._stream.start()
        return self

    def feed(self, audio: np.ndarray, xrt: float | None = None, remaining_s: float | None = None) -> None:
        """Queue audio; `xrt` and `remaining_s` (audio still to come) size the pre-buffer."""
        if xrt is not None:
            self._target = int(prebuffer_s(xrt, remaining_s, self.min_prebuffer_s) * self.sample_rate)
        self._drained.clear()
        self._ring.write(audio)

    def end(self) -> None:
        """No more audio is coming: play what is buffered even if it is below the pre-buffer target."""
        self._ended = True
        if self._ring.available == 0 and self._played == 0:
            self._drained.set()  # nothing was ever played

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything fed has been played (after end()); False on timeout."""
        return self._drained.wait(timeout)

    def stop(self) -> None:
        """Stop now, dropping what is buffered (close() then aborts the device instead of letting it drain)."""
        self._ended = self._stopped = True
        self._ring = RingBuffer(1)
        self._drained.set()

    def close(self) -> None:
        if self._stream is not None:
            if self._stopped:
                self._stream.abort()  # now, not after the device's own buffers have played
            else:
                self._stream.stop()
            self._stream.close()
            self._stream = None

    @property
    def stats(self) -> PlaybackStats:
        sr = self.sample_rate
        return PlaybackStats(self.underruns, self._target / sr, self._ring.available / sr, self._played / sr)

    def _callback(self, outdata, frames, time_info, status) -> None:
        out = outdata[:, 0]
        ring = self._ring
        if getattr(status, "output_underflow", False):  # the device itself ran dry (ALSA's "underrun occurred")
            self.underruns += 1
        if self._ended and ring.available == 0:
            out[:] = 0
            self._flush(frames)
            return
        if not self._playing:
            if not (ring.available >= self._target or (self._ended and ring.available)):
                out[:] = 0  # pre-buffering
                return
            self._playing = True
        n = ring.read_into(out)
        self._played += n
        if n < frames:
            out[n:] = 0
            if self._ended:
                self._flush(frames - n)
            else:
                self.underruns += 1
                self._playing = False

    def _flush(self, silent: int) -> None:
        """After the last sample, count out the device's own latency in silence before reporting drained, so that
        closing the stream does not cut the end of the audio off."""
        self._flush_left -= silent
        if self._flush_left <= 0:
            self._drained.set()
