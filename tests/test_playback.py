"""Playback from a ring buffer through an injected fake output stream; pre-buffer sizing; no-audio fallbacks."""

from __future__ import annotations

import builtins
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from leapvox.app import playback
from leapvox.app.cli import main
from leapvox.app.playback import AudioUnavailable, Player, RingBuffer, prebuffer_s

from .conftest import FIXTURES

SR, BLOCK = 24000, 480  # 20 ms blocks


class FakeOutputStream:
    """Stands in for sounddevice.OutputStream: the test (or a thread) calls `pump` to pull blocks."""

    def __init__(self, samplerate, channels, dtype, callback, device, blocksize):
        assert channels == 1 and dtype == "float32"
        self.callback, self.blocksize, self.played = callback, blocksize, []
        self.started = self.closed = False

    def start(self):
        self.started = True

    def stop(self):
        self.started = False

    def abort(self):
        self.started = False

    def close(self):
        self.closed = True

    def pump(self, blocks: int = 1) -> None:
        for _ in range(blocks):
            out = np.full((self.blocksize, 1), np.nan, np.float32)
            self.callback(out, self.blocksize, None, None)
            assert not np.isnan(out).any()
            self.played.append(out[:, 0].copy())

    @property
    def output(self) -> np.ndarray:
        return np.concatenate(self.played) if self.played else np.zeros(0, np.float32)


def make_player(**kw) -> tuple[Player, FakeOutputStream]:
    made = []

    def factory(**args):
        made.append(FakeOutputStream(**args))
        return made[-1]

    player = Player(SR, stream_factory=factory, blocksize=BLOCK, **kw).start()
    return player, made[0]


def signal(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * SR)).astype(np.float32)


def test_fast_producer_plays_everything_without_underruns():
    player, stream = make_player()
    audio = signal(1.5)
    for i in range(0, len(audio), 3840):  # 160 ms chunks, all before playback starts
        player.feed(audio[i : i + 3840], xrt=5.0, remaining_s=(len(audio) - i) / SR)
    player.end()
    while not player.wait(0):
        stream.pump()
    out = stream.output
    start = np.flatnonzero(out)[0]
    assert np.array_equal(out[start : start + len(audio)], audio)  # gapless, bit for bit
    assert player.stats.underruns == 0 and player.stats.buffered_s == 0
    player.close()
    assert stream.closed


def simulate(xrt_reported: float, xrt_true: float, total_s: float = 4.0) -> tuple[Player, FakeOutputStream, np.ndarray]:
    """A producer making `xrt_true` seconds of audio per second of playback, feeding 80 ms frames as they are made,
    each with the speed it reports and the audio still to come."""
    player, stream = make_player()
    audio, frame, fed, made = signal(total_s), 1920, 0, 0.0
    while fed < len(audio):
        made += xrt_true * BLOCK  # samples produced while one block plays
        while fed + frame <= made and fed < len(audio):
            player.feed(audio[fed : fed + frame], xrt_reported, (len(audio) - fed - frame) / SR)
            fed += frame
        stream.pump()
    player.end()
    while not player.wait(0):
        stream.pump()
    return player, stream, audio


def test_slow_producer_with_a_too_small_prebuffer_underruns():
    player, _, _ = simulate(xrt_reported=2.0, xrt_true=0.5)  # claims to be fast, is slow
    assert player.stats.underruns > 0


def test_adaptive_prebuffer_prevents_underruns_when_slower_than_real_time():
    player, stream, audio = simulate(xrt_reported=0.5, xrt_true=0.5)
    assert player.stats.underruns == 0
    out = stream.output
    start = np.flatnonzero(out)[0]
    assert start / SR >= 0.9 * 4.0 * 0.5  # waited for about half the audio first
    assert np.array_equal(out[start : start + len(audio)], audio)


def test_prebuffer_sizes():
    assert prebuffer_s(3.0, 100.0) == playback.MIN_PREBUFFER_S  # faster than real time: just a head start
    assert prebuffer_s(0.5, 10.0) == pytest.approx(10.0 * playback.PREBUFFER_MARGIN)  # R (1 - x) / x
    assert prebuffer_s(0.25, 2.0) > prebuffer_s(0.5, 2.0)
    assert prebuffer_s(None, None) >= playback.MIN_PREBUFFER_S


def test_ring_buffer_wraps_and_grows():
    ring, out = RingBuffer(8), np.zeros(5, np.float32)
    ring.write(np.arange(6))
    assert ring.read_into(out) == 5 and list(out) == [0, 1, 2, 3, 4]
    ring.write(np.arange(6, 20))  # wraps, then grows past its capacity
    got = np.zeros(20, np.float32)
    assert ring.read_into(got) == 15 and list(got[:15]) == list(range(5, 20)) and ring.available == 0


