"""`leapvox speak` on bad outputs, bad text and bad options: one line and the right exit code, before the slow model
load where that is possible, and never a temp file left behind."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import FIXTURES, one_line, run

MODEL = FIXTURES / "tiny-0b6"
FAST = ["--max-frames", "3", "--greedy"]
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the demo front end needs espeak-ng")


# ---- 1. an output that cannot be written ----------------------------------------------------------------------------

@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="running as root: chmod 0o555 does not stop root from writing (the monkeypatched "
                    "EROFS/ENOSPC tests below cover the same paths)")
def test_read_only_folder_fails_before_the_load(tmp_path, capsys, no_load):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, out, err = run(capsys, "speak", "Hi.", "-o", folder / "x.wav", "--model", MODEL, *FAST)
    finally:
        folder.chmod(0o755)
    line = one_line(err)
    assert code == 1 and out == ""
    assert line.startswith(f"leapvox: error: cannot write {folder / 'x.wav'}: ") and "(hint: " in line
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("err_no", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_temp_file_that_cannot_be_made_fails_before_the_load(tmp_path, capsys, monkeypatch, no_load, err_no):
    def mkstemp(*a, **k):
        raise OSError(err_no, os.strerror(err_no))

    monkeypatch.setattr("leapvox.models.files.tempfile.mkstemp", mkstemp)
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", MODEL, *FAST)
    line = one_line(err)
    assert code == 1 and out == ""
    assert f"cannot write {tmp_path / 'x.wav'}: {os.strerror(err_no)} (hint: " in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["write", "close"])
@pytest.mark.parametrize("err_no", [errno.ENOSPC, errno.EROFS])
def test_write_error_during_synthesis_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch, err_no, where):
    def fail(*a, **k):
        raise OSError(err_no, os.strerror(err_no))

    if where == "write":
        monkeypatch.setattr("leapvox.app.audio.WavWriter.write", fail)
    else:
        monkeypatch.setattr("leapvox.app.audio.os.fsync", fail)
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", MODEL, *FAST)
    line = one_line(err)
    assert code == 1 and out == ""
    assert line.startswith(f"leapvox: error: cannot write {tmp_path / 'x.wav'}: {os.strerror(err_no)} (hint: ")
    assert list(tmp_path.iterdir()) == []  # no .x.wav.*.part


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_full_standard_output_is_one_line():
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "leapvox.app.cli", "speak", "Hi.", "-o", "-", "--model",
                               str(MODEL), *FAST], stdout=full, stderr=subprocess.PIPE, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert "cannot write standard output: No space left on device (hint: " in one_line(err)


def test_output_that_is_a_folder_is_a_usage_error(tmp_path, capsys, no_load):
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path, "--model", MODEL, *FAST)
    assert code == 2 and "it is a folder" in one_line(err)
    assert list(tmp_path.iterdir()) == []


# ---- 2. text that is not plain text ---------------------------------------------------------------------------------

def test_nul_byte_in_the_text_file_is_a_usage_error(tmp_path, capsys, no_load):
    f = tmp_path / "n.txt"
    f.write_bytes(b"Hello\x00world.")
    code, out, err = run(capsys, "speak", "-f", f, "-o", tmp_path / "x.wav", "--model", MODEL)
    assert code == 2 and out == ""
    assert "NUL byte" in one_line(err)
    assert not (tmp_path / "x.wav").exists()


def test_non_utf8_text_file_is_a_usage_error(tmp_path, capsys, no_load):
    f = tmp_path / "latin1.txt"
    f.write_bytes("Caf\u00e9 au lait.".encode("latin-1"))
    code, out, err = run(capsys, "speak", "-f", f, "-o", tmp_path / "x.wav", "--model", MODEL)
    assert code == 2 and out == ""
    assert f"cannot read {f}: it is not UTF-8 text (byte 0xe9 at offset 3)" in one_line(err)


def test_non_utf8_standard_input_is_a_usage_error(tmp_path, capsys, monkeypatch, no_load):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Caf\xe9."), encoding="utf-8"))
    code, out, err = run(capsys, "speak", "-", "-o", tmp_path / "x.wav", "--model", MODEL)
    assert code == 2 and "cannot read standard input" in one_line(err)


def _text_args(text):
    return argparse.Namespace(file=None, text=text)


@pytest.mark.parametrize("raw, clean", [
    ("\x1b[31mRed\x1b[0m alert.", "Red alert."),
    ("\x1b[1;38;5;208mBold orange\x1b[m text.", "Bold orange text."),
    ("\x1b]0;window title\x07Hello.", "Hello."),
    ("\x1b]8;;https://example.org\x1b\\link\x1b]8;;\x1b\\ here.", "link here."),
    ("Ring\x07 the\x08 bell\x7f.", "Ring the bell."),
    ("Tabs\tand\nlines stay.", "Tabs\tand\nlines stay."),
    ("\x1b[2J\x1b[H", None),  # only escapes: empty
])
def test_control_characters_and_escapes_are_stripped(raw, clean):
    from leapvox.app.common import UsageError, read_text

    if clean is None:
        with pytest.raises(UsageError, match="empty"):
            read_text(_text_args(raw))
    else:
        assert read_text(_text_args(raw)) == clean


def test_escapes_do_not_reach_the_model(tmp_path, capsys, monkeypatch):
    from leapvox.engine.synthesis import Synthesizer

    seen, stream = [], Synthesizer.stream

    def spy(self, text, *a, **k):
        seen.append(text)
        return stream(self, text, *a, **k)

    monkeypatch.setattr(Synthesizer, "stream", spy)
    code, _, err = run(capsys, "speak", "\x1b[31mHello\x1b[0m there.\x07", "-o", tmp_path / "x.wav", "--model",
                       MODEL, *FAST)
    assert code == 0, err
    assert seen == ["Hello there."]


ESPEAK = ["espeak-ng", "-q", "-v", "en-us", "-s", "175", "-p", "50", "--ipa"]


@needs_espeak
def test_ipa_of_ordinary_text_is_unchanged():
    from leapvox.models.frontend import ipa, phoneme_string

    assert ipa("Hello there.") == "həlˈoʊ ðˈɛɹ."
    for text in ["Hello there.", "Hello, world!", "It's 3.5 km; go: now?", "Mr. Smith said no.", "-x marks it.",
                 "Line one\nline two.", "Para one.\n\nPara two.", "Ümlaut café naïve.", "Wow!?"]:
        out = subprocess.run([*ESPEAK, "--", text], capture_output=True, text=True, check=True).stdout  # argv
        clauses = [line.strip() for line in out.splitlines() if line.strip()]
        assert ipa(text) == phoneme_string(text, clauses)[0], text


@needs_espeak
def test_ipa_of_a_text_too_long_for_argv():
    from leapvox.models.frontend import ipa

    text = "Hi there." + " " * 140_000 + "Bye now."  # one argument over 128 KiB: E2BIG in argv
    assert ipa(text) == "hˈaɪ ðˈɛɹ. bˈaɪ nˈaʊ."


# ---- 3. the demo front end on text without final punctuation --------------------------------------------------------

@needs_espeak
@pytest.mark.parametrize("text, expected", [
    ("Hello there", "həlˈoʊ ðˈɛɹ"),
    ("Hello, world", "həlˈoʊ, wˈɜːld"),
    ("I paid 4", "aɪ pˈeɪd fˈoːɹ"),
    ("Hello, world.", "həlˈoʊ, wˈɜːld."),
])
def test_ipa_without_final_punctuation(text, expected):
    from leapvox.models.frontend import ipa

    assert ipa(text) == expected


@pytest.mark.parametrize("text, clauses, expected", [
    ("Hello there", ["həlˈoʊ ðˈɛɹ"], ("həlˈoʊ ðˈɛɹ", True)),
    ("Hello, world", ["həlˈoʊ", "wˈɜːld"], ("həlˈoʊ, wˈɜːld", True)),
    ("I paid 4", ["aɪ pˈeɪd fˈoːɹ"], ("aɪ pˈeɪd fˈoːɹ", True)),
    ("a b c", ["a", "b", "c"], ("a b c", False)),  # counts that fit no rule: no stray letter appended
    ("", [], ("", True)),
])
def test_phoneme_string_without_final_punctuation(text, clauses, expected):
    from leapvox.models.frontend import phoneme_string

    assert phoneme_string(text, clauses) == expected


def _as_built(text, clauses):
    """What the demo's dataset builder stored for a sentence (its sentences all end in .!?)."""
    import re

    marks = re.findall(r"[,;:.!?]+(?=\s|$)", text)
    if len(marks) == len(clauses):
        return " ".join(c + m for c, m in zip(clauses, marks, strict=True)), True
    return " ".join(clauses) + text[-1], False


