"""Reading a reference clip for voice cloning (app/voices.py: read_reference): any length, rate, channel count, bit
depth and format gives the official package's samples or one UsageError line, never another exception; the
official samples bit for bit on the fixture clip files; --ref-clean's trimming and levelling."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leapvox.app.common import UsageError
from leapvox.app.voices import MAX_S, MIN_S, SAMPLE_RATE, TAIL_S, read_reference

from .conftest import FIXTURES

RATES = [8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000]
FORMATS = [("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24"),
           ("OGG", "VORBIS")]
FILE_CLIPS = json.loads((FIXTURES / "expected_clone.json").read_text())["file_clips"]


def signal(n: int, sr: int, channels: int, amp: float, seed: int) -> np.ndarray:
    """A tone with a syllable-rate envelope plus a little noise, the channels at different levels: [n, channels]."""
    t = np.arange(n) / sr
    mono = np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    noise = np.random.default_rng(seed).standard_normal((n, channels))
    return (amp * (mono[:, None] * (1 - 0.2 * np.arange(channels)) + 0.05 * noise)).clip(-1, 1).astype(np.float32)


@st.composite
def clips(draw):
    fmt, subtype = draw(st.sampled_from(FORMATS))
    sr, channels = draw(st.sampled_from(RATES)), draw(st.integers(1, 4))
    length = draw(st.sampled_from(["short", "about 1 s", "about 30 s"]))
    if length == "about 30 s":  # big files are slow to write: one channel, a low rate (high ones: the shorter lengths)
        sr, channels = draw(st.sampled_from(RATES[:3])), 1
    low, high = {"short": (1, sr // 10), "about 1 s": (sr // 2, 2 * sr), "about 30 s": (29 * sr, 31 * sr)}[length]
    n = draw(st.integers(low, high))
    amp = draw(st.sampled_from([0.0, 1e-5, 0.02, 0.5, 1.0]))
    return fmt, subtype, sr, channels, n, amp, draw(st.integers(0, 2**16)), draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clips())
@example(("WAV", "PCM_16", 24000, 1, 57624, 0.5, 0, False))  # 2.401 s: not whole 20 ms frames (crashed)
@example(("WAV", "PCM_16", 22050, 2, 55786, 0.5, 1, False))  # 22.05 kHz stereo of 2.53 s (crashed)
@example(("FLAC", "PCM_24", 8000, 1, 14699, 0.5, 2, False))  # 8 kHz FLAC of an odd length (crashed)
@example(("WAV", "PCM_16", 8000, 1, 607 * 8000 + 3, 0.5, 3, False))  # ten minutes (crashed)
@example(("WAV", "PCM_16", 8000, 1, 607 * 8000 + 3, 0.5, 3, True))
def test_any_clip_reads_as_the_official_samples_or_one_usage_error(tmp_path_factory, clip):
    fmt, subtype, sr, channels, n, amp, seed, clean = clip
    path = tmp_path_factory.mktemp("clip") / f"clip.{fmt.lower()}"
    sf.write(path, signal(n, sr, channels, amp, seed), sr, format=fmt, subtype=subtype)
    frames = sf.info(str(path)).frames
    try:
        wav = read_reference(path, clean)
    except UsageError as e:  # the only exception there is; a valid, audible clip is never refused
        assert clean or amp < 0.02 or not MIN_S <= frames / sr <= MAX_S, e
        return
    assert isinstance(wav, torch.Tensor) and wav.dtype == torch.float32 and wav.dim() == 1
    assert bool(wav.isfinite().all())
    if clean:  # trimmed to whole 20 ms frames of sound, then the silent tail
        tail = int(TAIL_S * SAMPLE_RATE)
        assert MIN_S <= (len(wav) - tail) / SAMPLE_RATE <= MAX_S and not wav[-tail:].any()
    else:  # all of it, resampled as librosa.resample does: ceil(n * 24000 / rate) samples
        assert MIN_S <= frames / sr <= MAX_S and len(wav) == math.ceil(frames * (SAMPLE_RATE / sr))


@pytest.mark.parametrize("name", sorted(FILE_CLIPS))
def test_clip_files_read_as_the_official_package_reads_them(name):
    """The official wrapper's 24 kHz samples of the fixture clip files (librosa.load, channel mean, librosa.resample),
    recorded as a SHA-256 of their float32 bytes: the same bits."""
    f = FILE_CLIPS[name]
    info = sf.info(str(FIXTURES / f["file"]))
    assert (info.samplerate, info.channels, info.frames) == (f["sr"], f["channels"], f["samples"])
    wav = read_reference(FIXTURES / f["file"]).numpy()
    assert wav.dtype == np.float32 and len(wav) == f["samples_24k"]
    assert hashlib.sha256(np.ascontiguousarray(wav, dtype="<f4").tobytes()).hexdigest() == f["sha256_24k"]


def test_the_default_is_the_clip_as_it_is(tmp_path):
    """No trimming, levelling or tail: a 24 kHz mono float clip comes back sample for sample, silence and all."""
    audio = np.concatenate([np.zeros(7001, np.float32), signal(36001, 24000, 1, 0.1, 0)[:, 0]])
    sf.write(tmp_path / "c.wav", audio, 24000, subtype="FLOAT")
    assert np.array_equal(read_reference(tmp_path / "c.wav").numpy(), audio)


def test_ref_clean_trims_levels_and_pads(tmp_path):
    speech = signal(2 * 44100 + 17, 44100, 2, 0.3, 0)
    clip = np.concatenate([np.zeros((44100, 2), np.float32), speech, np.zeros((22050, 2), np.float32)])
    sf.write(tmp_path / "s.ogg", clip, 44100, format="OGG")
    wav = read_reference(tmp_path / "s.ogg", clean=True).numpy()
    assert wav.dtype == np.float32
    # about 2 s of sound (trimmed to 20 ms frames) + 0.5 s of silence appended, at 24 kHz
    assert abs(len(wav) / 24000 - 2.5) < 0.05 and np.abs(wav[-12000:]).max() == 0
    body = wav[:-12000]
    assert abs(20 * np.log10(np.sqrt(np.mean(body**2))) + 20) < 0.5 and np.abs(body).max() <= 0.95


@pytest.mark.parametrize("case, message", [
    ("short", "lasts 0.6 s; it must last 1 to 30 s"),
    ("long", "lasts 31.0 s; it must last 1 to 30 s"),
    ("nan", "NaN or infinite samples"),
])
def test_refusals_of_the_default_reading(tmp_path, case, message):
    audio = {"short": signal(14400, 24000, 1, 0.5, 0), "long": signal(31 * 8000, 8000, 1, 0.5, 0),
             "nan": np.where(np.arange(24000)[:, None] == 5, np.nan, signal(24000 * 2, 12000, 1, 0.5, 0)[:24000])}
    sr = {"long": 8000, "nan": 12000}.get(case, 24000)
    sf.write(tmp_path / "c.wav", audio[case].astype(np.float32), sr, subtype="FLOAT")
    with pytest.raises(UsageError, match=message) as e:
        read_reference(tmp_path / "c.wav")
    assert ("--ref-clean" in (e.value.hint or "")) == (case == "long")  # a long clip may be mostly silence
