"""One set of rules for options and text (engine.options): what `leapvox speak` checks before the slow model load,
what the server checks before it queues a request, and what the engine checks for everyone else; each names an
option as its user spells it (--seed on the command line, seed in a request). Warnings for flags without effect."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from leapvox.app.cli import build_parser, main
from leapvox.app.common import UsageError, check_speak, open_model, read_text, speak_options
from leapvox.app.playback import OutputDevice
from leapvox.engine.errors import InputError, LeapvoxError
from leapvox.engine.options import MODES, SEED_MAX, check_options, check_text
from leapvox.engine.text import has_words, split_sentences

from .conftest import FIXTURES

MODEL = FIXTURES / "tiny-0b6"
FAST = ["--max-frames", "2", "--greedy"]
SPEAKERS = ("aiden", "ryan", " Ryan ", "RYAN", "eric", "nobody", "", " ")
LANGUAGES = ("auto", "english", "English", "chinese", "sichuan_dialect", "klingon", "")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def lines(err: str) -> list[str]:
    assert "Traceback" not in err and "internal error" not in err, err
    return [ln for ln in err.splitlines() if ln.strip()]


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if speak gets as far as loading the model."""
    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("leapvox.app.speak.load", load)


@pytest.fixture
def stop_at_load(monkeypatch):
    """speak stops where the model would load, with this line last: what was said before it came first."""
    def load(*a, **k):
        raise LeapvoxError("stopped at the model load")

    monkeypatch.setattr("leapvox.app.speak.load", load)


def devices(monkeypatch, found):
    monkeypatch.setattr("leapvox.app.playback.output_devices", lambda: found)


SPEAKER = OutputDevice(3, "Built-in speakers", 2, 48000.0, True)


# ---- 1. the values of issue #37 item 7, refused before the model loads --------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["Hi.", "--seed", "99999999999999999999999"], "--seed must be an integer in 0..2^64-1, got 999999999999999"),
    (["Hi.", "--seed=-1"], "--seed must be an integer in 0..2^64-1, got -1"),
    (["!!! ???"], "the text has nothing to say: '!!! ???' holds no letter or digit"),
    (["\u2026 \u00bf?"], "the text has nothing to say"),
    (["Hi.", "--speaker="], "--speaker must be a speaker's name, got ''"),
])
@pytest.mark.parametrize("model", [MODEL, "/no/such/model"])
def test_bad_values_fail_before_the_load(tmp_path, capsys, no_load, argv, needle, model):
    """With a model that does not exist, the bad value is still what is reported: it was checked first."""
    code, out, err = run(capsys, "speak", *argv, "-o", tmp_path / "x.wav", "--model", model)
    assert code == 2 and out == ""
    assert lines(err) == [lines(err)[0]] and needle in lines(err)[0] and "(hint: " in err
    assert list(tmp_path.iterdir()) == []


def test_codes_folder_fails_before_the_load(tmp_path, capsys, no_load):
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--codes", tmp_path, "--model", MODEL)
    assert code == 2 and len(lines(err)) == 1 and "it is a folder" in err


@pytest.mark.parametrize("err_no", [errno.EROFS, errno.EACCES])
def test_unwritable_codes_fails_before_the_load(tmp_path, capsys, no_load, monkeypatch, err_no):
    def refuse(*a, **k):
        raise OSError(err_no, os.strerror(err_no))

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--codes", tmp_path / "c.json",
                         "--model", MODEL)
    assert code == 1 and len(lines(err)) == 1
    assert f"cannot write {tmp_path / 'c.json'}: {os.strerror(err_no)} (hint: " in err and "with --codes" in err
    assert list(tmp_path.iterdir()) == []


def test_play_without_an_output_device_fails_before_the_load(capsys, no_load, monkeypatch):
    devices(monkeypatch, [])
    code, out, err = run(capsys, "speak", "Hi.", "--play", "--model", MODEL)
    assert code == 1 and len(lines(err)) == 1
    assert "no audio output device" in err and "-o out.wav" in err and "--device" not in err


def test_play_with_an_unknown_device_fails_before_the_load(capsys, no_load, monkeypatch):
    devices(monkeypatch, [SPEAKER])
    code, out, err = run(capsys, "speak", "Hi.", "--play", "--device", "hdmi", "--model", MODEL)
    assert code == 2 and len(lines(err)) == 1 and "no output device named like 'hdmi'" in err