@pytest.mark.parametrize("text, clauses", [
    ("Hello, world.", ["həlˈoʊ", "wˈɜːld"]),
    ("Yes; no!", ["jˈɛs", "nˈoʊ"]),
    ("Mr. Smith went home.", ["mˈɪstɚ", "smˈɪθ wɛnt hˈoʊm"]),  # espeak splits where the marks do not: unaligned
    ("3.5 apples, 2 pears?", ["θɹˈiː pɔɪnt fˈaɪv ˈæpəlz", "tˈuː pˈɛɹz"]),
    ("Wait... what?!", ["wˈeɪt", "wˈʌt"]),
])
def test_phoneme_string_keeps_the_training_data(text, clauses):
    from leapvox.models.frontend import phoneme_string

    assert phoneme_string(text, clauses) == _as_built(text, clauses)


# ---- 4. options checked before the load, --temperature 0, SIGTERM --------------------------------------------------

@pytest.mark.parametrize("flags, needle", [
    (["--temperature", "-1"], "--temperature must be >= 0, got -1"),
    (["--temperature", "nan"], "--temperature must be >= 0"),
    (["--top-k", "-2"], "--top-k must be >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
    (["--max-frames", "0"], "--max-frames must be >= 1"),
    (["--window", "0"], "--window must be >= 1"),
    (["--speaker", "nobody"], "unknown speaker 'nobody'"),
    (["--language", "klingon"], "unknown language 'klingon'"),
])
def test_bad_options_fail_before_the_load(tmp_path, capsys, no_load, flags, needle):
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", MODEL, *flags)
    assert code == 2 and out == ""
    assert needle in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_temperature_zero_is_greedy(tmp_path, capsys):
    runs = {}
    for name, flags in {"t0": ["--temperature", "0"], "greedy": ["--greedy"]}.items():
        code, _, err = run(capsys, "speak", "Hello world.", "-o", tmp_path / f"{name}.wav", "--model", MODEL,
                           "--max-frames", "4", "--codes", tmp_path / f"{name}.json", *flags)
        assert code == 0, err
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert runs["t0"] == runs["greedy"] and len(runs["t0"]) > 0


def test_sigterm_in_process_removes_the_temp_file(tmp_path, capsys, monkeypatch):
    from leapvox.engine.synthesis import Synthesizer

    stream = Synthesizer.stream

    def terminated_after_one_chunk(self, *a, **k):
        for chunk in stream(self, *a, **k):
            yield chunk
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Synthesizer, "stream", terminated_after_one_chunk)
    before = signal.getsignal(signal.SIGTERM)
    code, out, err = run(capsys, "speak", "Hello world. Second sentence. Third one.", "-o", tmp_path / "x.wav",
                         "--model", MODEL, *FAST)
    assert code == 143 and out == ""
    assert one_line(err) == "leapvox: terminated"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == before  # main() puts the handler back


