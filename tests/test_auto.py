"""`--mode auto` and `--weights auto` follow the model's tune profile on this machine (models.auto, issue #39): the
profile's decision when it is fresh and runs here, today's auto (ar, resolve_weights("auto")) otherwise, each time
saying why; fixed modes and formats never change. Profiles are written here with models.profile (as `leapvox tune`
writes them) under an isolated LEAPVOX_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapvox.app.common import WEIGHT_CHOICES
from leapvox.engine.fast.quant import format_unavailable_reason, resolve_weights
from leapvox.engine.options import MODE_CHOICES, MODES, WEIGHT_FORMATS
from leapvox.models import auto
from leapvox.models.catalog import CATALOG
from leapvox.models.checkpoint import load_checkpoint
from leapvox.models.paths import model_key
from leapvox.models.profile import (
    STAGES,
    Decision,
    Profile,
    fingerprint,
    machine_id,
    profile_path,
    save_profile,
    versions,
)

from .conftest import FIXTURES, run

TINY = FIXTURES / "tiny-0b6"
DEMO = CATALOG["demo"].bundled
# what --weights auto means without a profile for these narrow models (TINY 64 wide, the demo 192): fp32
TODAY = "fp32"
WHY = "spec: 2.4 tokens/call, 1.6x the predictor's speed here"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """leapvox's folders (and so its profiles) under tmp_path; no $LEAPVOX_MODEL."""
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "lv"))
    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    return tmp_path / "lv"


def write_profile(folder: Path, mode: str = "spec", weights: str = "int8", *, done: bool = True, **fields) -> Path:
    """A profile as `leapvox tune` leaves it for the model in `folder` on this machine; `fields` override its
    recorded fingerprint, machine, versions, offsets_path, tree_path."""
    p = Profile(model_key=model_key(folder), fingerprint=fingerprint(folder), machine=machine_id(),
                versions=versions(), threads=torch.get_num_threads(), created="2026-12-01T00:00:00",
                stages_done=list(STAGES if done else STAGES[:2]),
                decision=Decision(mode, weights, WHY) if done else None)
    for k, v in fields.items():
        setattr(p, k, v)
    return save_profile(profile_path(folder), p)


# ---- the choice ------------------------------------------------------------------------------------------------

def test_without_a_profile_auto_is_what_it_was():
    c = auto.choose(TINY, "auto", "auto", name="tiny")
    assert (c.mode, c.weights, c.source) == ("ar", TODAY, "default")
    assert c.why == "no tune profile here; leapvox tune tiny makes one"
    assert c.line() == f"mode auto -> ar, weights auto -> {TODAY} (no tune profile here; leapvox tune tiny makes one)"


