"""`leapvox compare`: one table row, one WAV and one JSON record per available mode."""

from __future__ import annotations

import importlib.util
import json

import soundfile as sf

from leapvox.app.cli import main
from leapvox.engine.options import MODES

from .conftest import FIXTURES

MODEL = FIXTURES / "tiny-0b6"


def test_compare_writes_table_wavs_and_json(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "Hello there. Bye.", "--model", str(MODEL), "--out", str(out), "--max-frames", "3"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    header, *rows = stdout.strip().splitlines()
    assert header.split()[:3] == ["mode", "xRT", "tok/call"] and "first audio s" in header and "KV MB" in header
    assert [r.split()[0] for r in rows] == [*MODES, "auto"]  # every mode, then what auto runs (models.auto)
    record = json.loads((out / "compare.json").read_text())
    assert record["seed"] == 0 and list(record["modes"]) == [*MODES, "auto"]
    for name, r in record["modes"].items():
        audio, sr = sf.read(out / r["wav"])
        assert sr == 24000 and r["frames"] == 6 and r["audio_s"] == len(audio) / sr
        assert r["xrt"] > 0 and r["tok_per_call"] > 0 and r["first_audio_s"] > 0 and r["kv_mb"] > 0
        assert r["mode"] == (record["auto"]["mode"] if name == "auto" else name) and r["predictor_calls_per_s"] > 0
    has_plot = importlib.util.find_spec("matplotlib") is not None
    assert (out / "compare.png").exists() == has_plot and (record["plot"] is not None) == has_plot
    assert "wrote" in err


def test_compare_unknown_mode_is_a_usage_error(tmp_path, capsys):
    assert main(["compare", "Hi.", "--model", str(MODEL), "--out", str(tmp_path), "--modes", "warp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown mode 'warp'" in err[0] and "ar" in err[0]
