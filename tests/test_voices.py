"""Saved voices (models/voices.py), `leapvox voices`, reference-clip handling and `speak --voice / --ref-audio /
--instruct` through the CLI on the tiny official Base and VoiceDesign fixtures, down to the official voice-clone
output sample for sample from clip files (16-bit PCM, as `-o` writes it)."""

from __future__ import annotations

import errno
import io
import json
import os

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

from leapvox.engine.errors import InputError
from leapvox.engine.prompt import ClonedVoice
from leapvox.models import checkpoint, voices

from .conftest import FIXTURES, one_line, run

BASE = FIXTURES / "tiny-base-0b6"
DESIGN = FIXTURES / "tiny-voicedesign"
CLIP = FIXTURES / "clone_clip.wav"
FAST = ["--max-frames", "4", "--greedy"]
KEY = "tiny-base-0b6-0123456789"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


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


@pytest.mark.parametrize("case, flags, hint", [
    ("missing", [], "no such file"), ("not_audio", [], "cannot read"), ("empty", [], "is empty"),
    ("silent", [], "is silent"), ("short", [], "must last 1 to 30 s"), ("long", [], "must last 1 to 30 s"),
    ("short_sound", ["--ref-clean"], "must hold 1 to 30 s"),  # 1.6 s, but 0.6 s of sound: refused once trimmed
])
def test_bad_reference_audio_is_one_line_exit_2_before_loading(tmp_path, capsys, monkeypatch, case, flags, hint):
    paths = {
        "missing": tmp_path / "nope.wav",
        "not_audio": tmp_path / "text.wav",
        "empty": write(tmp_path, "empty.wav", np.zeros(0, np.float32)),
        "silent": write(tmp_path, "silent.wav", np.zeros(48000, np.float32)),
        "short": write(tmp_path, "short.wav", tone(0.6)),
        "short_sound": write(tmp_path, "sound.wav", np.concatenate([tone(0.6), np.zeros(24000, np.float32)])),
        "long": write(tmp_path, "long.flac", tone(31, sr=16000), sr=16000),
    }
    (tmp_path / "text.wav").write_text("not audio at all")
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err = run(capsys, "speak", "Hello.", "-o", tmp_path / "x.wav", "--model", BASE, "--ref-audio",
                       paths[case], *flags)
    assert code == 2 and hint in one_line(err)
    code, _, err = run(capsys, "voices", "add", "me", paths[case], "--model", BASE, *flags)
    assert code == 2 and hint in one_line(err)


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


# ---- the official voice-clone output from clip files ---------------------------------------------------------------

EXPECTED = json.loads((FIXTURES / "expected_clone.json").read_text())
FILE_CASES = {c["name"]: c for c in EXPECTED["cases"] if c["clip"] in EXPECTED["file_clips"]}


def official_pcm16(case: dict) -> np.ndarray:
    """The official float audio of `case` as a WAV from -o holds it: clipped to [-1, 1], 16-bit PCM."""
    wav = load_file(FIXTURES / "expected_clone.safetensors")[case["wav_key"]].numpy()
    buf = io.BytesIO()
    sf.write(buf, np.clip(wav, -1, 1), 24000, format="WAV", subtype="PCM_16")
    buf.seek(0)
    return sf.read(buf, dtype="int16")[0]


def official_run(case: dict, tmp_path, capsys, *voice) -> None:
    """speak `case`'s text in `voice` (--voice NAME or --ref-audio ...) with its settings; -o and --codes equal the
    official run's: the codes exactly, the audio sample for sample (the codec's float ~5e-6 apart can round one
    16-bit step apart)."""
    from .test_cloning import clip, frames_moved, model, tensors

    if case["kind"] == "icl":  # leapvox's encoder equals the official one on the fixtures' CPU; another CPU's kernels
        mine = model(case["checkpoint"]).clone(clip(case["clip"]), "x").ref_codes  # may move near-tie codes
        official = tensors()[f"enc/{case['clip']}"]
        if not torch.equal(mine, official):
            pytest.skip(f"this CPU moves {frames_moved(mine, official):.0%} of the official encoder frames")
    sampling = ["--temperature", case["temperature"], "--top-k", case["top_k"], "--top-p", case["top_p"],
                "--repetition-penalty", case["repetition_penalty"]] if case["do_sample"] else ["--greedy"]
    code, _, err = run(capsys, "speak", case["text"], *voice, "-o", tmp_path / "out.wav", "--codes",
                       tmp_path / "codes.json", "--model", FIXTURES / case["checkpoint"], "--weights", "fp32",
                       "--language", case["language"], "--text-layout", case["text_layout"], "--seed", case["seed"],
                       "--max-frames", case["max_new_tokens"] - 1, "--no-guard", *sampling)
    assert code == 0, err
    assert json.loads((tmp_path / "codes.json").read_text()) == case["codes"]
    got, want = sf.read(tmp_path / "out.wav", dtype="int16")[0], official_pcm16(case)
    assert len(got) == len(want) == case["wav_num_samples"]  # ICL: cut where the official cut falls
    assert np.abs(got.astype(np.int32) - want).max() <= 1