def test_play_and_output_without_a_device_warns_before_the_load(tmp_path, capsys, stop_at_load, monkeypatch):
    devices(monkeypatch, [])
    code, out, err = run(capsys, "speak", "Hi.", "--play", "-o", tmp_path / "x.wav", "--model", MODEL)
    assert code == 1 and lines(err) == [
        f"warning: cannot play: no audio output device (writing {tmp_path / 'x.wav'} only)",
        "leapvox: error: stopped at the model load",
    ]


def test_play_resolves_the_device_before_the_load(monkeypatch):
    from leapvox.app.playback import check_device

    devices(monkeypatch, [SPEAKER])
    assert check_device(None) is None and check_device("built-in") == 3 and check_device("3") == 3
    devices(monkeypatch, [OutputDevice(3, "Built-in speakers", 2, 48000.0, False)])
    with pytest.raises(LeapvoxError, match="no default audio output device"):
        check_device(None)
    assert check_device("3") == 3


# ---- 2. warnings for flags without effect ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags, warnings", [
    (["--window", "12"], ["--window has no effect with --mode auto (auto never runs windowed)"]),
    (["--window", "12", "--mode", "ar"], ["--window has no effect with --mode ar"]),
    (["--window", "12", "--mode", "spec"], ["--window has no effect with --mode spec"]),
    (["--greedy", "--temperature", "0.5", "--top-k", "5", "--top-p", "0.9"],
     ["--temperature has no effect with --greedy", "--top-k has no effect with --greedy",
      "--top-p has no effect with --greedy"]),
    (["--temperature", "0", "--top-k", "5"], ["--top-k has no effect with --temperature 0"]),
    (["--device", "3"], ["--device has no effect without --play"]),
    # and only those: each flag below that takes effect says nothing
    (["--window", "12", "--mode", "windowed", "--device", "3"], ["--device has no effect without --play"]),
    (["--greedy", "--repetition-penalty", "1.1", "--max-frames", "9", "--window", "4"],
     ["--window has no effect with --mode auto (auto never runs windowed)"]),
    (["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "1", "--window", "4"],
     ["--window has no effect with --mode auto (auto never runs windowed)"]),
])
def test_flags_without_effect_warn_before_the_load(tmp_path, capsys, stop_at_load, flags, warnings):
    code, out, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", MODEL, *flags)
    assert code == 1 and lines(err) == [*(f"warning: {w}" for w in warnings), "leapvox: error: stopped at the model "
                                        "load"]


def test_device_with_play_is_not_warned_of(capsys, stop_at_load, monkeypatch):
    devices(monkeypatch, [SPEAKER])
    code, out, err = run(capsys, "speak", "Hi.", "--play", "--device", "3", "--window", "4", "--model", MODEL)
    assert lines(err) == ["warning: --window has no effect with --mode auto (auto never runs windowed)",
                          "leapvox: error: stopped at the model load"]


def test_warnings_in_the_spelling_of_each_entry_point():
    from leapvox.app.common import cli_name
    from leapvox.app.serve_request import field_name

    given = {"window": 8, "mode": "spec", "greedy": True, "top_p": 0.5}
    assert check_options(given, cli_name) == ["--window has no effect with --mode spec",
                                              "--top-p has no effect with --greedy"]
    assert check_options(given, field_name) == ["window has no effect with mode spec",
                                                "top_p has no effect with greedy"]


# ---- 3. the command line and the server agree ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    """What parse_speech needs of a loaded model, from the fixture's JSON files alone."""
    from leapvox.models.checkpoint import load_config, model_defaults

    cfg = load_config(MODEL)
    return SimpleNamespace(config=cfg, defaults=model_defaults(MODEL, cfg), path=MODEL)


def cli_verdict(text: str, opts: dict) -> str | None:
    """None where `leapvox speak` goes on to load the model, else its error."""
    argv = ["speak", "--model", str(MODEL), *(f"--{k}={v}" for k, v in opts.items()), "--", text]
    try:
        args = build_parser("speak").parse_args(argv)
    except SystemExit:  # argparse: --mode not one of its choices
        return "--mode: invalid choice"
    try:
        check_speak(args, read_text(args))
        speak_options(args, open_model(args))
    except (UsageError, LeapvoxError) as e:
        return str(e)
    return None


def server_verdict(served, text: str, opts: dict):
    """None where the server queues the request, else its ApiError."""
    from leapvox.app.serve_request import ApiError, Settings, parse_speech

    req = {"model": "tiny", "input": text} | {"voice" if k == "speaker" else k: v for k, v in opts.items()}
    try:
        parse_speech(req, served, Settings("tiny"), ["wav"])
    except ApiError as e:
        return e
    return None