def test_stop_drops_buffered_audio():
    player, stream = make_player()
    player.feed(signal(2.0), xrt=4.0, remaining_s=0.0)
    stream.pump(3)
    player.stop()
    assert player.wait(0) and player.stats.buffered_s == 0
    player.close()
    assert stream.closed


def test_missing_portaudio_is_one_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_portaudio(name, *a, **kw):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_portaudio)
    with pytest.raises(AudioUnavailable) as e:
        playback.output_devices()
    assert "PortAudio" in str(e.value) and "-o" in e.value.hint


def no_audio(monkeypatch):
    def refuse(**kw):
        raise AudioUnavailable("no audio output: no output device", hint="write a WAV with -o")

    monkeypatch.setattr(playback, "sounddevice_stream", refuse)


FAST = ["--model", FIXTURES / "tiny-0b6", "--max-frames", "3", "--seed", "1"]


def test_speak_play_without_audio_still_writes_the_wav(tmp_path, monkeypatch, capsys):
    no_audio(monkeypatch)
    out = tmp_path / "x.wav"
    assert main([str(a) for a in ["speak", "Hello.", "--play", "-o", out, *FAST]]) == 0
    err = capsys.readouterr().err
    assert "warning: cannot play: no audio output" in err and "synthesised" in err
    audio, sr = sf.read(out)
    assert sr == SR and len(audio) == 3 * 1920


def test_speak_play_without_audio_and_without_output_fails_in_one_line(monkeypatch, capsys):
    no_audio(monkeypatch)
    assert main([str(a) for a in ["speak", "Hello.", "--play", *FAST]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leapvox: error: no audio output") and "hint" in err[0]


def test_speak_play_through_a_fake_device(tmp_path, monkeypatch, capsys):
    streams = []

    def fake(**kw):
        streams.append(FakeOutputStream(**kw))
        s = streams[-1]

        def run():  # a sound card that pulls 20 ms blocks ten times faster than real time
            while not s.closed:
                s.pump()
                time.sleep(0.002)

        threading.Thread(target=run, daemon=True).start()
        return s

    monkeypatch.setattr(playback, "sounddevice_stream", fake)
    monkeypatch.setattr(playback, "output_devices", lambda: [playback.OutputDevice(0, "fake", 1, 24000.0, True)])
    out = tmp_path / "p.wav"
    assert main([str(a) for a in ["speak", "One. Two.", "--play", "-o", out, *FAST]]) == 0
    err = capsys.readouterr().err
    assert "played" in err and "underruns" in err
    audio, _ = sf.read(out, dtype="float32")
    played = streams[0].output
    start = np.flatnonzero(played)[0]
    assert np.allclose(played[start : start + len(audio)], audio, atol=1 / 32768)  # the WAV is 16-bit


def test_devices_command_without_devices(monkeypatch, capsys):
    monkeypatch.setattr(playback, "output_devices", lambda: [])
    assert main(["devices"]) == 1
    assert "no audio output devices" in capsys.readouterr().err


def test_device_underflows_count_as_underruns():
    player, stream = make_player()
    player.feed(signal(1.0), xrt=5.0, remaining_s=0.0)

    class Status:
        output_underflow = True

    out = np.zeros((BLOCK, 1), np.float32)
    stream.callback(out, BLOCK, None, Status())  # PortAudio says the device ran dry before this block
    stream.callback(out, BLOCK, None, None)
    assert player.stats.underruns == 1


ALSA_CHILD = """
import ctypes, ctypes.util, sys
lib = ctypes.CDLL(ctypes.util.find_library("asound") or "libasound.so.2")
if sys.argv[1] == "quiet":
    from leapvox.app import playback
    assert playback.quiet_alsa()
pcm = ctypes.c_void_p()
print(lib.snd_pcm_open(ctypes.byref(pcm), b"leapvox_no_such_pcm", 0, 0))  # an error libasound reports on fd 2
sys.stderr.write("leapvox: still here\\n")
if sys.argv[1] == "quiet":
    print(playback.ALSA_MESSAGES["count"])
"""


def test_alsa_messages_do_not_reach_stderr():
    import ctypes.util
    import subprocess
    import sys

    if not ctypes.util.find_library("asound"):
        pytest.skip("no libasound here (not Linux, or ALSA not installed)")
    def run(mode):
        return subprocess.run([sys.executable, "-c", ALSA_CHILD, mode], capture_output=True, text=True)

    loud, quiet = run("loud"), run("quiet")
    assert loud.returncode == 0 and "ALSA lib" in loud.stderr  # what leaks without the handler
    assert quiet.returncode == 0, quiet.stderr
    assert "ALSA lib" not in quiet.stderr and "leapvox: still here" in quiet.stderr  # ours still gets through
    assert int(quiet.stdout.split()[-1]) >= 1  # the message reached the handler
