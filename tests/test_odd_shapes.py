"""Layer widths that are not multiples of 8, 16 or 64: every weight format and mode runs, int8 products are right.

`aten._weight_int8pack_mm` (the int8 kernel) segfaults or returns wrong numbers unless the weight's input width is
a multiple of 16 (engine/fast/quant.py has the measured table). The crash-prone parts run in a subprocess, so a
segfault fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from .conftest import FIXTURES

# talker: hidden 40, MLP 56 (q/k/v, gate/up read 40 wide, down reads 56); predictor: hidden 32, MLP 56, 2 heads
# of 12 (o_proj reads 24 wide, down reads 56); the input projection 40 -> 32 (with a bias) is quantized too
TALKER = {"hidden_size": 40, "intermediate_size": 56}
PREDICTOR = {"hidden_size": 32, "intermediate_size": 56, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 12}
TEXT = "Hello there, odd shapes."


def _run(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _explain(p: subprocess.CompletedProcess) -> str:
    how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}"
    return f"subprocess {how}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"


@pytest.fixture(scope="module")
def odd_checkpoint(tmp_path_factory):
    """tiny-0b6's folder (tokenizer, codec, generation config) with odd talker and predictor widths and random
    weights under the official key names."""
    from safetensors.torch import save_file

    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.talker import TTSModel

    folder = tmp_path_factory.mktemp("odd") / "tiny-odd"
    shutil.copytree(FIXTURES / "tiny-0b6", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["talker_config"].update(TALKER)
    cfg["talker_config"]["code_predictor_config"].update(PREDICTOR)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(0)
    model = TTSModel(TTSConfig.from_dict(cfg).talker)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0 if "embedding" in name else 1.0 / p.shape[1] ** 0.5)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_odd_checkpoint_has_the_widths_the_kernel_cannot_take(odd_checkpoint):
    from leapvox.engine.fast.quant import kernel_ok, quantizable_linears
    from leapvox.models.checkpoint import load_checkpoint

    m = load_checkpoint(odd_checkpoint, "fp32")
    widths = {lin.in_features for _, _, lin in quantizable_linears(m.tts)}
    assert {24, 40, 56} <= widths  # predictor o_proj, talker q/k/v/gate/up + input projection, both down_proj
    assert not all(kernel_ok(k) for k in widths)


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "w8a8", "w4a8", "int4"])
def test_every_mode_runs_on_odd_widths(odd_checkpoint, tmp_path, weights):
    if weights == "w4a8":
        from leapvox.engine.fast.quant import w4a8_unavailable_reason

        if w4a8_unavailable_reason():
            pytest.skip(f"w4a8 does not run here: {w4a8_unavailable_reason()}")
    out = tmp_path / "out"
    out.mkdir()
    p = _run(f"""
        import sys
        from leapvox.app.cli import main
        for mode in ("ar", "spec", "windowed"):
            print("mode", mode, flush=True)
            path = {str(out)!r} + "/" + mode + ".wav"
            rc = main(["speak", {TEXT!r}, "-o", path, "--model", {str(odd_checkpoint)!r}, "--weights", {weights!r},
                       "--mode", mode, "--max-frames", "4", "--seed", "0"])
            if rc:
                sys.exit(f"{{mode}}: leapvox speak returned {{rc}}")
        print("all modes ok", flush=True)
    """)
    assert p.returncode == 0 and "all modes ok" in p.stdout, _explain(p)
    for mode in ("ar", "spec", "windowed"):
        assert (out / f"{mode}.wav").stat().st_size > 44, mode  # more than a WAV header


def test_int8_products_on_odd_widths_equal_the_dequantized_weight():
    """Int8Linear and the predictor loop's `product` over 1..17 rows, for input widths the kernel cannot take (and
    ones it can), against the dequantized weight with bf16 activations."""
    p = _run("""
        import torch, torch.nn.functional as F
        from torch import nn
        from leapvox.engine.fast.predictor import product
        from leapvox.engine.fast.quant import Int8Linear, dequantize
        torch.manual_seed(0)
        for k in (8, 24, 40, 56, 72, 20, 33, 64, 1024):
            for n in (3, 32, 56):
                q = Int8Linear.from_linear(nn.Linear(k, n, bias=False))
                fns = {"module": q, "product": product(q, split=True, rows=True)}
                for rows in (1, 2, 3, 5, 17):
                    x = torch.randn(rows, k)
                    ref = F.linear(x.bfloat16().float(), dequantize(q.codes, q.scales))
                    for name, f in fns.items():
                        with torch.inference_mode():
                            y = f(x)
                        err = float((y - ref).abs().max() / ref.abs().max())
                        assert err < 0.02, (name, k, n, rows, err)
        print("products ok", flush=True)
    """)
    assert p.returncode == 0 and "products ok" in p.stdout, _explain(p)


def test_w8a8_products_on_odd_widths_stay_within_8_bit_activation_error():
    """W8A8Linear (plain, and rotated where a block fits) and the predictor loop's `product` over 1..17 rows, for
    odd input widths, against the weight it stands for, in a forked process (a kernel crash fails the test)."""
    p = _run("""
        import torch, torch.nn.functional as F
        from torch import nn
        from leapvox.engine.fast.predictor import product
        from leapvox.engine.fast.quant import quantized_linear, w8a8_unavailable_reason
        if w8a8_unavailable_reason():
            print("products ok (w8a8 unavailable here)", flush=True)
            raise SystemExit(0)
        torch.manual_seed(0)
        for k in (8, 24, 40, 56, 72, 20, 33, 64, 96, 1024):
            for n in (3, 32, 56):
                for name in ("q_proj", "down_proj"):
                    q = quantized_linear(nn.Linear(k, n, bias=False), "w8a8", name)
                    fns = {"module": q, "product": product(q, split=True, rows=True)}
                    for rows in (1, 2, 3, 5, 17):
                        x = torch.randn(rows, k)
                        ref = F.linear(x, q.weight)
                        size = F.linear(x.abs(), q.weight.abs()).max()  # sum of |x w|: the products' scale
                        for label, f in fns.items():
                            with torch.inference_mode():
                                y = f(x)
                            err = float((y - ref).abs().max() / size)
                            assert err < 0.02, (label, name, k, n, rows, err)
        print("products ok", flush=True)
    """)
    assert p.returncode == 0 and "products ok" in p.stdout, _explain(p)


def test_compare_bench_and_the_tui_run_on_odd_widths_in_int8(odd_checkpoint, tmp_path):
    """The default format through the other front ends: compare (every mode), bench (every mode, one round) and
    the TUI speaking one utterance with a stand-in sound card."""
    p = _run(f"""
        import asyncio, sys
        from leapvox.app.cli import main
        folder = {str(odd_checkpoint)!r}
        rc = main(["compare", "Odd shapes.", "--model", folder, "--weights", "int8", "--max-frames", "3",
                   "--out", {str(tmp_path / "cmp")!r}])
        if rc:
            sys.exit(f"compare returned {{rc}}")
        rc = main(["bench", "--model", folder, "--weights", "int8", "--rounds", "1", "--max-frames", "3"])
        if rc:
            sys.exit(f"bench returned {{rc}}")
        from dataclasses import replace
        from textual.widgets import Button
        from leapvox.app.tui.app import LeapvoxApp
        from leapvox.app.tui.history import History
        from leapvox.models.load import load_model
        from tests.test_tui import fake_players, keys, until

        async def run():
            m = load_model(folder, "int8")
            app = LeapvoxApp(model=m, options=replace(m.defaults, seed=1, max_frames=3),
                             player_factory=fake_players([]))
            async with app.run_test(size=(120, 40)) as pilot:
                await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
                await pilot.press(*keys("Odd shapes."))
                await pilot.click("#speak")
                await until(pilot, lambda: len(app.query_one(History).utterances) == 1)
                assert app.query_one(History).utterances[0].stats.frames == 3
            assert app._exception is None
        asyncio.run(run())
        print("front ends ok", flush=True)
    """)
    assert p.returncode == 0 and "front ends ok" in p.stdout, _explain(p)
