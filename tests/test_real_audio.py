"""Real audio: PortAudio -> PulseAudio -> a pipe sink whose output the test reads back from its FIFO.

Skips unless a PulseAudio server with the sink below is running. To run it (Debian packages: pulseaudio
pulseaudio-utils libportaudio2 libasound2-plugins):
    pulseaudio -n --daemonize=yes --exit-idle-time=-1 --load=module-native-protocol-unix \
        --load="module-pipe-sink sink_name=leapvox_pipe file=/tmp/leapvox_pipe format=float32le rate=24000 \
        channels=1 use_system_clock_for_timing=yes"
(A null sink's monitor was tried first: on a loaded machine it drops most of what it should record; the pipe
sink hands over every sample, paced by the system clock like a sound card.)
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from leapvox.app.playback import AudioUnavailable, Player, output_devices

SINK, FIFO, SR = "leapvox_pipe", Path("/tmp/leapvox_pipe"), 24000


def _skip_reason() -> str | None:
    if not shutil.which("pactl"):
        return "pactl not installed (apt-get install pulseaudio-utils)"
    info = subprocess.run(["pactl", "info"], capture_output=True, text=True, timeout=10)
    if info.returncode != 0:
        return "no PulseAudio server running (see this file's docstring for the start command)"
    sinks = subprocess.run(["pactl", "list", "short", "sinks"], capture_output=True, text=True, timeout=10).stdout
    if SINK not in sinks:
        return f"PulseAudio has no sink named {SINK} (see this file's docstring)"
    if not FIFO.exists() or not stat.S_ISFIFO(FIFO.stat().st_mode):
        return f"{FIFO} is not the pipe sink's FIFO (see this file's docstring)"
    try:
        names = [d.name for d in output_devices()]
    except AudioUnavailable as e:
        return str(e)
    if "pulse" not in names:
        return "PortAudio lists no 'pulse' device (apt-get install libasound2-plugins)"
    return None


REASON = _skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


class Recorder:
    """Reads the pipe sink's FIFO in a thread; `until_quiet` waits for the tone and the silence after it."""

    def __init__(self):
        self.fifo = open(FIFO, "rb", buffering=0)  # noqa: SIM115 - closed in until_quiet
        self.parts: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.stop and (chunk := self.fifo.read(1 << 16)):
            self.parts.append(chunk)

    @property
    def audio(self) -> np.ndarray:
        raw = b"".join(self.parts)
        return np.frombuffer(raw[: len(raw) // 4 * 4], np.float32)

    def until_quiet(self, quiet_s: float = 0.3, timeout: float = 8.0) -> np.ndarray:
        t = time.perf_counter()
        while time.perf_counter() - t < timeout:
            loud = np.flatnonzero(np.abs(self.audio) > 0.05)
            if loud.size and len(self.audio) - loud[-1] > quiet_s * SR:
                break
            time.sleep(0.1)
        self.stop = True
        self.thread.join(timeout=10)
        self.fifo.close()
        return self.audio


def test_player_output_reaches_the_sink(monkeypatch):
    monkeypatch.setenv("PULSE_SINK", SINK)
    t = np.arange(int(0.6 * SR)) / SR
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    rec = Recorder()
    time.sleep(0.3)
    device = next(d.index for d in output_devices() if d.name == "pulse")
    player = Player(SR, device).start()
    try:
        for i in range(0, len(tone), 1920):  # 80 ms frames, as synthesis feeds them
            player.feed(tone[i : i + 1920], xrt=5.0, remaining_s=(len(tone) - i) / SR)
        player.end()
        assert player.wait(10)
    finally:
        player.close()
    got = rec.until_quiet()
    nz = np.flatnonzero(got)
    assert nz.size, "the sink received only silence"
    start = nz[0] - 1  # tone[0] is 0.0
    # every sample, in order, float32 end to end: no gap, no drop, no repeat, the end not cut off by close()
    assert np.array_equal(got[start : start + len(tone)], tone)
    assert not got[start + len(tone) :].any()
    assert player.stats.underruns == 0
