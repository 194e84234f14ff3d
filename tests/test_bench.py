"""`leapvox bench` (this machine, this model) on the tiny fixture checkpoint, and the developer benchmark
(tests/benchmarks/bench.py) on a tiny random-weight checkpoint: every JSON field filled with a plausible number.

No timing assertions: only that times are positive and finite, and counts and sizes are what the setup implies.
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from tests.benchmarks import bench

from .conftest import FIXTURES


def tiny_configs() -> tuple[dict, dict]:
    cfg = bench.model_config("0.6b")
    cfg.update(
        assistant_token_id=300,
        im_start_token_id=400,
        im_end_token_id=401,
        tts_pad_token_id=402,
        tts_bos_token_id=403,
        tts_eos_token_id=404,
    )
    t = cfg["talker_config"]
    t.update(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        text_vocab_size=512,
        text_hidden_size=48,
        rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
    )
    t["code_predictor_config"].update(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=64,
    )
    codec = copy.deepcopy(bench.SPEECH_TOKENIZER)
    codec["decoder_config"].update(
        latent_dim=64,
        codebook_dim=8,
        decoder_dim=64,
        hidden_size=32,
        intermediate_size=64,
        head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
    )
    return cfg, codec


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    cfg, codec = tiny_configs()
    return bench.build_checkpoint(tmp_path_factory.mktemp("bench") / "tiny", cfg, codec)


def test_official_configs_have_the_published_sizes():
    from leapvox.engine.config import TTSConfig

    small, big = (TTSConfig.from_dict(bench.model_config(s)) for s in ("0.6b", "1.7b"))
    assert (small.talker.hidden_size, big.talker.hidden_size) == (1024, 2048)
    assert small.talker.num_hidden_layers == big.talker.num_hidden_layers == 28
    assert small.talker.code_predictor.hidden_size == big.talker.code_predictor.hidden_size == 1024
    assert big.supports_instruct and not small.supports_instruct


def test_checkpoint_loads_tokenizes_and_is_reused(tiny_folder):
    from leapvox.models.load import load_model

    m = load_model(tiny_folder)
    ids = m.tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert ids == [400, 300, 10, ord("H"), ord("i"), 401]  # assistant is one token; bytes are their own ids
    stamp = (tiny_folder / "model.safetensors").stat().st_mtime_ns
    cfg, codec = tiny_configs()
    assert bench.build_checkpoint(tiny_folder, cfg, codec) == tiny_folder
    assert (tiny_folder / "model.safetensors").stat().st_mtime_ns == stamp  # cached, not rebuilt


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def tiny_result(tiny_folder, tmp_path_factory):
    """One small run (fp32 and int8, every mode, 6 frames) with a rank-acceptance table, as its JSON file holds it."""
    acceptance = tmp_path_factory.mktemp("acc") / "tree.json"
    acceptance.write_text(json.dumps({"N": 8, "rank_acceptance": [[0.6, 0.2, 0.1], [0.7, 0.15], [0.8, 0.1]]}))
    result = bench.run_bench(
        tiny_folder, ["fp32", "int8"], bench.MODES, frames=6, repeats=1, isolate=False, acceptance=acceptance
    )
    return json.loads(json.dumps(result))


def test_bench_fills_every_field(tiny_result):
    result = tiny_result
    assert set(result["formats"]) == {"fp32", "int8"}
    for w, rec in result["formats"].items():
        assert rec["weights"] == w and rec["threads"] >= 1
        assert _positive(rec["bandwidth"]["read_gb_s"]) and _positive(rec["bandwidth"]["copy_gb_s"])
        for key in ("talker_step", "predictor_call", "predictor_call_module"):
            for field in ("min_ms", "median_ms", "floor_ms", "floor_ratio", "bytes"):
                assert _positive(rec[key][field]), (w, key, field)
        for key in ("predictor_frame", "predictor_frame_module"):
            assert _positive(rec[key]["min_ms"]) and _positive(rec[key]["floor_ratio"])
        assert set(rec["verify"]) == {str(n) for n in bench.TREE_SIZES}
        assert all(_positive(v["min_ms"]) for v in rec["verify"].values())
        assert _positive(rec["predictor_frame"]["min_ms"]) and _positive(rec["codec_frame"]["min_ms"])
        assert _positive(rec["memory_peak"]["peak_rss_mb"])
        for mode in bench.MODES:
            run = rec["modes"][mode]
            assert 1 <= run["frames"] <= 6
            assert _positive(run["xrt"]) and _positive(run["first_audio_s"]) and _positive(run["audio_s"])
            assert _positive(run["predictor_ms_per_frame"]) and run["overhead_ms_per_frame"] >= 0
            assert len(run["step_ms"]) == run["frames"] - 1 or run["stop_reason"] == "eos"
        assert rec["modes"]["ar"]["predictor_calls_per_frame"] == 15
        assert rec["modes"]["spec"]["tokens_per_call"] >= 1
        assert rec["modes"]["windowed"]["window"] == 3  # half the frames: the window slides within the run
    fp32, int8 = result["formats"]["fp32"], result["formats"]["int8"]
    assert int8["predictor_call"]["bytes"] < fp32["predictor_call"]["bytes"] / 3  # 1-byte weights read
    f = result["fidelity"]["int8"]
    assert f["frames"] >= 1 and 0 <= f["codes1_15_greedy_agreement"] <= 1
    text = bench.table(result)
    assert "talker step ms" in text and "verify N=64" in text and "fidelity" in text and "module loop" in text
    for rows in result["tree"].values():
        assert set(rows) == {str(n) for n in bench.TREE_SIZES}
        assert all(_positive(r["cost"]) and r["tokens_per_call"] >= 1 for r in rows.values())
        assert all(r["speedup"] == pytest.approx(r["tokens_per_call"] / r["cost"]) for r in rows.values())
        assert rows["64"]["tokens_per_call"] >= rows["4"]["tokens_per_call"]  # a bigger tree accepts no less


def test_plots_are_written(tiny_result, tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib (pip install leapvox[plots])")
    paths = bench.plot(tiny_result, tmp_path / "run.json")
    assert [p.name for p in paths] == ["run-tree.png", "run-steps.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    no_table = {**tiny_result, "tree": bench.tree_speedup(tiny_result)}  # cost side only: one panel
    assert "speedup" not in no_table["tree"]["fp32"]["4"]
    assert len(bench.plot(no_table, tmp_path / "cost.json")) == 2


def test_acceptance_file_without_a_table_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert bench.main(["--acceptance", str(bad), "--json", str(tmp_path / "b.json")]) == 2
    assert "rank_acceptance" in capsys.readouterr().err


def test_official_side_is_skipped_with_one_line_when_missing(tiny_folder, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "REFERENCE_PYTHON", tmp_path / "no-python")
    said = []
    result = bench.run_bench(
        tiny_folder, ["int8"], ["ar"], frames=2, repeats=1, isolate=False, official=True, say=said.append
    )
    assert "official" not in result and "reference virtualenv" in result["official_skipped"]
    assert any("skipping the official side" in s for s in said)


def test_official_side_without_a_reference_python_says_how_to_give_one(tiny_folder, monkeypatch):
    monkeypatch.setattr(bench, "REFERENCE_PYTHON", None)
    said = []
    result = bench.run_bench(
        tiny_folder, ["int8"], ["ar"], frames=2, repeats=1, isolate=False, official=True, say=said.append
    )
    assert "official" not in result and "reference virtualenv" in result["official_skipped"]
    why = result["official_skipped"]
    assert "--reference-python" in why and "LEAPVOX_REFERENCE_PYTHON" in why
    assert any("skipping the official side" in s for s in said)


def test_cli_rejects_unknown_formats(capsys):
    from leapvox.app.cli import main

    assert main(["bench", "--weights", "fp32,int3"]) == 2
    err = capsys.readouterr().err
    assert "int3" in err and "hint" in err
    assert bench.main(["--weights", "fp32,int3"]) == 2  # the developer benchmark too
    err = capsys.readouterr().err
    assert "int3" in err and "hint" in err


def test_user_bench_reports_medians_of_every_mode_and_format(tmp_path, capsys):
    """`leapvox bench` through the speaking path: every mode x format, medians over interleaved rounds."""
    from leapvox.app.cli import main

    out = tmp_path / "b.json"
    args = ["bench", "--model", str(FIXTURES / "tiny-0b6"), "--weights", "fp32,int8", "--rounds", "2"]
    assert main([*args, "--max-frames", "4", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rounds"] == 2 and result["threads"] >= 1
    assert set(result["results"]) == set(bench.MODES)
    for mode, per in result["results"].items():
        assert set(per) == {"fp32", "int8"}
        for w, rec in per.items():
            assert 1 <= rec["frames"] <= 4 and _positive(rec["audio_s"])
            assert _positive(rec["xrt"]) and _positive(rec["first_audio_s"])
            assert len(rec["xrt_runs"]) == len(rec["first_audio_runs"]) == 2
            assert min(rec["xrt_runs"]) <= rec["xrt"] <= max(rec["xrt_runs"])
            assert any(line.split()[:2] == [mode, w] for line in table.splitlines())
    assert result["results"]["spec"]["fp32"]["tokens_per_call"] >= 1
    assert "first audio s" in table and "xRT" in table


def test_user_bench_checks_its_options_before_loading(tmp_path, capsys):
    from leapvox.app.cli import main

    assert main(["bench", "--rounds", "0"]) == 2
    assert main(["bench", "--modes", "beam"]) == 2
    assert main(["bench", "--json", str(tmp_path / "no" / "such" / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "--rounds" in err and "beam" in err and "does not exist" in err


def test_worker_process_returns_the_same_record(tiny_folder):
    rec = bench.run_format(tiny_folder, "int8", frames=2, repeats=1, modes=["ar"], isolate=True)
    assert rec["weights"] == "int8" and set(rec["modes"]) == {"ar"} and rec["modes"]["ar"]["frames"] >= 1
    assert not (tiny_folder / "last-int8.json").exists()  # nothing written into a folder we were only given


def test_user_bench_by_default_leaves_out_a_format_this_machine_cannot_run(tmp_path):
    """Without leapvox's kernel (LEAPVOX_KERNELS=0) w4a8 does not run: the default "every format" says so and goes on
    with the others; asked for by name it is an error (test_quant.py)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "b.json"
    code = ("import sys; from leapvox.app.cli import main; sys.exit(main(['bench', '--model', sys.argv[1], "
            "'--modes', 'ar', '--rounds', '1', '--max-frames', '2', '--json', sys.argv[2]]))")
    r = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "tiny-0b6"), str(out)], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, LEAPVOX_KERNELS="0"))
    assert r.returncode == 0, r.stderr
    assert "leaving out w4a8: it needs leapvox's compiled CPU kernel" in r.stderr
    done = set(json.loads(out.read_text())["results"]["ar"])
    assert done == {"fp32", "bf16", "int8", "w8a8", "int4"}