@pytest.mark.parametrize("name", sorted(FILE_CASES))
def test_voices_add_then_speak_voice_is_the_official_clone(tmp_path, capsys, name):
    c = FILE_CASES[name]
    text = ["--text", c["ref_text"]] if c["kind"] == "icl" else []
    clip = FIXTURES / EXPECTED["file_clips"][c["clip"]]["file"]
    code, _, err = run(capsys, "voices", "add", "v", clip, *text, "--model", FIXTURES / c["checkpoint"], "--weights",
                       "fp32")
    assert code == 0, err
    official_run(c, tmp_path, capsys, "--voice", "v")


@pytest.mark.parametrize("name", sorted(FILE_CASES))
def test_speak_ref_audio_is_the_official_clone(tmp_path, capsys, name):
    c = FILE_CASES[name]
    text = ["--ref-text", c["ref_text"]] if c["kind"] == "icl" else []
    official_run(c, tmp_path, capsys, "--ref-audio", FIXTURES / EXPECTED["file_clips"][c["clip"]]["file"], *text)


def test_ref_clean_is_recorded_and_changes_the_voice(tmp_path, capsys):
    clip = FIXTURES / EXPECTED["file_clips"]["file_22k"]["file"]
    for name, flags in (("plain", []), ("clean", ["--ref-clean"])):
        assert run(capsys, "voices", "add", name, clip, "--model", BASE, *flags)[0] == 0
    shown = {name: run(capsys, "voices", "show", name, "--model", BASE)[1] for name in ("plain", "clean")}
    assert "clip: as the official package" in shown["plain"] and "clip: cleaned (--ref-clean" in shown["clean"]
    key = voices.model_key(BASE)
    assert [v.cleaned for v in voices.list_voices(key)] == [True, False]  # clean, plain
    assert not torch.equal(voices.load_voice(key, "plain").xvector, voices.load_voice(key, "clean").xvector)


def test_voice_files_from_before_ref_clean_read_as_cleaned():
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = voices.save_voice(KEY, "old", voice())
    with safe_open(str(path), framework="pt") as f:  # rewritten as saved before the "clip" key existed
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 - not a mapping
    del meta["clip"]
    save_file(tensors, str(path), metadata=meta)
    assert voices.voice_info(KEY, "old").cleaned
    assert not voices.voice_info(KEY, voices.save_voice(KEY, "new", voice()).stem).cleaned


@pytest.mark.parametrize("err_no", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_voice_folder_that_cannot_be_written_is_one_line_before_loading(tmp_path, capsys, monkeypatch, err_no):
    """A read-only LEAPVOX_HOME (or a full disk): one line with a hint, exit 1, before the model loads."""
    def refuse(*a, **k):
        raise OSError(err_no, os.strerror(err_no))

    monkeypatch.setattr("leapvox.models.voices.tempfile.TemporaryFile", refuse)
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err = run(capsys, "voices", "add", "me", CLIP, "--model", BASE)
    line = one_line(err)
    assert code == 1 and f"cannot save voices in {voices.voices_dir(voices.model_key(BASE))}: {os.strerror(err_no)}" \
        in line and "(hint: " in line


def test_home_that_is_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "file" / "home"))  # not a folder: mkdir fails (as root too)
    code, _, err = run(capsys, "voices", "add", "me", CLIP, "--model", BASE)
    assert code == 1 and "cannot save voices in" in one_line(err)


def test_voice_that_cannot_be_removed_is_one_line(capsys, monkeypatch):
    path = voices.save_voice(voices.model_key(BASE), "me", voice())

    def unlink(self, missing_ok=False):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(voices.Path, "unlink", unlink)
    code, _, err = run(capsys, "voices", "rm", "me", "--model", BASE, "--yes")
    assert code == 1 and f"cannot remove {path}: {os.strerror(errno.EROFS)} (hint: " in one_line(err)


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
    (["--model", FIXTURES / "tiny-0b6", "--ref-clean"], "--ref-clean goes with --ref-audio"),
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
