"""`leapvox tune` (issue #39, the producing half): the stages write a profile that names the offsets and tree spec mode
reads, resume after an interruption without redoing finished work, are rejected when stale, and decide by the rule
models/tune.py argues (tested as a pure function on numbers). The tiny fixture and the bundled demo, under an
isolated LEAPVOX_HOME, one torch thread (the box is shared; tiny models are faster that way)."""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapvox.app.common import Terminated
from leapvox.models import profile as P
from leapvox.models import tune as T
from leapvox.models.catalog import CATALOG
from leapvox.models.recipes import tune as RT
from leapvox.models.spec_assets import load_offsets, load_tree, tree_path

from .conftest import FIXTURES, one_line, run
from .test_hub import cli, hub  # noqa: F401 - the fake Hub for `models pull`'s offer

TINY = FIXTURES / "tiny-0b6"
DEMO = CATALOG["demo"].bundled
QUICK = {"max_frames": 6, "offset_steps": 8, "formats": ("int8",)}  # the tiny fixture in seconds
PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "lv"))
    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    torch.set_num_threads(1)  # conftest restores the session's count afterwards
    return tmp_path / "lv"


def tune(folder=TINY, utterances=3, **kw) -> RT.Tune:
    t = RT.Tune(folder, RT.Settings(utterances=utterances, **{**QUICK, **kw}))
    t.begin()
    return t


# ---- the decision, a pure function of numbers -----------------------------------------------------------------


def fmt(weights, frame_ms, kl=(0.0, 0.0), talker=None, spec_pred=None, ratio=None) -> P.FormatResult:
    talker = frame_ms * 0.4 if talker is None else talker
    return P.FormatResult(weights, 1.0, 1.0, kl[0], kl[1], frame_ms, T.passes(*kl), talker, frame_ms - talker,
                          spec_pred, None, ratio)


def test_the_demos_trained_offsets_choose_spec():
    """bench-spec-demo.json: trained offsets 3.65 tokens per call, a verify call ~1.5x an ar call."""
    d = T.decide([fmt("fp32", 60.0), fmt("w8a8", 40.0, (0.0003, 0.0004))], 3.65, 1.54)
    assert (d.mode, d.weights) == ("spec", "w8a8")
    assert d.why.startswith("spec: 3.65 tokens/call") and "2.37x" in d.why


def test_random_weights_at_about_one_token_per_call_choose_ar():
    """The random 0.6B: ~1.1 tokens per call against a verify call 1.1x an ar call (bench-0.6b-2t.json)."""
    d = T.decide([fmt("fp32", 250.0), fmt("w8a8", 56.0, (0.001, 0.002))], 1.1, 1.1)
    assert (d.mode, d.weights) == ("ar", "w8a8")
    assert "1.10 tokens/call give only 1.00x here" in d.why


def test_a_format_failing_fidelity_is_never_chosen_however_fast():
    d = T.decide([fmt("fp32", 200.0), fmt("int8", 90.0, (0.001, 0.001)),
                  fmt("w4a8", 10.0, (T.MAX_KL_TALKER * 1.01, 0.0))], 1.0, 1.2)
    assert d.weights == "int8" and "w4a8 moved the codes too much" in d.why
    d = T.decide([fmt("fp32", 200.0), fmt("int4", 10.0, (0.0, T.MAX_KL_PREDICTOR * 1.01))], 1.0, 1.2)
    assert d.weights == "fp32"


def test_a_faster_passing_format_is_chosen():
    fast = (T.MAX_KL_TALKER, T.MAX_KL_PREDICTOR)  # exactly at the threshold passes
    d = T.decide([fmt("fp32", 200.0), fmt("w8a8", 55.0, (0.001, 0.002)), fmt("w4a8", 38.0, fast)], 1.0, 1.2)
    assert d.weights == "w4a8"


def test_spec_measured_slower_than_ar_stays_ar():
    """The estimate leaves out the walk's host work; a format whose spec frames were measured slower keeps ar."""
    d = T.decide([fmt("fp32", 30.0, talker=5.0, spec_pred=40.0)], 1.5, 1.2)
    assert d.mode == "ar" and "not borne out" in d.why