def test_without_a_profile_auto_weights_follow_the_talkers_width(tmp_path):
    """fp32 below quant.NARROW_HIDDEN (8-bit formats only slow such small products), else what auto is for any
    model here; a config that does not say (or does not read) gets the latter too."""
    from leapvox.engine.fast.quant import NARROW_HIDDEN

    assert resolve_weights("auto", 192) == resolve_weights("auto", NARROW_HIDDEN - 1) == "fp32"
    wide = resolve_weights("auto", NARROW_HIDDEN)
    assert wide == resolve_weights("auto") == resolve_weights("auto", 2048) and wide in ("w8a8", "int8")
    assert resolve_weights("bf16", 64) == "bf16" and resolve_weights("w8a8", 64) == "w8a8"  # never a fixed format
    assert auto.auto_weights(TINY) == auto.auto_weights(DEMO) == TODAY
    for name, config in (("wide", {"talker_config": {"hidden_size": 1024}}), ("silent", {"talker_config": {}}),
                         ("broken", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{" if config is None else json.dumps(config))
        assert auto.auto_weights(tmp_path / name) == wide, name
    assert load_checkpoint(TINY, weights="auto").weights == "fp32"  # the library's auto: the same rule


def test_a_fresh_profile_is_followed():
    write_profile(TINY, "spec", "int8")
    c = auto.choose(TINY, "auto", "auto")
    assert (c.mode, c.weights, c.source) == ("spec", "int8", "profile") and c.why == f"tune profile: {WHY}"


@pytest.mark.parametrize("field, value, reason", [
    ("fingerprint", "0123456789abcdef", "its profile is stale: it was made for other weights"),
    ("versions", {"leapvox": "0.0.1", "torch": torch.__version__}, "it was made with leapvox 0.0.1 (now "),
    ("versions", {"leapvox": versions()["leapvox"], "torch": "1.0"}, f"with torch 1.0 (now {torch.__version__})"),
    ("machine", "Some Other CPU [deadbeef]", "it was made on another CPU (Some Other CPU [deadbeef])"),
])
def test_a_stale_profile_is_not_followed_and_says_why(field, value, reason):
    write_profile(TINY, "spec", "int8", **{field: value})
    c = auto.choose(TINY, "auto", "auto")
    assert (c.mode, c.weights, c.source) == ("ar", TODAY, "default")
    assert c.why.startswith("tune profile not used: ") and reason in c.why and "rerun leapvox tune" in c.why


def test_an_unfinished_profile_is_not_followed():
    write_profile(TINY, done=False)
    c = auto.choose(TINY, "auto", "auto")
    assert (c.mode, c.weights) == ("ar", TODAY) and "did not finish (frames, offsets done)" in c.why


def test_a_format_that_does_not_run_here_falls_back_saying_so(monkeypatch):
    write_profile(TINY, "spec", "w4a8")
    why = "it needs leapvox's compiled CPU kernel, which is unavailable"
    monkeypatch.setattr(auto, "format_unavailable_reason", lambda w: why if w == "w4a8" else None)
    c = auto.choose(TINY, "auto", "auto")
    assert (c.mode, c.weights, c.source) == ("spec", TODAY, "fallback")  # the mode still follows the profile
    assert c.why == (f"tune profile: {WHY}; but its w4a8 does not run here (it needs leapvox's compiled CPU kernel, "
                     f"which is unavailable), so {TODAY}")


def test_spec_whose_offsets_are_gone_falls_back_to_ar(tmp_path):
    offsets, tree = tmp_path / "offsets.safetensors", tmp_path / "tree.json"
    offsets.write_bytes(b"x")
    tree.write_text("{}")
    write_profile(TINY, "spec", "int8", offsets_path=str(offsets), tree_path=str(tree))
    assert auto.choose(TINY).mode == "spec"  # both there
    tree.unlink()
    c = auto.choose(TINY, name="tiny")
    assert (c.mode, c.weights, c.source) == ("ar", "int8", "fallback")
    assert f"but its spec tree file {tree} is gone, so ar (rerun leapvox tune tiny)" in c.why


def test_fixed_choices_are_never_changed():
    write_profile(TINY, "spec", "int8")
    assert auto.choose(TINY, "ar", "fp32") == auto.Choice("ar", "fp32", "", "fixed", "ar", "fp32")
    assert auto.choose(TINY, "ar", "fp32").line() == ""
    c = auto.choose(TINY, "ar", "auto")  # each part on its own: the format still follows the profile
    assert (c.mode, c.weights) == ("ar", "int8") and c.line() == f"weights auto -> int8 (tune profile: {WHY})"
    c = auto.choose(TINY, "windowed", "bf16")
    assert (c.mode, c.weights, c.source) == ("windowed", "bf16", "fixed")


def test_another_backend_does_not_follow_a_cpu_profile():
    write_profile(TINY, "spec", "int8")
    c = auto.choose(TINY, "auto", "auto", backend="ane")
    assert (c.mode, c.weights, c.source) == ("ar", TODAY, "default")
    assert c.why == "the tune profile measures the cpu backend, this is ane"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(MODE_CHOICES), weights=st.sampled_from(WEIGHT_CHOICES),
       decided=st.none() | st.tuples(st.sampled_from(["ar", "spec", "windowed", "turbo"]),
                                     st.sampled_from([*WEIGHT_FORMATS, "fp8"])),
       stale=st.booleans(), backend=st.sampled_from(["cpu", "ane"]))
def test_every_choice_runs_here_and_keeps_what_was_fixed(mode, weights, decided, stale, backend):
    """Whatever was asked and whatever the profile says: a real mode (never windowed by auto), an auto format that
    runs here (a fixed one is the user's to check), a fixed part unchanged, the profile's decision taken exactly
    when it is fresh, on cpu, and runs here, and a reason exactly when something was auto."""
    path = profile_path(TINY)
    path.unlink(missing_ok=True)
    if decided:
        write_profile(TINY, *decided, **({"fingerprint": "stale"} if stale else {}))
    c = auto.choose(TINY, mode, weights, backend)
    assert c.mode in MODES and c.weights in WEIGHT_FORMATS
    follow = decided is not None and not stale and backend == "cpu"
    if mode == "auto":
        assert c.mode in ("ar", "spec")
        assert c.mode == (decided[0] if follow and decided[0] in ("ar", "spec") else "ar")
    else:
        assert c.mode == mode
    if weights == "auto":
        runs = follow and decided[1] in WEIGHT_FORMATS and format_unavailable_reason(decided[1]) is None
        assert c.weights == (decided[1] if runs else TODAY) and format_unavailable_reason(c.weights) is None
    else:
        assert c.weights == weights
    assert bool(c.why) == bool(c.line()) == ("auto" in (mode, weights))


# ---- speak ----------------------------------------------------------------------------------------------------

SPEAK = ("speak", "Hello there.", "--model", "demo", "--seed", "11", "--max-frames", "6")


def speak(capsys, tmp_path, name: str, *flags) -> tuple[np.ndarray, str]:
    """`leapvox speak` on the demo -> (its samples, its summary line)."""
    out = tmp_path / f"{name}.wav"
    code, _, err = run(capsys, *SPEAK, "-o", out, *flags)
    assert code == 0, err
    return sf.read(out, dtype="float32")[0], err.strip().splitlines()[-1]


def test_auto_without_a_profile_speaks_as_ar(tmp_path, capsys):
    """The default mode: exactly `--mode ar` (same samples for a seed) in today's format, and it says why."""
    default, said = speak(capsys, tmp_path, "default")
    ar, said_ar = speak(capsys, tmp_path, "ar", "--mode", "ar")
    assert np.array_equal(default, ar) and len(ar)
    assert said.endswith(f"; mode auto -> ar, weights auto -> {TODAY} (no tune profile here; leapvox tune demo makes "
                         "one)")
    assert said_ar.endswith(f"; weights auto -> {TODAY} (no tune profile here; leapvox tune demo makes one)")


def test_a_fresh_profile_makes_auto_run_spec_in_int8(tmp_path, capsys):
    write_profile(DEMO, "spec", "int8")
    tuned, said = speak(capsys, tmp_path, "auto", "--mode", "auto", "--codes", tmp_path / "auto.json")
    fixed, said_fixed = speak(capsys, tmp_path, "spec", "--mode", "spec", "--weights", "int8", "--codes",
                              tmp_path / "spec.json")
    assert said.endswith(f"; mode auto -> spec, weights auto -> int8 (tune profile: {WHY})")
    assert "auto" not in said_fixed  # nothing was auto: nothing to explain
    assert np.array_equal(tuned, fixed)  # what it says it ran is what ran: spec's samples, in int8
    assert json.loads((tmp_path / "auto.json").read_text()) == json.loads((tmp_path / "spec.json").read_text())


def test_fixed_mode_and_weights_ignore_the_profile(tmp_path, capsys):
    before, _ = speak(capsys, tmp_path, "before", "--mode", "ar", "--weights", "fp32")
    write_profile(DEMO, "spec", "int8")
    after, said = speak(capsys, tmp_path, "after", "--mode", "ar", "--weights", "fp32")
    assert np.array_equal(before, after) and "auto" not in said


def test_a_stale_profile_is_named_in_the_summary(tmp_path, capsys):
    write_profile(DEMO, "spec", "int8", machine="Another CPU [00000000]")
    _, said = speak(capsys, tmp_path, "stale", "--weights", "fp32")
    assert said.endswith("; mode auto -> ar (tune profile not used: its profile is stale: it was made on another CPU "
                         "(Another CPU [00000000]); rerun leapvox tune)")


# ---- compare, batch, serve, doctor ----------------------------------------------------------------------------

def test_compare_has_an_auto_row(tmp_path, capsys):
    write_profile(TINY, "spec", "fp32")
    out = tmp_path / "cmp"
    code, stdout, err = run(capsys, "compare", "Hello there.", "--model", TINY, "--out", out, "--max-frames", "3",
                            "--modes", "ar,spec,auto")
    assert code == 0, err
    rows = stdout.strip().splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["ar", "spec", "auto"] and rows[2].startswith("auto (spec) ")
    assert f"mode auto -> spec, weights auto -> fp32 (tune profile: {WHY})" in err
    record = json.loads((out / "compare.json").read_text())
    assert record["modes"]["auto"]["mode"] == "spec" and record["modes"]["auto"]["why"] == f"tune profile: {WHY}"
    assert record["weights"] == "fp32" and record["auto"]["source"] == "profile"
    assert np.array_equal(sf.read(out / "auto.wav")[0], sf.read(out / "spec.wav")[0])  # the same seed, the same run


def test_compare_without_a_profile_shows_auto_as_ar(tmp_path, capsys):
    code, stdout, err = run(capsys, "compare", "Hi.", "--model", TINY, "--out", tmp_path, "--max-frames", "2",
                            "--weights", "fp32")
    assert code == 0, err
    assert [r.split()[0] for r in stdout.strip().splitlines()[1:]] == [*MODES, "auto"]
    assert "auto (ar) " in stdout and "mode auto -> ar (no tune profile here" in err


@pytest.mark.parametrize("profile", [None, ("spec", "fp32")])
def test_batch_manifest_records_the_resolved_mode_and_weights(tmp_path, capsys, profile):
    if profile:
        write_profile(TINY, *profile)
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a", "text": "Hi there."}\n{"id": "b", "text": "Bye.", "mode": "ar"}\n')
    code, _, err = run(capsys, "batch", items, "--out", tmp_path / "out", "--model", TINY, "--max-frames", "2",
                       "--threads", "1")
    assert code == 0, err
    entries = {e["id"]: e for e in map(json.loads, (tmp_path / "out" / "manifest.jsonl").read_text().splitlines())}
    mode, weights = profile or ("ar", TODAY)
    assert (entries["a"]["mode"], entries["a"]["weights"]) == (mode, weights)  # not "auto"
    assert (entries["b"]["mode"], entries["b"]["weights"]) == ("ar", weights)  # its own mode stays
    assert entries["a"]["item"] == {"id": "a", "text": "Hi there.", "options": {"seed": entries["a"]["item"]
                                                                                ["options"]["seed"]}}
    assert f"mode auto -> {mode}, weights auto -> {weights}" in err
    code, _, err = run(capsys, "batch", items, "--out", tmp_path / "out", "--model", TINY, "--max-frames", "2",
                       "--threads", "1")
    assert code == 0 and "nothing to do" in err  # the resolved values are the ones a rerun compares


def test_a_request_without_a_mode_runs_what_auto_chose():
    from leapvox.app.serve_request import Settings, parse_speech
    from leapvox.models.load import open_model

    model = open_model(TINY)
    settings = Settings("tiny", auto_mode="spec", auto_why=f"tune profile: {WHY}")
    for req, mode in (({}, "spec"), ({"mode": "auto"}, "spec"), ({"mode": "ar"}, "ar"), ({"mode": "windowed"},
                                                                                          "windowed")):
        opts = parse_speech({"model": "tiny", "input": "Hi.", **req}, model, settings, ["wav"])[1]
        assert opts.mode == mode
    assert parse_speech({"model": "tiny", "input": "Hi."}, model, Settings("tiny"), ["wav"])[1].mode == "ar"


@pytest.mark.parametrize("how, expected", [
    (None, "demo  no tune profile here; leapvox tune demo makes one"),
    ({}, f"demo  tuned: auto runs spec, int8 ({WHY})"),
    ({"fingerprint": "0"}, "demo  tune profile not used: its profile is stale: it was made for other weights; rerun "
                           "leapvox tune"),
])
def test_doctor_says_what_auto_follows(capsys, monkeypatch, how, expected):
    from leapvox.app import doctor

    monkeypatch.setattr(doctor, "LOAD_CHECK_MAX_BYTES", 0)
    if how is not None:
        write_profile(DEMO, "spec", "int8", **how)
    code, out, err = run(capsys, "doctor")
    assert next(ln for ln in out.splitlines() if ln.startswith("tune")) == f"tune       {expected}"
    assert doctor.collect()["models"][-1]["tune"]["state"] == ("none" if how is None else "unused" if how
                                                              else "fresh")