@pytest.mark.parametrize("text, opts, cli_says, param", [
    ("!!! ???", {}, "the text has nothing to say", "input"),
    ("Hi.", {"seed": -1}, "--seed must be", "seed"),
    ("Hi.", {"seed": 2**64}, "--seed must be", "seed"),
    ("Hi.", {"seed": SEED_MAX}, None, None),  # the server took only 0..2^63-1
    ("Hi.", {"language": "sichuan_dialect"}, "unknown language", "language"),  # the command line took dialects
    ("Hi.", {"speaker": " Ryan "}, None, None),  # the command line refused the spaces
    ("Hi.", {"speaker": ""}, "--speaker must be", "voice"),  # the command line took it as no speaker
    ("42", {"seed": SEED_MAX, "language": "English", "speaker": "RYAN", "mode": "spec"}, None, None),
    ("\u4f60\u597d", {"speaker": "eric ", "language": "chinese"}, None, None),
])
def test_cli_and_server_agree(served, text, opts, cli_says, param):
    cli, server = cli_verdict(text, opts), server_verdict(served, text, opts)
    if cli_says is None:
        assert cli is None and server is None, (cli, server)
    else:
        assert cli is not None and cli_says in cli and server is not None and server.status == 400
        assert server.param == param and "--" not in str(server)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=12) | st.sampled_from(["Hi.", "!!! ???", "\u2026", "\x1b[0m", "a\x00b", " 7 "]),
       seed=st.none() | st.integers(-2**70, 2**70) | st.sampled_from([-1, 0, 2**63, SEED_MAX, SEED_MAX + 1]),
       language=st.none() | st.sampled_from(LANGUAGES), speaker=st.none() | st.sampled_from(SPEAKERS),
       mode=st.none() | st.sampled_from([*MODES, "turbo"]))
def test_cli_and_server_give_the_same_verdict(served, text, seed, language, speaker, mode):
    assume(text != "-")  # the command line reads standard input for "-"
    opts = {k: v for k, v in dict(seed=seed, language=language, speaker=speaker, mode=mode).items() if v is not None}
    cli, server = cli_verdict(text, opts), server_verdict(served, text, opts)
    assert (cli is None) == (server is None), (cli, server and str(server))


def test_cli_and_server_build_the_same_options(served):
    """One builder (engine.options.build_options) and one validation behind both: the same values give equal
    options, validated (speaker and language resolved) before the request reaches the model."""
    from leapvox.app.serve_request import Settings, parse_speech

    args = build_parser("speak").parse_args(["speak", "--model", str(MODEL), "--seed", "7", "--language", "English",
                                             "--speaker", "Ryan", "--mode", "spec", "--", "Hi."])
    cli = speak_options(args, open_model(args))
    req = {"model": "tiny", "input": "Hi.", "voice": "Ryan", "seed": 7, "language": "English", "mode": "spec"}
    server = parse_speech(req, served, Settings("tiny"), ["wav"])[1]
    assert cli == server and (server.speaker, server.language, server.seed) == ("ryan", "english", 7)


def test_validate_checks_once_per_model_and_voice(served):
    """validate returns options it checked for this config and voice as they are (the stream validates what the
    entry point validated before the load); a changed copy, another config or a voice is checked again."""
    from dataclasses import replace

    from leapvox.engine.options import OptionError, SynthesisOptions, validate
    from leapvox.models.checkpoint import load_config

    cfg = served.config
    opts = validate(SynthesisOptions(speaker="RYAN"), cfg)
    assert validate(opts, cfg) is opts and opts.speaker == "ryan"
    with pytest.raises(OptionError, match="unknown decoding mode 'turbo'"):
        validate(replace(opts, mode="turbo"), cfg)
    again = validate(opts, load_config(MODEL))
    assert again == opts and again is not opts
    with pytest.raises(OptionError, match="needs a Base model"):
        validate(opts, cfg, voice="me")


# ---- 4. the text rule, and the engine as the source of truth -------------------------------------------------------

@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_sentences_all_have_something_to_say(text):
    parts = split_sentences(text, max_chars=40)
    assert all(has_words(p) and len(p) <= 40 for p in parts)
    assert bool(parts) == has_words(text)


def test_marks_alone_are_no_sentence():
    """The demo front end reads '"?"' as nothing: such a piece, spoken on its own, failed after earlier sentences."""
    assert split_sentences('Hello. "?" Bye now! !!! ...') == ["Hello.", "Bye now!"]