@pytest.mark.parametrize("signum, code, word",
                         [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_an_import_is_a_clean_stop_not_an_internal_error(tmp_path, capsys, monkeypatch, signum, code,
                                                                           word):
    """The signal lands while a class is being made (as when torch imports a module lazily mid-synthesis): Python
    wraps what the handler raises in "RuntimeError: Error calling __set_name__", which must still stop cleanly."""
    from leapvox.engine.synthesis import Synthesizer

    stream = Synthesizer.stream

    class SignalsWhenNamed:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signum)
            time.sleep(1)  # the handler runs here, inside __set_name__

    def signalled_while_importing(self, *a, **k):
        for chunk in stream(self, *a, **k):
            yield chunk
            type("Lazy", (), {"field": SignalsWhenNamed()})

    monkeypatch.setattr(Synthesizer, "stream", signalled_while_importing)
    status, out, err = run(capsys, "speak", "Hello world. Second sentence.", "-o", tmp_path / "x.wav",
                           "--model", MODEL, *FAST)
    assert status == code and out == ""
    assert one_line(err) == f"leapvox: {word}"
    assert list(tmp_path.iterdir()) == []


STOPS = pytest.mark.parametrize("signum, code, word",
                                [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])


def signal_in_a_finalizer(monkeypatch, signum: int, after_every_chunk: bool) -> list:
    """Synthesizer.stream patched so that `signum` reaches this process while an object's __del__ runs, where Python
    drops whatever is raised ("Exception ignored in ..."): after every chunk (synthesis then goes on 50 ms: the tiny
    model's compiled layers could finish within the 10 ms before the stop is sent again; a real model's chunks take
    longer), or once after the last chunk. Returns the list each finalizer appends to."""
    from leapvox.engine.synthesis import Synthesizer

    stream, finalized = Synthesizer.stream, []

    class SignalsWhenCollected:
        def __del__(self):
            finalized.append(True)
            os.kill(os.getpid(), signum)
            time.sleep(0.5)  # the handler runs here, inside __del__

    def signalled(self, *a, **k):
        for chunk in stream(self, *a, **k):
            yield chunk
            if after_every_chunk:
                SignalsWhenCollected()  # collected at once
                time.sleep(0.05)
        if not after_every_chunk:
            SignalsWhenCollected()

    monkeypatch.setattr(Synthesizer, "stream", signalled)
    return finalized


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@STOPS
def test_a_signal_inside_a_finalizer_is_not_lost(tmp_path, capsys, monkeypatch, signum, code, word):
    """The signal lands inside a finalizer: the stop is sent again and happens where synthesis is, not swallowed
    (for SIGTERM, with every later one too, since the handler raises once)."""
    finalized = signal_in_a_finalizer(monkeypatch, signum, after_every_chunk=True)
    hook = sys.unraisablehook
    status, out, err = run(capsys, "speak", "Hello world. Second sentence. Third one.", "-o", tmp_path / "x.wav",
                           "--model", MODEL, *FAST)
    # the signal landed in a finalizer, and the stop still came (a lost one lets the command finish: status 0, a WAV)
    assert finalized
    assert status == code and out == ""
    assert one_line(err) == f"leapvox: {word}"  # no "Exception ignored in" report either
    assert list(tmp_path.iterdir()) == []
    assert sys.unraisablehook is hook  # main() puts the hook back


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@STOPS
def test_a_signal_dropped_in_a_finalizer_at_the_end_still_stops(tmp_path, capsys, monkeypatch, signum, code, word):
    """The stop is dropped in a finalizer after the last chunk, and the command finishes before the stop is sent
    again (here: the re-send waits 5 s, far longer than writing the WAV): the command still reports the stop, not
    success."""
    from leapvox.app import cli

    finalized = signal_in_a_finalizer(monkeypatch, signum, after_every_chunk=False)
    monkeypatch.setattr(cli._RESEND, "delay", 5.0)
    started = time.monotonic()
    status, out, err = run(capsys, "speak", "Hello world.", "-o", tmp_path / "x.wav", "--model", MODEL, *FAST)
    assert finalized and time.monotonic() - started < 5.0  # finished before the re-send was due
    assert status == code and out == ""
    assert err.splitlines()[-1] == f"leapvox: {word}"  # after the "wrote" line: the WAV was done when it landed
    assert "Exception ignored" not in err
    time.sleep(0.1)
    assert cli._RESEND.pending is None and not cli._RESEND.active  # nothing left to send into a later call


def test_a_sigterm_lost_in_c_code_is_still_a_clean_stop(tmp_path, capsys, monkeypatch):
    """SIGTERM lands inside C code that drops the handler's exception and raises its own (seen: safetensors'
    get_tensor under torch says "could not determine the shape of object type 'torch.storage.UntypedStorage'",
    which the loader reported as a damaged file): still "terminated", 143, no temp file."""
    from leapvox.engine.synthesis import Synthesizer

    stream = Synthesizer.stream

    def lost_in_c(self, *a, **k):
        for chunk in stream(self, *a, **k):
            yield chunk
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler raises here
            except KeyboardInterrupt:
                pass  # ... and the C code replaces it with its own error
            raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'")

    monkeypatch.setattr(Synthesizer, "stream", lost_in_c)
    status, out, err = run(capsys, "speak", "Hello world. Second sentence.", "-o", tmp_path / "x.wav",
                           "--model", MODEL, *FAST)
    assert status == 143 and out == ""
    assert one_line(err) == "leapvox: terminated"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_subprocess_exits_143_without_traceback(tmp_path):
    out = tmp_path / "x.wav"
    text = " ".join(f"Sentence number {i} is here." for i in range(200))
    proc = subprocess.Popen([sys.executable, "-m", "leapvox.app.cli", "speak", text, "-o", str(out), "--model",
                             str(MODEL), "--greedy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".x.wav.*.part")):  # made before the model loads
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr.decode()
    assert one_line(stderr.decode()) == "leapvox: terminated"
    assert stdout == b"" and list(tmp_path.iterdir()) == []
