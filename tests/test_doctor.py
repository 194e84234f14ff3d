"""`leapvox doctor` and `leapvox --version`: what the screen says about audio, models, backends and speak, and the
exit code that follows from it. Audio, models and espeak-ng are simulated with monkeypatch where the machine
cannot provide them; the tiny reference checkpoint stands in for a real model."""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import replace
from importlib.metadata import version

import pytest

from leapvox.app import doctor as doctor_cmd
from leapvox.app import playback
from leapvox.app.cli import main
from leapvox.models import hub
from leapvox.models.catalog import CATALOG, bundled_ready, spec_for_entry

from .conftest import FIXTURES

TINY = FIXTURES / "tiny-0b6"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No $LEAPVOX_MODEL, leapvox's folders and the HF cache under tmp_path, no real sound card."""
    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "lv"))
    monkeypatch.setattr(hub, "hf_cache_dir", lambda: tmp_path / "hf" / "hub")
    # loading a model for real is checked once (test_ready_...); elsewhere the doctor stops after the config
    monkeypatch.setattr(doctor_cmd, "LOAD_CHECK_MAX_BYTES", 0)


def _no_demo(monkeypatch, tmp_path):
    """As if the package had no bundled demo model (a source tree without models/assets/demo/)."""
    monkeypatch.setitem(CATALOG, "demo", replace(CATALOG["demo"], bundled=tmp_path / "no-assets" / "demo"))


def _no_portaudio():
    raise playback.AudioUnavailable("no audio output: the PortAudio library is not installed", hint="install it")


class FakeSd:
    @staticmethod
    def get_portaudio_version():
        return (1, "PortAudio V19.7.0-fake")


def doctor(capsys, *argv):
    code = main(["doctor", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def line(out: str, label: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(label))


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"leapvox {version('leapvox')}"
    assert doctor_cmd.version() == version("leapvox")


def test_no_model_and_no_portaudio_is_not_ready(capsys, monkeypatch, tmp_path):
    _no_demo(monkeypatch, tmp_path)
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys)
    assert code == 1
    assert "no output device: no audio output: the PortAudio library is not installed" in line(out, "audio")
    assert "NOT READY: no model here: $LEAPVOX_MODEL is not set, the demo model is not bundled" in line(out, "speak")
    lines = out.splitlines()
    first = lines.index(line(out, "models"))
    rows = [ln.removeprefix("models").split()[0] for ln in lines[first: first + len(CATALOG)]]
    assert rows == list(CATALOG)  # every catalog model gets a row, in catalog order
    assert re.search(r"qwen3-tts-0\.6b +not downloaded", out) and re.search(r"demo +not bundled yet", out)
    # the reason once on stderr, one line, no traceback
    assert err.count("\n") == 1 and err.startswith("leapvox: speak will not work here: no model here")
    assert "hint: leapvox models pull qwen3-tts-0.6b" in err


def test_ready_with_a_model_and_listed_audio_devices(capsys, monkeypatch):
    monkeypatch.setattr(doctor_cmd, "LOAD_CHECK_MAX_BYTES", 10**9)
    monkeypatch.setenv("LEAPVOX_MODEL", str(TINY))
    monkeypatch.setattr(playback, "load_sounddevice", lambda: FakeSd)
    monkeypatch.setattr(playback, "output_devices", lambda: [
        playback.OutputDevice(0, "Built-in Output", 2, 48000.0, False),
        playback.OutputDevice(3, "USB Speakers", 2, 44100.0, True),
    ])
    code, out, err = doctor(capsys)
    assert code == 0, out + err
    assert err == ""
    lines = out.splitlines()
    i = lines.index(line(out, "audio"))
    assert lines[i].endswith("0  Built-in Output") and lines[i + 1].endswith("3  USB Speakers  (default)")
    speak = line(out, "speak")
    assert f"ready: model {TINY} from $LEAPVOX_MODEL" in speak and "loads in" in speak
    assert "cpu     ready" in line(out, "backends")
    assert f"leapvox    {version('leapvox')}" in line(out, "leapvox")


def test_json_report(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(playback, "load_sounddevice", lambda: FakeSd)
    monkeypatch.setattr(playback, "output_devices", lambda: [])
    code, out, _ = doctor(capsys, "--json", "--model", TINY)
    r = json.loads(out)
    assert code == 0 and r["speak"]["ready"] and r["speak"]["source"] == "--model"
    assert r["versions"]["torch"] == torch.__version__ and r["versions"]["leapvox"] == version("leapvox")
    assert r["threads"]["torch_intra_op"] == torch.get_num_threads()
    assert {"fp32", "bf16"} <= set(r["formats"]["available"])
    probe = r["formats"]["probe"]
    assert probe["fastest"] in ("fp32", "bf16", "int8", "w8a8", "w4a8", "int4")
    assert probe["ms"]["fp32"] > 0 and probe["ms"]["bf16"] > 0
    assert r["backends"]["cpu"]["ready"] is True
    if not torch.cuda.is_available():
        assert r["backends"]["cuda"]["ready"] is False and r["backends"]["cuda"]["detail"]
    if sys.platform != "darwin":  # Core ML predictions need macOS
        assert r["backends"]["coreml"]["ready"] is False and "macOS" in r["backends"]["coreml"]["detail"]
    assert r["audio"]["portaudio"] == "PortAudio V19.7.0-fake" and r["audio"]["devices"] == []
    assert "no output device" in r["audio"]["why_none"]
    assert set(r["paths"]) == {"hf-cache", "data", "config", "cache"}
    assert [m["name"] for m in r["models"]] == list(CATALOG)


def test_unknown_formats_are_listed_but_not_probed():
    p = doctor_cmd.probe_formats(["fp32", "fp8"])
    assert p["ms"]["fp8"] is None and p["fastest"] == "fp32" and p["close"] == []


def test_espeak_ng_missing_for_a_model_that_needs_it(capsys, monkeypatch, tmp_path):
    model = tmp_path / "ipa-model"
    shutil.copytree(TINY, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "leapvox_text_frontend": "espeak-ng-ipa"}))
    monkeypatch.setattr(doctor_cmd, "espeak", lambda: {"path": None, "version": None})
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys, "--model", model)
    assert code == 1
    assert "not installed (only the demo model needs it)" in line(out, "espeak-ng")
    assert "NOT READY: " in line(out, "speak") and "espeak-ng program, which is not on PATH" in out
    assert "apt install espeak-ng" in err