def test_the_engine_refuses_what_has_nothing_to_say():
    from leapvox.models.load import load_model

    synth = load_model(MODEL, "fp32").synthesizer()
    for text in ["!!! ???", " ... "]:
        with pytest.raises(InputError, match="has nothing to say|is empty"):
            next(synth.stream(text, synth_opts()))
    with pytest.raises(InputError, match="seed must be an integer in 0..2\\^64-1"):
        next(synth.stream("Hi.", synth_opts(seed=SEED_MAX + 1)))


def synth_opts(**kw):
    from leapvox.engine.options import SynthesisOptions

    return SynthesisOptions(max_frames=2, **kw).greedy()


def test_seed_range_is_what_torch_takes_without_aliases():
    """0..2^64-1: every seed torch.manual_seed (the official package's seeding) can hold, each spelled once; a
    negative seed there is 2^64 + seed, an alias, and past 2^64-1 torch fails (the old "internal error: Overflow")."""
    import torch

    assert torch.Generator().manual_seed(SEED_MAX).initial_seed() == SEED_MAX
    assert torch.Generator().manual_seed(-1).initial_seed() == SEED_MAX
    with pytest.raises(ValueError, match="Overflow"):
        torch.Generator().manual_seed(SEED_MAX + 1)
    with pytest.raises(InputError):
        check_options({"seed": -1})
    assert check_options({"seed": 0}) == [] and check_options({"seed": SEED_MAX}) == []


def test_text_rule():
    for ok in ["Hi", "42", "\u4f60\u597d", "\u00e9t\u00e9", "\u0661"]:
        check_text(ok)
    for bad in ["", "  ", "!!! ???", "\u2026", "-- * --", "\U0001f600"]:
        with pytest.raises(InputError):
            check_text(bad)


# ---- 5. the TUI speaks by the same text rule -----------------------------------------------------------------------

def test_tui_refuses_what_has_nothing_to_say(tmp_path):
    import asyncio

    from textual.widgets import TextArea

    from .test_tui import SIZE, make_app, until

    async def go():
        app = make_app(tmp_path, max_frames=2)
        said = []
        app.notify = lambda message, **k: said.append(message)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model is not None and not app.busy)
            app.query_one("#text", TextArea).text = "!!! ???"
            app.action_speak()
            assert not app.busy and said == ["the text has nothing to say: '!!! ???' holds no letter or digit: type "
                                             "some words first"]

    asyncio.run(go())


# ---- 6. one request: the model resolved, its config read and the options checked once -----------------------------

@pytest.mark.parametrize("flags", [("--mode", "spec", "--weights", "fp32"), ("--mode", "auto", "--weights", "auto")])
def test_one_speak_request_resolves_reads_and_validates_once(tmp_path, capsys, monkeypatch, flags):
    """One `speak --mode spec` request of two sentences on the demo model: the --model value resolved (hub.ensure)
    once, config.json and generation_config.json opened once each, the voice rule run once, and the options
    validated once (a `validate` that returns the options it was given has nothing left to check). Each was 2 to 4
    before (issue #38). `auto` without a tune profile (models.auto) adds none of them."""
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "lv"))  # no tune profile
    import collections
    import sys

    import leapvox.app
    import leapvox.engine
    import leapvox.models
    from leapvox.models.catalog import CATALOG

    ours = tuple(str(Path(m.__file__).parent) for m in (leapvox.app, leapvox.engine, leapvox.models))
    jsons = {(CATALOG["demo"].bundled / n).resolve(): n for n in ("config.json", "generation_config.json")}
    counts, tracing = collections.Counter(), [True]

    def opened(event, args):
        if tracing and event == "open" and str(args[0]).endswith("config.json") and Path(args[0]).resolve() in jsons:
            counts[jsons[Path(args[0]).resolve()]] += 1

    def calls(frame, event, arg):
        code = frame.f_code
        if code.co_name not in ("validate", "check_voice", "ensure") or not code.co_filename.startswith(ours):
            return
        if event == "call" and code.co_name != "validate":
            counts[code.co_name] += 1
        elif event == "return" and code.co_name == "validate" and arg is not frame.f_locals["opts"]:
            counts["validate"] += 1

    sys.addaudithook(opened)  # stays for the session; `tracing` turns it off
    sys.setprofile(calls)
    try:
        code = main(["speak", "Hello there. Bye now.", *flags, "--seed", "1", "--max-frames", "3",
                     "--model", "demo", "-o", str(tmp_path / "x.wav"), "-q"])
    finally:
        sys.setprofile(None)
        tracing.clear()
    assert code == 0, capsys.readouterr().err
    assert dict(counts) == {"validate": 1, "check_voice": 1, "ensure": 1, "config.json": 1, "generation_config.json": 1}