def test_the_threshold_is_the_demos_w4a8_drift_rounded_up():
    """models/tune.py's argument, against the measurement it cites (tests/benchmarks/tune_fidelity.py)."""
    data = json.loads((Path(__file__).parent / "benchmarks" / "tune-fidelity-demo.json").read_text())
    w4 = data["formats"]["w4a8-vnni"]

    def up(x):  # two significant digits, rounded up
        scale = 10 ** (math.floor(math.log10(x)) - 1)
        return math.ceil(x / scale - 1e-9) * scale

    assert math.isclose(T.MAX_KL_TALKER, up(w4["kl_talker"])) and math.isclose(T.MAX_KL_PREDICTOR,
                                                                                  up(w4["kl_predictor"]))
    assert data["formats"]["w8a8-vnni"]["passes"] and w4["passes"]
    assert data["wer"]["w4a8"]["wer"] - data["wer"]["fp32"]["wer"] < 0.02  # the WER runs it leans on: within noise


formats = st.lists(st.builds(
    fmt, st.sampled_from(["bf16", "int8", "w8a8", "w4a8", "int4"]), st.floats(5, 500),
    st.tuples(st.floats(0, 0.05), st.floats(0, 0.05)), st.none(),
    st.one_of(st.none(), st.floats(1, 500)), st.one_of(st.none(), st.floats(0.5, 4))), max_size=5,
    unique_by=lambda f: f.weights)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(formats, st.floats(5, 500), st.one_of(st.none(), st.floats(1, 15)), st.one_of(st.none(), st.floats(0.5, 4)))
def test_decide_picks_a_passing_format_and_spec_only_where_it_pays(others, ref_ms, tpc, ratio):
    fs = [fmt("fp32", ref_ms), *others]
    d = T.decide(fs, tpc, ratio)
    chosen = next(f for f in fs if f.weights == d.weights)
    gain = T.spec_gain(tpc, chosen.verify_over_ar or ratio)
    measured_ok = chosen.spec_predictor_ms is None or chosen.spec_predictor_ms < chosen.predictor_ms
    assert chosen.passes
    assert (d.mode == "spec") == (gain is not None and gain >= T.SPEC_MIN_GAIN and measured_ok)
    planned = T.spec_frame_ms(chosen, tpc, chosen.verify_over_ar or ratio) if d.mode == "spec" else chosen.frame_ms
    assert planned <= min(f.frame_ms for f in fs if f.passes) + 1e-9  # nothing that passes is faster in ar


# ---- texts and estimates ------------------------------------------------------------------------------------------


@PROPERTY
@given(st.lists(st.sampled_from([*T.TEXTS, "beijing_dialect", "klingon"]), unique=True), st.integers(1, 60))
def test_the_built_in_texts_cover_the_models_languages(languages, n):
    got = T.texts_for(languages, n)
    assert len(got) == n
    known = [lang for lang in T.TEXTS if lang in languages]  # in TEXTS' order: English first
    if not known:
        assert got == [(T.TEXTS["english"][i % len(T.TEXTS["english"])], "auto") for i in range(n)]
        return
    assert all(text in T.TEXTS[lang] for text, lang in got)
    assert [lang for _, lang in got[: len(known)]] == known[:n]  # one sentence of each language before any second
    if n >= sum(len(T.TEXTS[lang]) for lang in known):  # every sentence once before any is repeated
        assert {text for text, _ in got} == {text for lang in known for text in T.TEXTS[lang]}


def test_the_users_lines_are_spoken_in_order_with_language_auto():
    assert T.texts_for(["english"], 5, ["a", "b"]) == [("a", "auto"), ("b", "auto"), ("a", "auto"),
                                                        ("b", "auto"), ("a", "auto")]


@PROPERTY
@given(st.integers(10**6, 10**10), st.integers(1, 5000), st.integers(1, 6), st.one_of(st.none(), st.floats(0.001, 2)))
def test_the_estimate_grows_with_the_work_and_its_stages_add_up(size, frames, n_formats, frame_s):
    e = T.estimate(size, frames, n_formats, frame_s)
    assert math.isclose(e.seconds, sum(e.per_stage.values()))
    assert T.estimate(size, frames + 100, n_formats, frame_s).seconds > e.seconds
    assert T.estimate(size, frames, n_formats + 1, frame_s).seconds > e.seconds
    later = T.estimate(size, frames, n_formats, frame_s, stages=("tree", "formats", "decision"))
    assert later.seconds < e.seconds and set(later.per_stage) == {"tree", "formats", "decision"}


# ---- the stages on the tiny fixture -------------------------------------------------------------------------------