def test_a_model_folder_that_does_not_exist(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys, "--model", tmp_path / "nowhere")
    assert code == 1 and f"NOT READY: no model at {tmp_path / 'nowhere'}" in line(out, "speak")


def test_bundled_demo_model_is_found_and_used(capsys, monkeypatch, tmp_path):
    demo = tmp_path / "assets" / "demo"
    shutil.copytree(TINY, demo)
    monkeypatch.setitem(CATALOG, "demo", replace(CATALOG["demo"], bundled=demo))
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys)
    assert code == 0, out + err
    demo_row = next(ln for ln in out.splitlines() if "demo " in ln and "bundled" in ln)
    assert "bundled, verified" in demo_row
    assert "ready: model demo from speak's default (the bundled demo model)" in line(out, "speak")


@pytest.mark.skipif(not bundled_ready(CATALOG["demo"]), reason="this checkout has no bundled demo model "
                    "(models/assets/demo/)")
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the demo model needs espeak-ng, not installed here")
def test_the_real_bundled_demo_model(capsys, monkeypatch):
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys, "--json")
    r = json.loads(out)
    demo = next(m for m in r["models"] if m["name"] == "demo")
    assert demo["state"] == "bundled" and demo["verified"] is True and demo["bytes"] > 100_000
    assert code == 0 and r["speak"]["model"] == "demo" and r["speak"]["needs"] == "espeak-ng"


def _fake_cached_model(name: str, damage: str | None = None):
    """The tiny checkpoint laid out as a cached snapshot of a catalog model, with a manifest of its hashes."""
    spec = spec_for_entry(CATALOG[name])
    snapshot = hub.repo_folder(spec.repo_id) / "snapshots" / spec.revision
    files = {}
    for f in spec.files:
        (snapshot / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TINY / f, snapshot / f)
        files[f] = {"size": (snapshot / f).stat().st_size, "sha256": hub.file_hash(snapshot / f, "sha256"),
                    "git_sha1": None}
    hub.save_manifest({"repo_id": spec.repo_id, "commit": spec.revision, "source": "hub", "files": files,
                       "checked": {}})
    if damage:  # same size, different bytes: only a hash finds it
        data = bytearray((snapshot / damage).read_bytes())
        data[-1] ^= 0xFF
        (snapshot / damage).write_bytes(bytes(data))


