"""`leapvox models list|verify|info` on what is here without the Hub: the bundled demo model (its size and its
recorded hashes, models/assets/demo/MANIFEST.json) and local checkpoint folders. In-process, no network."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from leapvox.app.cli import main
from leapvox.models import catalog, hub
from leapvox.models.catalog import CATALOG, DEMO_DIR, bundled_ready, human_size

from .conftest import FIXTURES

TINY = FIXTURES / "tiny-0b6"
needs_demo = pytest.mark.skipif(not bundled_ready(CATALOG["demo"]), reason="no bundled demo model in this checkout")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.delenv("LEAPVOX_MODEL", raising=False)
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "lv"))
    monkeypatch.setattr(hub, "hf_cache_dir", lambda: tmp_path / "hf" / "hub")


def run(capsys, *argv):
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def model_files(folder):
    """What a bundled model consists of, counted independently of the code under test: every file but the model
    card and the manifest."""
    return [p for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("README.md", "MANIFEST.json")]


def demo_copy(tmp_path, monkeypatch):
    """The bundled demo model copied to tmp_path (manifest included) and put in the catalog in its place."""
    demo = tmp_path / "assets" / "demo"
    shutil.copytree(DEMO_DIR, demo)
    monkeypatch.setitem(CATALOG, "demo", replace(CATALOG["demo"], bundled=demo))
    return demo


# ---- list: the demo's size ------------------------------------------------------------------------------------

@needs_demo
def test_list_shows_the_bundled_demo_size(capsys):
    code, out, _ = run(capsys, "models", "list")
    assert code == 0
    header = out.splitlines()[0]
    demo = next(ln for ln in out.splitlines() if ln.startswith("demo "))
    size_col = demo[header.index("SIZE"): header.index("ON DISK")].strip()
    on_disk_col = demo[header.index("ON DISK"): header.index("STATE")].strip()
    expected = human_size(sum(p.stat().st_size for p in model_files(DEMO_DIR)))
    assert size_col == expected, out
    assert on_disk_col not in ("", "-") and on_disk_col.endswith("MB"), out
    assert " bundled " in demo


# ---- the manifest: recorded hashes of the bundled files ---------------------------------------------------------

@needs_demo
def test_the_demo_manifest_matches_the_bundled_files():
    """Fails when a bundled file is added, removed or changed without regenerating MANIFEST.json (run
    `python3 -c "from leapvox.models.catalog import write_bundled_manifest; write_bundled_manifest()"`)."""
    recorded = json.loads((DEMO_DIR / catalog.BUNDLED_MANIFEST).read_text())
    assert recorded == catalog.bundled_manifest(DEMO_DIR), "models/assets/demo/MANIFEST.json is stale"
    on_disk = {p.relative_to(DEMO_DIR).as_posix() for p in model_files(DEMO_DIR)}
    assert set(recorded["files"]) == on_disk
    assert {"config.json", "model.safetensors", "speech_tokenizer/model.safetensors"} <= on_disk


# ---- verify demo --------------------------------------------------------------------------------------------------

@needs_demo
def test_verify_the_bundled_demo(capsys):
    code, out, err = run(capsys, "models", "verify", "demo")
    assert code == 0, err
    n = len(model_files(DEMO_DIR))
    assert out.count("ok ") == n and "FAILED" not in out
    assert err.strip() == f"leapvox: all {n} files of demo match the hashes recorded in {DEMO_DIR / 'MANIFEST.json'}"


@needs_demo
def test_verify_reports_a_changed_and_a_missing_bundled_file(capsys, monkeypatch, tmp_path):
    demo = demo_copy(tmp_path, monkeypatch)
    weights = demo / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the hash sees it
    weights.write_bytes(bytes(data))
    (demo / "vocab.json").unlink()
    code, out, err = run(capsys, "models", "verify", "demo")
    assert code == 1
    failed = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("FAILED")}
    assert set(failed) == {"model.safetensors", "vocab.json"}, out
    assert "sha256 differs from the recorded one" in failed["model.safetensors"]
    assert "(missing)" in failed["vocab.json"]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("leapvox: 2 of ") and "demo" in lines[0]


@needs_demo
def test_verify_without_a_manifest_is_one_line_error(capsys, monkeypatch, tmp_path):
    demo = demo_copy(tmp_path, monkeypatch)
    (demo / "MANIFEST.json").unlink()
    code, out, err = run(capsys, "models", "verify", "demo")
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("leapvox: error: ") and "MANIFEST.json" in lines[0]


# ---- info FOLDER ------------------------------------------------------------------------------------------------

def info_rows(out: str) -> list[tuple[str, str]]:
    return [tuple(ln.split(None, 1)) if " " in ln.strip() else (ln.strip(), "") for ln in out.splitlines()]


def test_info_describes_a_checkpoint_folder(capsys):
    code, out, err = run(capsys, "models", "info", TINY)
    assert code == 0, out + err
    rows = dict(info_rows(out))
    assert rows["model"].startswith("qwen3_tts custom_voice (0b6)")
    total = sum(p.stat().st_size for p in TINY.rglob("*") if p.is_file())
    assert rows["size"] == human_size(total)
    assert rows["speakers"].split(", ")[:2] == ["aiden", "dylan"] and "vivian" in rows["speakers"]
    assert rows["languages"].startswith("auto, chinese, english")
    assert "model.safetensors" in rows["weights"] and "speech_tokenizer/model.safetensors" in rows["weights"]
    assert "problem" not in rows and err == ""


def test_info_reports_what_a_folder_lacks(capsys, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(TINY, broken)
    (broken / "config.json").unlink()
    (broken / "model.safetensors").unlink()
    code, out, err = run(capsys, "models", "info", broken)
    assert code == 1
    problems = [v for k, v in info_rows(out) if k == "problem"]
    assert any(p.startswith("missing config.json") for p in problems), out
    assert any(p.startswith("missing model.safetensors") for p in problems), out
    assert len(problems) == 2, out  # one line each, nothing else is wrong
    assert err.count("\n") == 1 and "2 problems" in err


def test_info_on_a_folder_that_is_no_checkpoint(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, "models", "info", tmp_path / "empty")
    assert code == 1
    problems = [v for k, v in info_rows(out) if k == "problem"]
    assert any(p.startswith("missing config.json") for p in problems) and len(problems) >= 3, out
    code, out, err = run(capsys, "models", "info", tmp_path / "nowhere")
    assert code == 1 and "no such folder" in out


def test_info_reports_a_truncated_weight_file(capsys, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(TINY, broken)
    codec = broken / "speech_tokenizer" / "model.safetensors"
    codec.write_bytes(codec.read_bytes()[:-1000])
    code, out, _ = run(capsys, "models", "info", broken)
    problems = [v for k, v in info_rows(out) if k == "problem"]
    assert code == 1 and len(problems) == 1 and problems[0].startswith("cannot read speech_tokenizer/model.safetensors")


def test_loading_a_model_runs_no_weight_init_and_leaves_torch_nn_init_as_it_was():
    """Modules are built as shapes (meta) for a file to fill: a random init there costs an import of torch._dynamo
    (seconds before the first audio) and nothing else. A child process loads a Qwen-shaped model with its codec and a
    Base model's encoders, speaks a few frames, and reports whether that import happened."""
    import subprocess
    import sys

    code = f"""
import sys, torch
from leapvox.models.checkpoint import load_checkpoint, load_encoders
init = dict(vars(torch.nn.init))
m = load_checkpoint({str(FIXTURES / "tiny-0b6")!r})
load_encoders(__import__("pathlib").Path({str(FIXTURES / "tiny-base-0b6")!r}))
assert vars(torch.nn.init) == init, "torch.nn.init was left patched"
from leapvox.engine.options import SynthesisOptions
out = m.synthesizer().synthesize("Hello.", SynthesisOptions(max_frames=3))
print(len(out.audio) > 0, "torch._dynamo" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"], r.stdout