def test_a_tune_writes_every_stage_and_names_what_spec_mode_reads():
    t = tune()
    p = t.run()
    assert p.stages_done == list(P.STAGES) and p.decision is not None
    assert [f.weights for f in p.formats] == ["fp32", "int8"]  # fp32 first: the reference
    fp32 = p.formats[0]
    assert (fp32.code0_agreement, fp32.kl_talker, fp32.kl_predictor, fp32.passes) == (1.0, 0.0, 0.0, True)
    assert all(f.frame_ms > 0 and f.verify_over_ar > 0 and 1 <= f.tokens_per_call <= 15 for f in p.formats)
    assert p.frames["sentences"] == 3 and p.frames["held_out_sentences"] == 1
    assert p.frames["training_frames"] == 12 and p.frames["held_out_frames"] == 6  # 6 frames each (random weights)
    assert set(p.offsets_trial["candidates"]) == set(RT.OFFSET_VARIANTS)
    # the tree is where spec mode reads it, and is the one the profile names
    tree, where = load_tree(TINY)
    assert str(where) == p.tree_path == str(tree_path(TINY)) and tree.size == p.tree_size
    offsets, opath = load_offsets(TINY, 32)
    assert (opath is None) == (p.offsets_path is None) and (opath is None or str(opath) == p.offsets_path)
    assert 1 <= p.tokens_per_call <= 15 and len(p.tokens_per_call_by_depth) == tree.max_depth
    loaded, why = P.load_profile(TINY)
    assert why is None and loaded.decision == p.decision and loaded.formats == p.formats
    assert t.state() == ("finished", None)


def test_an_interrupted_tune_resumes_without_redoing_finished_work(monkeypatch):
    """Interrupted inside the frames stage, then inside the tree stage: each rerun speaks only the sentences not
    yet spoken and runs only the stages not yet done."""
    from leapvox.engine.synthesis import Synthesizer

    spoken = []
    real = Synthesizer.generate_codes

    def counted(self, text, opts, *a, **k):
        if opts.runaway_guard:  # the frames stage (the format timings speak without the guard)
            spoken.append(text)
            if len(spoken) == 3:
                raise KeyboardInterrupt
        return real(self, text, opts, *a, **k)

    monkeypatch.setattr(Synthesizer, "generate_codes", counted)
    with pytest.raises(KeyboardInterrupt):
        tune(utterances=4).run()
    assert len(list((P.work_dir(TINY) / "utterances").glob("*.pt"))) == 2
    assert P.Profile.from_json(P.profile_path(TINY).read_text()).stages_done == []

    calls = {s: 0 for s in P.STAGES}

    def counting(stage, real):
        def wrapped(self):
            calls[stage] += 1
            if stage == "tree" and calls["tree"] == 1:
                raise RuntimeError("power cut")
            return real(self)

        return wrapped

    for stage in P.STAGES:
        monkeypatch.setattr(RT.Tune, f"stage_{stage}", counting(stage, getattr(RT.Tune, f"stage_{stage}")))
    spoken.clear()
    t = tune(utterances=4)
    assert t.state() == ("resume", None)
    with pytest.raises(RuntimeError, match="power cut"):
        t.run()
    assert len(spoken) == 2  # the two sentences not spoken before
    assert P.Profile.from_json(P.profile_path(TINY).read_text()).stages_done == ["frames", "offsets"]

    spoken.clear()
    t = tune(utterances=4)
    assert t.state() == ("resume", None)
    p = t.run()
    assert spoken == []  # no sentence spoken again
    assert calls == {"frames": 1, "offsets": 1, "tree": 2, "formats": 1, "decision": 1}
    assert p.stages_done == list(P.STAGES) and p.decision is not None


def test_a_rerun_with_other_settings_starts_afresh():
    tune(utterances=3)  # begun, not run
    other = RT.Tune(TINY, RT.Settings(utterances=5, **QUICK))
    assert other.state() == ("restart", "the unfinished run was asked for other settings (utterances 3, now 5)")
    torch.set_num_threads(2)
    assert "threads 1, now 2" in RT.Tune(TINY, RT.Settings(utterances=3, **QUICK)).state()[1]


# ---- stale profiles -------------------------------------------------------------------------------------------------


def finished_profile(folder=TINY) -> Path:
    p = P.Profile(model_key=P.model_key(folder), fingerprint=P.fingerprint(folder), machine=P.machine_id(),
                  versions=P.versions(), threads=1, created="2026-12-06T00:00:00+00:00", stages_done=list(P.STAGES),
                  decision=P.Decision("ar", "int8", "ar: test"), settings=RT.Settings(utterances=3, **QUICK).key())
    return P.save_profile(P.profile_path(folder), p)


NOW = P.versions()