def test_cached_models_are_verified_and_damage_is_reported(capsys, monkeypatch, tmp_path):
    _no_demo(monkeypatch, tmp_path)
    _fake_cached_model("qwen3-tts-0.6b")
    _fake_cached_model("qwen3-tts-1.7b", damage="vocab.json")
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, err = doctor(capsys, "--json")
    rows = {m["name"]: m for m in json.loads(out)["models"]}
    assert rows["qwen3-tts-0.6b"]["verified"] is True
    assert rows["qwen3-tts-1.7b"]["verified"] is False
    assert rows["qwen3-tts-1.7b"]["problem"] == "vocab.json: sha256 differs from the one the Hub reported"
    code, out, err = doctor(capsys)
    assert re.search(r"qwen3-tts-0\.6b +downloaded, verified", out)
    assert re.search(r"qwen3-tts-1\.7b +downloaded, FAILS verification: vocab\.json: sha256 differs", out)
    # no default model, but an intact downloaded one: speak works with --model
    assert code == 0 and "ready: model qwen3-tts-0.6b from present here" in line(out, "speak")


def test_every_weight_format_is_probed_and_the_auto_default_is_resolved(capsys, monkeypatch):
    from leapvox.app.common import DEFAULT_WEIGHTS
    from leapvox.engine.fast.quant import resolve_weights

    p = doctor_cmd.probe_formats(doctor_cmd.weight_formats())
    assert DEFAULT_WEIGHTS == "auto" and set(p["ms"]) == {"fp32", "bf16", "int8", "w8a8", "w4a8", "int4"}
    from leapvox.engine.fast.quant import w4a8_unavailable_reason

    timed = set(p["ms"])
    if w4a8_unavailable_reason():  # w4a8 needs leapvox's compiled kernel: without it, a reason instead of a time
        assert p["ms"]["w4a8"] is None and "compiled" in p["not_probed"]["w4a8"]
        timed.discard("w4a8")
    assert all(p["ms"][fmt] is not None and p["ms"][fmt] > 0 for fmt in timed), p
    assert p["fastest"] in p["ms"]
    here = resolve_weights("auto")
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    code, out, _ = doctor(capsys, "--json", "--model", TINY)
    probe = json.loads(out)["formats"]["probe"]
    assert probe["ms"]["int8"] > 0 and probe["default"] == "auto" and probe["default_here"] == here
    code, out, _ = doctor(capsys, "--model", TINY)
    formats = out[out.index("formats"): out.index("backends")]
    # only w4a8 may be left unprobed, and only where its kernel cannot run (a CPU without AVX-512 VNNI, no compiler)
    unprobed = re.findall(r"(\w+) not probed", formats)
    assert unprobed == (["w4a8"] if w4a8_unavailable_reason() else []), formats
    assert f"default auto = {here} here; fp32 for a model narrower than 512, such as the demo" in formats
    assert re.search(r"int8 \d+\.\d{3} ms", formats), formats


def test_a_format_without_a_probe_is_listed_with_the_reason(capsys):
    p = doctor_cmd.probe_formats(["fp32", "fp8"])
    assert p["ms"]["fp8"] is None and p["fastest"] == "fp32" and "fp8" in p["not_probed"]
    report = {"versions": doctor_cmd.versions(), "threads": doctor_cmd.threads(),
              "formats": {"available": ["fp32", "fp8"], "probe": p}, "backends": {}, "audio": doctor_cmd.audio(),
              "paths": {}, "models": [{"name": "x", "present": False}], "espeak_ng": {"path": None},
              "speak": {"ready": False, "reason": "r"}}
    assert "fp8 not probed (the doctor has no probe for this format)" in doctor_cmd.render(report)


@pytest.mark.skipif(not bundled_ready(CATALOG["demo"]), reason="no bundled demo model (models/assets/demo/)")
def test_the_bundled_demo_is_checked_against_its_recorded_hashes(capsys, monkeypatch, tmp_path):
    from leapvox.models.catalog import DEMO_DIR

    demo = tmp_path / "assets" / "demo"
    shutil.copytree(DEMO_DIR, demo)  # MANIFEST.json included
    monkeypatch.setitem(CATALOG, "demo", replace(CATALOG["demo"], bundled=demo))
    monkeypatch.setattr(playback, "load_sounddevice", _no_portaudio)
    rows = {m["name"]: m for m in json.loads(doctor(capsys, "--json", "--model", TINY)[1])["models"]}
    assert rows["demo"]["verified"] is True
    data = bytearray((demo / "vocab.json").read_bytes())
    data[-2] ^= 0x01
    (demo / "vocab.json").write_bytes(bytes(data))
    rows = {m["name"]: m for m in json.loads(doctor(capsys, "--json", "--model", TINY)[1])["models"]}
    assert rows["demo"]["verified"] is False
    assert rows["demo"]["problem"] == "vocab.json: sha256 differs from the recorded one"
