"""Saved voices (models/voices.py), `leapvox voices`, reference-clip handling and `speak --voice / --ref-audio /
--instruct` through the CLI on the tiny official Base and VoiceDesign fixtures."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from leapvox.app.cli import main
from leapvox.engine.errors import InputError
from leapvox.engine.prompt import ClonedVoice
from leapvox.models import checkpoint, voices

from .conftest import FIXTURES

BASE = FIXTURES / "tiny-base-0b6"
DESIGN = FIXTURES / "tiny-voicedesign"
CLIP = FIXTURES / "clone_clip.wav"
FAST = ["--max-frames", "4", "--greedy"]
KEY = "tiny-base-0b6-0123456789"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def voice(icl: bool = True) -> ClonedVoice:
    codes = torch.randint(0, 64, (12, 16)) if icl else None
    return ClonedVoice(torch.randn(64), codes, "Hello there." if icl else None)


# ---- the store ----------------------------------------------------------------------------------------------------


def test_store_round_trip_and_listing():
    v = voice()
    path = voices.save_voice(KEY, "me", v, source="clip.wav")
    voices.save_voice(KEY, "plain", voice(icl=False))
    assert path.parent == voices.voices_dir(KEY) and not list(path.parent.glob(".*"))  # no temp files left
    back = voices.load_voice(KEY, "me", hidden=64)
    assert torch.equal(back.xvector, v.xvector) and torch.equal(back.ref_codes, v.ref_codes)
    assert back.ref_text == "Hello there." and back.icl
    listed = {i.name: i for i in voices.list_voices(KEY)}
    assert listed["me"].mode == "icl" and listed["me"].frames == 12 and listed["me"].source == "clip.wav"
    assert listed["plain"].mode == "xvector" and not voices.load_voice(KEY, "plain").icl
    with pytest.raises(InputError, match="exists"):
        voices.save_voice(KEY, "me", v)
    voices.remove_voice(KEY, "me")
    assert [i.name for i in voices.list_voices(KEY)] == ["plain"]
    with pytest.raises(voices.VoiceError, match="no saved voice"):
        voices.load_voice(KEY, "me")


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "", "x" * 65, "sp ace", "dot.name", "~me"])
def test_bad_names_never_touch_the_file_system(name, home):
    for call in (lambda: voices.save_voice(KEY, name, voice()), lambda: voices.load_voice(KEY, name),
                 lambda: voices.remove_voice(KEY, name)):
        with pytest.raises(InputError, match="invalid voice name"):
            call()
    assert not home.exists()


def test_damaged_and_mismatched_files_are_one_clear_error():
    path = voices.save_voice(KEY, "me", voice())
    with pytest.raises(voices.VoiceError, match="64-wide x-vector; this model needs 96"):
        voices.load_voice(KEY, "me", hidden=96)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(voices.VoiceError, match="damaged") as e:
        voices.load_voice(KEY, "me")
    assert "voices rm me" in e.value.hint
    assert [(i.name, i.mode) for i in voices.list_voices(KEY)] == [("me", "damaged")]


# ---- reference clips ----------------------------------------------------------------------------------------------


def write(tmp_path, name, audio, sr=24000, **kw):
    path = tmp_path / name
    sf.write(path, audio, sr, **kw)
    return path


def tone(seconds, sr=24000, amp=0.3):
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


@pytest.mark.parametrize("case, hint", [
    ("missing", "no such file"), ("not_audio", "cannot read"), ("empty", "is empty"), ("silent", "is silent"),
    ("short", "must hold 1 to 30 s"), ("long", "must hold 1 to 30 s"),
])
def test_bad_reference_audio_is_one_line_exit_2_before_loading(tmp_path, capsys, monkeypatch, case, hint):
    paths = {
        "missing": tmp_path / "nope.wav",
        "not_audio": tmp_path / "text.wav",
        "empty": write(tmp_path, "empty.wav", np.zeros(0, np.float32)),
        "silent": write(tmp_path, "silent.wav", np.zeros(48000, np.float32)),
        "short": write(tmp_path, "short.wav", np.concatenate([tone(0.6), np.zeros(24000, np.float32)])),
        "long": write(tmp_path, "long.flac", tone(31, sr=16000), sr=16000),
    }
    (tmp_path / "text.wav").write_text("not audio at all")
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err = run(capsys, "speak", "Hello.", "-o", tmp_path / "x.wav", "--model", BASE, "--ref-audio",
                       paths[case])
    assert code == 2 and hint in one_line(err)
    code, _, err = run(capsys, "voices", "add", "me", paths[case], "--model", BASE)
    assert code == 2 and hint in one_line(err)


def test_reference_is_mixed_resampled_trimmed_levelled_and_padded(tmp_path):
    from leapvox.app.voices import read_reference

    speech = tone(2.0, sr=44100)
    stereo = np.stack([speech, 0.5 * speech], axis=1)
    clip = np.concatenate([np.zeros((44100, 2), np.float32), stereo, np.zeros((22050, 2), np.float32)])
    wav = read_reference(write(tmp_path, "s.ogg", clip, sr=44100, format="OGG")).numpy()
    assert wav.dtype == np.float32
    # 2 s of sound (trimmed to 20 ms frames) + 0.5 s of silence appended, at 24 kHz
    assert abs(len(wav) / 24000 - 2.5) < 0.05 and np.abs(wav[-12000:]).max() == 0
    body = wav[:-12000]
    assert abs(20 * np.log10(np.sqrt(np.mean(body**2))) + 20) < 0.5 and np.abs(body).max() <= 0.95


# ---- the CLI on the tiny Base / VoiceDesign fixtures --------------------------------------------------------------


def test_voices_add_list_show_rm_and_speak_in_every_mode(tmp_path, capsys, monkeypatch):
    calls = []
    real = checkpoint.load_encoders
    monkeypatch.setattr(checkpoint, "load_encoders", lambda folder: calls.append(folder) or real(folder))
    code, out, err = run(capsys, "voices", "add", "me", CLIP, "--text", "Hello world, this is a test.", "--model",
                         BASE, "--weights", "fp32")
    assert code == 0 and out == "" and "saved voice 'me' (ICL" in err and len(calls) == 1
    code, out, _ = run(capsys, "voices", "list", "--model", BASE)
    assert code == 0 and out.startswith("me\tICL")
    code, out, _ = run(capsys, "voices", "show", "me", "--model", BASE)
    assert code == 0 and "transcript: Hello world, this is a test." in out and "frames" in out
    wavs = {}
    for mode in ("ar", "spec", "windowed"):
        out_wav = tmp_path / f"{mode}.wav"
        code, _, err = run(capsys, "speak", "--voice", "me", "Hello.", "-o", out_wav, "--model", BASE, "--mode", mode,
                           "--weights", "fp32", *FAST)
        assert code == 0, err
        wavs[mode], sr = sf.read(out_wav)
        assert sr == 24000 and 0 < len(wavs[mode]) <= 4 * 1920
    assert len(calls) == 1  # speaking with a saved voice encodes nothing again
    assert np.array_equal(wavs["ar"], wavs["spec"])  # greedy: spec verifies exactly what ar would pick
    code, _, err = run(capsys, "voices", "add", "me", CLIP, "--model", BASE)
    assert code == 2 and "exists" in one_line(err)
    code, _, err = run(capsys, "voices", "rm", "me", "--model", BASE)  # not a terminal: no silent deletion
    assert code == 2 and "without confirmation" in one_line(err)
    code, _, err = run(capsys, "voices", "rm", "me", "--model", BASE, "--yes")
    assert code == 0 and "removed" in err
    code, _, err = run(capsys, "speak", "--voice", "me", "Hello.", "-o", tmp_path / "y.wav", "--model", BASE)
    assert code == 2 and "no saved voice 'me'" in one_line(err)


def test_speak_ref_audio_equals_the_saved_voice(tmp_path, capsys):
    common = ["Hello.", "--model", BASE, "--weights", "fp32", *FAST]
    assert run(capsys, "speak", "--ref-audio", CLIP, "-o", tmp_path / "a.wav", *common)[0] == 0
    assert run(capsys, "voices", "add", "x", CLIP, "--model", BASE)[0] == 0
    assert run(capsys, "speak", "--voice", "x", "-o", tmp_path / "b.wav", *common)[0] == 0
    assert np.array_equal(sf.read(tmp_path / "a.wav")[0], sf.read(tmp_path / "b.wav")[0])


def test_damaged_saved_voice_via_cli(capsys, tmp_path):
    assert run(capsys, "voices", "add", "me", CLIP, "--model", BASE)[0] == 0
    path = voices.voices_dir(voices.model_key(BASE)) / "me.safetensors"
    path.write_bytes(b"garbage")
    code, _, err = run(capsys, "speak", "--voice", "me", "Hello.", "-o", tmp_path / "x.wav", "--model", BASE)
    assert code == 1 and "damaged" in one_line(err) and not (tmp_path / "x.wav").exists()
    assert run(capsys, "voices", "rm", "me", "--model", BASE, "--yes")[0] == 0 and not path.exists()


@pytest.mark.parametrize("argv, message", [
    (["--model", FIXTURES / "tiny-0b6", "--voice", "me"], "needs a Base model"),
    (["--model", DESIGN, "--ref-audio", CLIP], "needs a Base model"),
    (["--model", BASE, "--ref-audio", CLIP, "--instruct", "calm"], "takes no --instruct"),
    (["--model", BASE, "--speaker", "vivian", "--ref-audio", CLIP], "no built-in speakers"),
    (["--model", BASE], "speaks in a cloned voice"),
    (["--model", BASE, "--voice", "a", "--ref-audio", CLIP], "not both"),
    (["--model", BASE, "--voice", "a", "--ref-text", "hi"], "--ref-text goes with --ref-audio"),
    (["--model", BASE, "--voice", "../x"], "invalid voice name"),
    (["--model", BASE, "--ref-audio", CLIP, "--ref-text", " "], "--ref-text is empty"),
])
def test_wrong_options_for_the_model_type_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err = run(capsys, "speak", "Hello.", "-o", tmp_path / "x.wav", *argv)
    assert code == 2 and message in one_line(err)


def test_voices_on_a_custom_voice_model_exit_2(capsys):
    code, _, err = run(capsys, "voices", "list", "--model", FIXTURES / "tiny-0b6")
    assert code == 2 and "belong to Base models" in one_line(err)


def test_voice_design_instruct_through_the_cli(tmp_path, capsys):
    out = tmp_path / "d.wav"
    code, _, err = run(capsys, "speak", "--instruct", "A calm voice, speak slowly and happily.", "Hello world.",
                       "-o", out, "--model", DESIGN, "--weights", "fp32", *FAST)
    assert code == 0, err
    assert 0 < len(sf.read(out)[0]) <= 4 * 1920


# ---- the TUI's voice picker ---------------------------------------------------------------------------------------


def test_tui_lists_saved_voices_of_a_base_model_and_speaks_in_one(tmp_path, capsys):
    import asyncio
    from dataclasses import replace

    from textual.widgets import Button, Select

    from leapvox.app.tui.app import LeapvoxApp
    from leapvox.app.tui.history import History
    from leapvox.models.load import load_model

    from .test_tui import fake_players, keys, until

    assert run(capsys, "voices", "add", "me", CLIP, "--text", "Hello world, this is a test.", "--model", BASE)[0] == 0
    model = load_model(BASE)
    app = LeapvoxApp(model=model, options=replace(model.defaults, seed=1, max_frames=3).greedy(),
                     player_factory=fake_players([]), save_dir=tmp_path)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
            sel = app.query_one("#speaker", Select)
            assert sel.value == "me"
            await pilot.press(*keys("Hello."))
            await pilot.click("#speak")
            history = app.query_one(History)
            await until(pilot, lambda: len(history.utterances) == 1)
            return history.utterances[0]

    u = asyncio.run(go())
    assert u.speaker == "me" and 1 <= u.stats.frames <= 3 and len(u.audio) == u.stats.frames * 1920