@pytest.mark.parametrize("patch, reason", [
    (("machine_id", lambda: "Another CPU [00000000]"), "it was made on another CPU"),
    (("versions", lambda: {**NOW, "leapvox": "9.9.9"}), "it was made with leapvox"),
    (("versions", lambda: {**NOW, "torch": "1.0"}), "it was made with torch"),
])
def test_a_profile_from_another_cpu_or_version_is_stale(monkeypatch, patch, reason):
    finished_profile()
    assert RT.Tune(TINY, RT.Settings(utterances=3, **QUICK)).state() == ("finished", None)
    name, value = patch
    if name == "machine_id":  # the profile's path holds the machine too: keep the file where it was found
        path = P.profile_path(TINY)
        monkeypatch.setattr(P, "profile_path", lambda folder: path)
    monkeypatch.setattr(P, name, value)
    profile, why = P.load_profile(TINY)
    assert profile is None and reason in why and "rerun leapvox tune" in why
    state, why = RT.Tune(TINY, RT.Settings(utterances=3, **QUICK)).state()
    assert state == "restart" and reason in why


def test_a_profile_for_other_weights_is_stale(tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(TINY, folder)
    finished_profile(folder)
    assert P.load_profile(folder)[1] is None
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    (folder / "model.safetensors").write_bytes(bytes(data))
    profile, why = P.load_profile(folder)
    assert profile is None and "it was made for other weights" in why
    assert RT.Tune(folder).state() == ("restart", "its profile is stale: it was made for other weights")


# ---- the command ----------------------------------------------------------------------------------------------------


@pytest.fixture
def quick_cli(monkeypatch):
    """`leapvox tune` with the quick settings (its flags choose sentences and threads only)."""
    monkeypatch.setattr(RT, "Settings", functools.partial(RT.Settings, **QUICK))


@pytest.fixture
def no_load(monkeypatch):
    def load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(RT, "load_model", load)


@pytest.mark.parametrize("argv, words", [
    ([str(FIXTURES / "nope")], "no model at"),
    ([str(FIXTURES / "tiny-base-0b6")], "a Base model has none"),
    ([str(TINY), "--utterances", "1"], "--utterances 1 is outside 2..2000"),
    ([str(TINY), "--threads", "0"], "--threads 0 must be at least 1"),
    ([str(TINY), "--texts", "/nonexistent/texts.txt"], "cannot read --texts"),
    ([str(TINY), "--texts", str(FIXTURES)], "is a folder"),
    ([str(TINY), "--background", "--status"], "do not go together"),
])
def test_mistakes_are_one_line_before_any_model_loads(capsys, no_load, argv, words):
    code, out, err = run(capsys, "tune", *argv)
    assert code == 2 and words in one_line(err) and "(hint: " in err and out == ""


def test_texts_that_are_not_utf8_or_empty_are_refused(capsys, tmp_path, no_load):
    bad, empty = tmp_path / "bad.txt", tmp_path / "empty.txt"
    bad.write_bytes(b"caf\xe9\n")
    empty.write_text("\n  \n")
    for path, words in ((bad, "is not UTF-8 text"), (empty, "has no sentences")):
        code, _, err = run(capsys, "tune", TINY, "--texts", path)
        assert code == 2 and words in one_line(err)


def test_an_unwritable_data_folder_is_refused_before_loading(capsys, monkeypatch, tmp_path, no_load):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LEAPVOX_HOME", str(blocker))
    code, _, err = run(capsys, "tune", TINY)
    assert code == 2 and "cannot write leapvox's data folder" in one_line(err) and "LEAPVOX_HOME" in err


def test_the_command_states_its_time_reports_and_says_when_it_is_done_already(capsys, quick_cli):
    code, out, err = run(capsys, "tune", TINY, "--utterances", "3", "--threads", "1")
    assert code == 0, err
    assert "here: about " in err and "ms a frame measured" in err and "Ctrl-C stops it" in err
    assert err.index("here: about") < err.index("frames: ")  # the estimate comes before the work
    assert "chosen:  --mode auto = " in out and "formats: weights" in out and "\n         int8 " in out
    code, out2, err = run(capsys, "tune", TINY, "--utterances", "3", "--json")
    assert code == 0 and "is tuned already on this machine" in err and "--force" in err
    assert json.loads(out2)["decision"] == json.loads(P.profile_path(TINY).read_text())["decision"]


def wrapped_sigterm():
    """SIGTERM as Python hands it on where it lands inside __set_name__ (a class being made by a lazy import)."""
    try:
        raise Terminated()
    except Terminated as e:
        raise RuntimeError("Error calling __set_name__ on 'Field' instance") from e


def raiser(kind):
    def stop():
        raise kind()
    return stop


@pytest.mark.parametrize("stop, code, word", [(raiser(KeyboardInterrupt), 130, "interrupted"),
                                               (raiser(Terminated), 143, "terminated"),
                                               (wrapped_sigterm, 143, "terminated")])
def test_ctrl_c_keeps_what_is_done_and_says_how_to_continue(capsys, quick_cli, monkeypatch, stop, code, word):
    def interrupted(self):
        stop()

    monkeypatch.setattr(RT.Tune, "stage_offsets", interrupted)
    status, out, err = run(capsys, "tune", TINY, "--utterances", "3")
    assert status == code and out == ""
    assert f"{word}; kept frames finished" in err and f"continue with: leapvox tune {TINY}" in err
    assert P.Profile.from_json(P.profile_path(TINY).read_text()).stages_done == ["frames"]
    code, out, err = run(capsys, "tune", TINY, "--status")
    assert code == 0 and "stopped part-way: frames done" in out and "continues" in out


def test_status_without_a_profile(capsys):
    code, out, _ = run(capsys, "tune", TINY, "--status")
    assert code == 1 and "not tuned on this machine" in out and str(P.profile_path(TINY)) in out


def test_a_second_run_while_one_is_running_is_refused(capsys, no_load):
    work = P.work_dir(TINY)
    work.mkdir(parents=True)
    (work / "pid").write_text(str(os.getppid()))  # a live process that is not this one
    code, _, err = run(capsys, "tune", TINY)
    assert code == 2 and "already running" in one_line(err) and "--status" in err


def test_background_detaches_a_low_priority_run_and_returns(capsys, monkeypatch, no_load):
    started = {}

    class Popen:
        pid = 4242

        def __init__(self, argv, **kw):
            started.update(argv=argv, **kw)

    monkeypatch.setattr("subprocess.Popen", Popen)
    code, out, err = run(capsys, "tune", TINY, "--background", "--utterances", "5")
    log = P.profile_path(TINY).with_suffix(".log")
    assert code == 0 and out == "" and f"log: {log}" in err and "--status" in err and "4242" in err
    assert started["argv"][-4:] == ["tune", str(TINY), "--utterances", "5"] and "--background" not in started["argv"]
    assert started["start_new_session"] and started["stdin"] is not None and started["preexec_fn"] is not None
    assert log.read_text().startswith("--- ")


def test_models_pull_ends_with_one_line_offering_tune(cli):  # noqa: F811 - the fixture from test_hub
    p = cli("models", "pull", "tiny")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(cli.snapshot)  # the output is still the folder alone
    offer = [ln for ln in p.stderr.splitlines() if "leapvox tune tiny" in ln]
    assert len(offer) == 1 and "about " in offer[0] and "not run automatically" in offer[0]


# ---- the demo -------------------------------------------------------------------------------------------------------


needs_espeak = pytest.mark.skipif(__import__("shutil").which("espeak-ng") is None,
                                  reason="the demo's text front end needs espeak-ng")


@needs_espeak
def test_the_demo_tunes_spec_with_the_offsets_it_ships():
    """The demo ships offsets beside itself (spec mode reads them first): tune measures them against zero offsets
    instead of training its own, reaches the demo's acceptance with them, and decides the mode from its timings."""
    t = tune(DEMO, utterances=3, max_frames=24, formats=())  # fp32 alone: the mode is the question here
    p = t.run()
    trial = p.offsets_trial["candidates"]
    assert set(trial) == {"shipped"} and trial["shipped"]["depth"] == 7
    assert p.tokens_per_call > 2.5  # the shipped offsets' acceptance on the demo: deterministic
    # whether spec pays then rests on this machine's timings (one verify call against one ar call, spec's predictor
    # frame against ar's), which a busy box can tip either way: the test holds the decision to the measurements the
    # profile records, and does not assert a timing
    (fp32,) = p.formats
    gain = T.spec_gain(p.tokens_per_call, fp32.verify_over_ar or p.verify_over_ar)
    pays = gain >= T.SPEC_MIN_GAIN and fp32.spec_predictor_ms < fp32.predictor_ms
    assert p.decision.mode == ("spec" if pays else "ar"), (p.decision.why, fp32)
    assert p.decision.why.startswith("spec: " if pays else "ar: "), p.decision.why
