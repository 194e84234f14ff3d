"""One synthesis path: `speak -o FILE`, `-o -` and `--play` consume the same stream, so the same text and seed give
the same samples; `synthesize()` is the stream joined; long text is split into sentences and stays in bounded
memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from leapvox.app import playback
from leapvox.app.cli import main
from leapvox.engine.streaming import CROSSFADE_S
from leapvox.engine.text import split_sentences

from .conftest import FIXTURES

TEXT = "The first sentence is here. And a second one follows it!"
DEMO_ARGS = ["--seed", "5", "--weights", "fp32", "--max-frames", "40"]


class _SoundCard:
    """A fake output stream that pulls blocks ten times faster than real time."""

    def __init__(self, samplerate, channels, dtype, callback, device, blocksize):
        self.callback, self.blocksize, self.closed = callback, blocksize, False

    def start(self):
        def run():
            while not self.closed:
                out = np.zeros((self.blocksize, 1), np.float32)
                self.callback(out, self.blocksize, None, None)
                time.sleep(0.002)

        threading.Thread(target=run, daemon=True).start()

    def stop(self):
        pass

    abort = stop

    def close(self):
        self.closed = True


def _pcm16(audio: np.ndarray) -> np.ndarray:
    from leapvox.app.audio import pcm16

    return np.frombuffer(pcm16(audio), dtype="<i2")


@pytest.mark.parametrize("mode", ["ar", "spec", "windowed"])
def test_play_and_file_give_the_same_samples(tmp_path, monkeypatch, mode):
    fed = []
    original = playback.Player.feed

    def feed(self, audio, *a, **k):
        fed.append(np.array(audio, copy=True))
        return original(self, audio, *a, **k)

    monkeypatch.setattr(playback, "sounddevice_stream", _SoundCard)
    monkeypatch.setattr(playback, "output_devices", lambda: [playback.OutputDevice(0, "fake", 1, 24000.0, True)])
    monkeypatch.setattr(playback.Player, "feed", feed)
    args = ["speak", TEXT, "--mode", mode, *DEMO_ARGS]
    assert main([*args, "--play", "--codes", str(tmp_path / "play.json")]) == 0
    assert main([*args, "-o", str(tmp_path / "x.wav"), "--codes", str(tmp_path / "file.json")]) == 0
    wav, sr = sf.read(tmp_path / "x.wav", dtype="int16")
    played = np.concatenate(fed)
    assert sr == 24000 and len(wav) > 2 * 1920 and len(played) == len(wav)
    assert np.array_equal(_pcm16(played), wav)
    assert json.loads((tmp_path / "play.json").read_text()) == json.loads((tmp_path / "file.json").read_text())


def test_stdout_and_file_are_the_same_wav(tmp_path):
    run = [sys.executable, "-m", "leapvox.app.cli", "speak", TEXT, *DEMO_ARGS]
    piped = subprocess.run([*run, "-o", "-"], capture_output=True, timeout=120, check=True).stdout
    subprocess.run([*run, "-o", str(tmp_path / "x.wav")], capture_output=True, timeout=120, check=True)
    on_disk = (tmp_path / "x.wav").read_bytes()
    assert piped[44:] == on_disk[44:] and len(on_disk) > 44  # the same samples
    a, _ = sf.read(tmp_path / "x.wav")
    b, _ = sf.read(__import__("io").BytesIO(piped))  # a pipe keeps the streaming header: read to the end
    assert np.array_equal(a, b)
    with open(tmp_path / "redirected.wav", "wb") as f:  # a redirected stdout can seek: real sizes in the header
        subprocess.run([*run, "-o", "-"], stdout=f, timeout=120, check=True)
    assert (tmp_path / "redirected.wav").read_bytes() == on_disk


def test_synthesize_is_the_stream_joined():
    from leapvox.models.load import load_model

    m = load_model(FIXTURES / "tiny-0b6")
    opts = replace(m.defaults, seed=3, max_frames=5)
    synth = m.synthesizer()
    chunks = list(synth.stream("One sentence. Two sentences! Three?", opts))
    result = synth.synthesize("One sentence. Two sentences! Three?", opts)
    assert np.array_equal(np.concatenate([c.audio for c in chunks]), result.audio)
    assert torch.equal(torch.cat([c.codes for c in chunks]), result.codes)
    assert result.stats.sentences == 3 and result.stats.frames == len(result.codes) == 15
    assert result.stats.stop_reason == "max_frames" and result.duration_s == pytest.approx(result.stats.audio_s)


LONG_SCRIPT = r"""
import resource, sys
from leapvox.app.cli import main
code = main(["speak", "-f", sys.argv[1], "-o", sys.argv[2], "-q", "--weights", "fp32", "--max-frames", "1",
             "--greedy"])
print("RSS_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "CODE", code)
"""


def _peak_rss(tmp_path, text: str) -> float:
    src, out = tmp_path / "in.txt", tmp_path / "out.wav"
    src.write_text(text, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread: cheaper on a shared box, and RSS is what counts
    p = subprocess.run([sys.executable, "-c", LONG_SCRIPT, str(src), str(out)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0 and "CODE 0" in p.stdout, p.stderr[-2000:]
    return float(p.stdout.split("RSS_MIB")[1].split()[0])


def test_a_100k_character_text_is_spoken_in_bounded_memory(tmp_path):
    """Sentence by sentence, one frame each (--max-frames caps each sentence): the peak RSS of a 100,000-character
    text stays within 200 MiB of a one-sentence text's (measured here: 374 MiB vs 382 MiB). One prompt of the whole
    text, as `-o` used to send, asked for an 11.8 GB allocation."""
    sentence = ("This sentence is long enough that about three hundred characters make a few of them, and it keeps "
                "going with words, clauses and more words, so that the splitter has real work to do when the whole "
                "text is far longer than any one prompt should ever be, which is the point of this test. ")
    long = sentence * (100_000 // len(sentence) + 1)
    assert len(long) >= 100_000
    short_peak = _peak_rss(tmp_path, sentence)
    long_peak = _peak_rss(tmp_path, long)
    audio, _ = sf.read(tmp_path / "out.wav")
    n = len(split_sentences(long))
    fade = round(CROSSFADE_S * 24000)
    assert n > 300 and len(audio) == n * 1920 - (n - 1) * fade  # every sentence spoke its frame, crossfaded
    assert long_peak < short_peak + 200, (short_peak, long_peak)
