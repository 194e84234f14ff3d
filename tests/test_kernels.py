"""engine.kernels: the optional compiled w8a8 and w4a8 kernels (their layouts, their arithmetic, and the fallback to
torch's)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leapvox.engine.fast import kernels
from leapvox.engine.fast.quant import W4A8Linear, W8A8Linear


def reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The kernel's arithmetic in float64: x quantized per row to u8 with a zero point, exact integer dots."""
    lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
    sx = (hi - lo) / 255
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    zx = torch.round(-lo / sx).clamp(0, 255)
    qx = (torch.round(x / sx[:, None]) + zx[:, None]).clamp(0, 255).double()
    y = sx[:, None].double() * s.double() * (qx @ w.double().T - zx[:, None].double() * w.double().sum(1))
    return y if b is None else y + b.double()


def op_or_skip(f, why: str, what: str, instead: str):
    """The compiled op, or a skip that says why it is not here and what covers the path it replaces."""
    if f is None:
        pytest.skip(f"the compiled {what} is not available here ({why}); {instead}")
    return f


@pytest.fixture
def op():
    return op_or_skip(kernels.w8a8_op(), kernels.unavailable_reason(), "w8a8 kernel",
                      "torch's kernels are tested by test_quant.py")


@pytest.fixture
def fresh_state(monkeypatch, tmp_path):
    """A process state in which the kernel was never looked for, with an empty build cache."""
    monkeypatch.setattr(kernels, "_STATE", {})
    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("n,k", [(1, 1), (3, 63), (64, 64), (65, 5), (130, 9), (16, 1024)])
def test_pack_round_trip(n, k):
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=torch.Generator().manual_seed(n * k))
    packed = kernels.pack(w)
    assert packed.shape == (-(-n // 64), -(-k // 4), 64, 4)
    assert torch.equal(kernels.unpack(packed, n, k), w)
    assert int(packed.abs().sum()) == int(w.abs().sum())  # padding is zeros


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 17])
@pytest.mark.parametrize("k,n", [(64, 4), (100, 7), (1024, 30), (201, 1), (66, 130)])
def test_kernel_matches_its_arithmetic(op, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=g) * 3
    x[0, 0] = 40.0  # an outlier sets the row's range
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    s, b = torch.rand(n, generator=g) + 0.1, torch.randn(n, generator=g)
    for bias in (None, b):
        y = op(x, kernels.pack(w), s, w.sum(1, dtype=torch.int32), bias)
        ref = reference(x, w, s, bias)
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_rows_are_independent(op):
    """Each row is quantized on its own: a multi-row call equals one call per row, bit for bit (so a verify call
    over a draft tree computes the root row exactly as an ar call does)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 192, generator=g) * torch.tensor([1.0, 10.0, 0.1, 3.0, 0.0, 7.0])[:, None]
    w = torch.randint(-127, 128, (37, 192), dtype=torch.int8, generator=g)
    s, ws = torch.rand(37, generator=g), w.sum(1, dtype=torch.int32)
    whole = op(x, kernels.pack(w), s, ws, None)
    for i in range(6):
        assert torch.equal(whole[i : i + 1], op(x[i : i + 1], kernels.pack(w), s, ws, None))
    assert torch.equal(whole[4], torch.zeros(37))  # an all-zero row gives zeros, not NaN


@pytest.mark.parametrize("m,k,n", [(5, 64, 9), (16, 1024, 70), (37, 2048, 130), (126, 1024, 64)])
def test_many_rows_give_the_bits_of_one_row_at_a_time(op, m, k, n):
    """Calls over 5+ rows take AMX-INT8 tiles where this CPU and Linux grant them (the same integer sums as the
    VNNI loop): every row is still exactly what a one-row call gives, with or without a bias."""
    g = torch.Generator().manual_seed(m + k + n)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 5
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    s, b, ws = torch.rand(n, generator=g) + 0.1, torch.randn(n, generator=g), w.sum(1, dtype=torch.int32)
    for bias in (None, b):
        whole = op(x, kernels.pack(w), s, ws, bias)
        rows = torch.cat([op(x[i : i + 1], kernels.pack(w), s, ws, bias) for i in range(m)])
        assert torch.equal(whole, rows)
        ref = reference(x, w, s, bias)
        assert ((whole.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_amx_only_where_the_cpu_has_it_and_the_switch_turns_it_off(op):
    if kernels.amx_enabled():
        assert "amx_int8" in kernels.cpu_flags() and "AMX" in kernels.describe()
    code = "from leapvox.engine.fast import kernels; print(kernels.amx_enabled(), kernels.describe())"
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LEAPVOX_AMX="0"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False leapvox") and "AMX" not in r.stdout


def test_kernel_rejects_a_layout_it_was_not_given(op):
    w = torch.zeros(8, 64, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="packed"):
        op(torch.randn(1, 64), w, torch.ones(8), torch.zeros(8, dtype=torch.int32), None)
    with pytest.raises(RuntimeError, match="features"):
        op(torch.randn(1, 200), kernels.pack(w), torch.ones(8), torch.zeros(8, dtype=torch.int32), None)


def test_w8a8_linear_uses_it_and_keeps_one_copy(op):
    lin = torch.nn.Linear(128, 24)
    q = W8A8Linear.from_linear(lin)
    assert q.op is not None and q.packed is None
    x = torch.randn(3, 128)
    ref = x @ q.weight.T + q.bias
    assert ((q(x) - ref).abs().max() / ref.abs().max()).item() < 0.05
    assert torch.equal(q.codes, kernels.unpack(q.wpack, 24, 128))
    # the codes, scales and bias it reports are what it multiplies with
    assert torch.allclose(q.weight, q.codes.float() * q.scales[:, None])


def test_turned_off_falls_back_to_torch(fresh_state, monkeypatch):
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert kernels.w8a8_op() is None
    assert "turned off" in kernels.unavailable_reason()
    assert kernels.describe().startswith("torch's")
    q = W8A8Linear.from_linear(torch.nn.Linear(64, 8, bias=False))
    assert q.op is None and q.packed is not None
    x = torch.randn(2, 64)
    ref = x @ q.weight.T
    assert ((q(x) - ref).abs().max() / ref.abs().max()).item() < 0.05
    assert not any(fresh_state.rglob("*.so"))  # nothing was built


def test_the_build_cache_is_under_leapvox_home_and_paths_lists_it(monkeypatch, tmp_path, capsys):
    """Everything leapvox keeps goes under $LEAPVOX_HOME when it is set, the compiled kernels too (they went to
    ~/.cache/leapvox/kernels), and `leapvox paths` says where; without it, the platform's cache folder."""
    from leapvox.app.cli import main
    from leapvox.models.paths import leapvox_dirs

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))
    assert kernels.cache_dir() == tmp_path / "cache" / "kernels" == leapvox_dirs()["kernels"]
    assert main(["paths"]) == 0
    assert ("kernels", str(tmp_path / "cache" / "kernels")) in [tuple(ln.split()) for ln in capsys.readouterr().out
                                                                 .splitlines()]
    monkeypatch.delenv("LEAPVOX_HOME")
    assert kernels.cache_dir() == leapvox_dirs()["kernels"] == leapvox_dirs()["cache"] / "kernels"


def test_a_failing_build_falls_back_and_leaves_nothing(tmp_path):
    """In a fresh process (this one may have loaded the library already): a compiler that fails gives torch's
    kernels, a one-line reason, and an empty cache folder."""
    if kernels._static_reason() is not None:
        pytest.skip(f"the kernel is not built on this machine at all ({kernels._static_reason()})")
    env = dict(os.environ, CXX="false", LEAPVOX_HOME=str(tmp_path))  # `false`: a "compiler" that fails at once
    code = ("from leapvox.engine.fast import kernels; "
            f"kernels.PREBUILT_DIR = kernels.Path({str(tmp_path / 'none')!r}); "
            "print(kernels.w8a8_op() is None); print(kernels.unavailable_reason())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    none, reason = r.stdout.splitlines()
    assert none == "True" and reason.startswith("the build failed")
    folder = tmp_path / "cache" / "kernels"
    assert folder.is_dir() and not any(folder.iterdir())  # no library, no half-written part file


def _without_a_compiler(prebuilt: Path, cache: Path) -> list[str]:
    """In a fresh process with no C++ compiler and an empty build cache, looking in `prebuilt`: describe(), whether
    w8a8 and w4a8 run on leapvox's kernels, unavailable_reason() and describe_fp32()."""
    code = (f"from leapvox.engine.fast import kernels; kernels.PREBUILT_DIR = kernels.Path({str(prebuilt)!r}); "
            "kernels._compiler = lambda: None; print(kernels.describe()); print(kernels.w8a8_op() is not None); "
            "print(kernels.w4a8_op() is not None); print(kernels.unavailable_reason()); "
            "print(kernels.describe_fp32())")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LEAPVOX_HOME=str(cache)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not any(cache.rglob("*.so")), "nothing may be built without a compiler"
    return r.stdout.splitlines()


def test_a_prebuilt_library_runs_without_a_compiler(op, tmp_path):
    """`python -m leapvox.engine.fast.kernels prebuild` (what packaging/build.sh runs for the bundle) places a library
    that a process with no compiler and no build cache loads, checks and uses."""
    out = tmp_path / "prebuilt"
    r = subprocess.run([sys.executable, "-m", "leapvox.engine.fast.kernels", "prebuild", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lib, fp32 = map(Path, r.stdout.split())
    assert lib.parent == out and lib.name == kernels._prebuilt_name() and lib.stat().st_mode & 0o777 == 0o644
    assert fp32.parent == out and fp32.name == kernels._prebuilt_name(kernels.FP32_SOURCES, kernels.FP32_FLAGS)
    assert sorted(p.name for p in out.iterdir()) == sorted([lib.name, fp32.name])  # no part file left
    described, w8a8, w4a8, reason, fp32_layer = _without_a_compiler(out, tmp_path / "cache")
    assert described.startswith("leapvox AVX-512 VNNI kernel (prebuilt")
    assert (w8a8, w4a8, reason) == ("True", "True", "None")
    assert fp32_layer == "leapvox's compiled fp32 layer (prebuilt)"


def test_a_prebuilt_library_for_other_sources_or_broken_is_not_used(op, tmp_path):
    """Only the name made from these sources and this torch is looked at, and a library that does not load falls
    back to torch's kernels with a reason."""
    out = tmp_path / "prebuilt"
    out.mkdir()
    stale = kernels.prebuild(out).rename(out / "leapvox-0123456789abcdef.so")  # a real library, another name
    described, w8a8, _, reason, _ = _without_a_compiler(out, tmp_path / "cache1")
    assert described.startswith("torch's") and w8a8 == "False" and reason.startswith("no C++ compiler")
    stale.unlink()
    (out / kernels._prebuilt_name()).write_bytes(b"not a library")
    described, w8a8, _, reason, _ = _without_a_compiler(out, tmp_path / "cache2")
    assert described.startswith("torch's") and w8a8 == "False" and reason.startswith("it could not be loaded")


def test_a_broken_prebuilt_library_is_built_afresh_where_a_compiler_is(op, tmp_path):
    out = tmp_path / "prebuilt"
    out.mkdir()
    (out / kernels._prebuilt_name()).write_bytes(b"not a library")
    code = (f"from leapvox.engine.fast import kernels; kernels.PREBUILT_DIR = kernels.Path({str(out)!r}); "
            "print(kernels.describe())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)  # the build cache
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("leapvox AVX-512 VNNI kernel (built here")
    assert "the prebuilt kernel library did not load" in r.stderr


def test_doctor_hints_at_a_compiler_only_where_that_is_what_is_missing(fresh_state, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT_DIR", fresh_state / "none")
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= kernels.cpu_flags() and sys.platform == "linux":
        assert "apt install g++" in kernels.hint()  # the only thing missing here is the compiler
    else:
        assert kernels.hint() is None  # a compiler would not help on this CPU
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    monkeypatch.setattr(kernels, "_STATE", {})
    assert kernels.hint() is None  # turned off on purpose


def test_prebuild_without_a_compiler_says_so(monkeypatch, tmp_path, capsys):
    from leapvox.engine.fast.kernels.__main__ import main

    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    monkeypatch.setattr(kernels.sys, "platform", "linux")
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    assert main(["prebuild", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "leapvox: cannot build the kernels here: no C++ compiler (c++, g++ or clang++; or set CXX)"
    assert not (tmp_path / "out").exists()


def test_prebuild_into_a_folder_it_cannot_make_says_so(monkeypatch, tmp_path, capsys):
    from leapvox.engine.fast.kernels.__main__ import main

    monkeypatch.setattr(kernels, "_build_reason", lambda: None)  # as if it could build (it fails before building)
    monkeypatch.setattr(kernels.sys, "platform", "linux")
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    (tmp_path / "a-file").write_text("")
    assert main(["prebuild", "--out", str(tmp_path / "a-file" / "prebuilt")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"leapvox: cannot write the library into {tmp_path / 'a-file' / 'prebuilt'}: ")
    assert err.endswith("choose a writable folder with --out") and "\n" not in err


# ---- w4a8: 4-bit weights in groups of 64, 8-bit activations per row and group -------------------------------------


@pytest.mark.parametrize("n,k", [(1, 64), (3, 128), (64, 64), (65, 192), (130, 1024)])
def test_pack4_round_trip(n, k):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * k))
    codes, scales, mins = kernels.quantize4(w)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15 and scales.shape == mins.shape == (n, k // 64)
    nibbles, sm = kernels.pack4(codes, scales, mins)
    assert nibbles.shape == (-(-n // 64), k // 8, 64, 4) and sm.shape == (-(-n // 64), k // 64, 2, 64)
    back = kernels.unpack4(nibbles, sm, n)
    assert all(torch.equal(a, b) for a, b in zip(back, (codes, scales, mins), strict=True))
    # each weight within half a step of its 4-bit value (plus the fp16 rounding of the group's min)
    err = (kernels.dequantize4(codes, scales, mins) - w).abs().reshape(n, k // 64, 64)
    assert bool((err <= scales.float()[..., None] * 0.5 + 1e-3 * w.abs().max()).all())


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 17])
@pytest.mark.parametrize("k,n", [(64, 4), (128, 70), (1024, 30), (192, 130)])
def test_w4a8_kernel_matches_its_arithmetic(op, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=g) * 3
    x[0, 0] = 40.0  # an outlier sets its group's scale
    codes, scales, mins = kernels.quantize4(torch.randn(n, k, generator=g))
    nibbles, sm = kernels.pack4(codes, scales, mins)
    b = torch.randn(n, generator=g)
    for bias in (None, b):
        y = kernels.w4a8_op()(x, nibbles, sm, n, bias)
        ref = kernels.w4a8_reference(x, codes, scales, mins) + (0 if bias is None else bias.double())
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_w4a8_rows_are_independent_and_zero_rows_give_zeros(op):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 192, generator=g) * torch.tensor([1.0, 10.0, 0.1, 3.0, 0.0, 7.0])[:, None]
    nibbles, sm = kernels.pack4(*kernels.quantize4(torch.randn(37, 192, generator=g)))
    w4 = kernels.w4a8_op()
    whole = w4(x, nibbles, sm, 37, None)
    for i in range(6):
        assert torch.equal(whole[i : i + 1], w4(x[i : i + 1], nibbles, sm, 37, None))
    assert torch.equal(whole[4], torch.zeros(37))


def test_a_w4a8_op_that_fails_its_check_is_not_offered(op, monkeypatch):
    from leapvox.engine.fast.quant import w4a8_unavailable_reason

    monkeypatch.setitem(kernels._STATE, "w4a8_ok", False)  # as if the check had failed on this CPU
    assert kernels.w4a8_op() is None and kernels.w8a8_op() is not None
    assert "self-check" in w4a8_unavailable_reason()
    monkeypatch.delitem(kernels._STATE, "w4a8_ok")
    assert kernels.w4a8_op() is not None and kernels._STATE["w4a8_ok"] is True  # the real check passes here


def test_w4a8_kernel_rejects_a_layout_it_was_not_given(op):
    nibbles, sm = kernels.pack4(*kernels.quantize4(torch.randn(8, 128)))
    w4 = kernels.w4a8_op()
    with pytest.raises(RuntimeError, match="features"):
        w4(torch.randn(1, 64), nibbles, sm, 8, None)
    with pytest.raises(RuntimeError, match="fp16"):
        w4(torch.randn(1, 128), nibbles, sm.view(torch.float16), 8, None)
    with pytest.raises(RuntimeError, match="blocks"):
        w4(torch.randn(1, 128), nibbles, sm, 65, None)


def test_w4a8_linear_is_a_4_bit_layer(op):
    lin = torch.nn.Linear(256, 24)
    q = W4A8Linear.from_linear(lin)
    x = torch.randn(3, 256)
    ref = x @ q.weight.T + q.bias
    assert ((q(x) - ref).abs().max() / ref.abs().max()).item() < 0.05  # 8-bit activations against its own weights
    exact = lin(x).detach()
    assert 0.005 < ((q(x) - exact).norm() / exact.norm()).item() < 0.2  # 4 bits: a few percent off the fp32 layer
    assert torch.equal(q.weight, kernels.dequantize4(*q.unpacked()))
    assert q.wpack.numel() == 24 * 256 // 2 + 40 * 256 // 2  # rows padded to 64: 4 bits each
    plain = W4A8Linear.from_linear(torch.nn.Linear(256, 24, bias=False))
    before = plain(x)
    plain.to(torch.bfloat16)  # a model-wide dtype change leaves the packed weight alone (its scales are int16 bits)
    assert plain.wscale.dtype == torch.int16 and torch.equal(plain(x), before)


# ---- the fused decoder layer (engine/fast/fused.py, `qwen3_layer` in w8a8.cpp) -------------------------------------


def random_stack(head_dim: int, intermediate: int):
    """A random 2-layer fp32 Qwen3 stack, 256 wide, 8 query and 2 KV heads."""
    from leapvox.engine.config import TransformerConfig
    from leapvox.engine.nets.transformer import DecoderStack

    torch.manual_seed(0)
    cfg = TransformerConfig(hidden_size=256, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=head_dim)
    stack = DecoderStack(cfg).eval()
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norms away from 1, so a mixed-up weight would show
    return stack


def w8a8_stack(head_dim: int = 64, weights: str = "w8a8"):
    """A random 2-layer Qwen3 stack in w8a8 (or w4a8) as the loader builds it (fused q/k/v and gate/up, rotated down
    input), before its layers are swapped for compiled ones (fused.fuse_stack_layers)."""
    from leapvox.engine.fast.quant import fuse_layers, quantized_linear

    stack = random_stack(head_dim, 768)
    for layer in stack.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, quantized_linear(child, weights, name))
    assert fuse_layers(stack.layers) == 4  # q/k/v and gate/up in each of the 2 layers
    return stack


def run_stack(stack, fused: bool):
    """A prefill of 7 rows, one decode step, then 3 rows under a tree-like mask at repeated positions."""
    from leapvox.engine.fast import fused as fusion

    g = torch.Generator().manual_seed(1)
    x, step = torch.randn(1, 7, 256, generator=g), torch.randn(1, 1, 256, generator=g)
    rows = torch.randn(1, 3, 256, generator=g)
    mask = torch.rand(3, 11, generator=g) > 0.3
    mask[:, 0] = True
    stack.setup_cache(16)
    for c in stack.caches:
        c.k.zero_()
        c.v.zero_()
    with contextlib.nullcontext() if fused else fusion.disabled(), torch.inference_mode():
        outs = [stack(x, 0), stack(step, 7), stack(rows, 8, mask=mask, positions=torch.tensor([8, 9, 9]))]
    return outs + [c.k.clone() for c in stack.caches] + [c.v.clone() for c in stack.caches]


@pytest.mark.parametrize("weights", ["w8a8", "w4a8"])
def test_fused_layer_equals_the_module_path(op, weights):
    """The one parity test of the C++ backend (`qwen3_layer`, as fused.FusedDecoderLayer) against the Python decoder
    layer (transformer.DecoderLayer, the module path of the same weights)."""
    from leapvox.engine.fast import fused as fusion
    from leapvox.engine.fast.quant import W4A8Linear

    stack = w8a8_stack(weights=weights)
    assert all(isinstance(layer.mlp.down_proj, W4A8Linear) == (weights == "w4a8") for layer in stack.layers)
    assert fusion.fuse_stack_layers(stack.layers) == 2
    assert all(isinstance(layer, fusion.FusedDecoderLayer) for layer in stack.layers)
    fast, slow = run_stack(stack, True), run_stack(stack, False)
    # the same products; norms, RoPE, attention and the Hadamard rotation in another order of operations, so the
    # activations reaching a product can differ in their last bit and, now and then, one of them rounds to the next
    # 8-bit step (measured over 90 random causal layer calls of 2-4 rows: 5 in w8a8 and 6 in w4a8, moving the
    # output by up to 8e-3 of its largest value). These inputs give no such step in w8a8 (the difference is fp32
    # rounding alone) and a few in w4a8 (7e-3).
    tol = 1e-4 if weights == "w8a8" else 2e-2
    for a, b in zip(fast, slow, strict=True):
        assert ((a - b).abs().max() / b.abs().max()).item() < tol
    assert not torch.equal(fast[0], slow[0])  # really two computations (the module path is not the fused one)


def test_fused_layer_writes_every_kv_repeat_and_reads_the_first(op):
    """The kernel takes K/V buffers [nkv, R, P, D] with each KV head repeated R times: every copy is written (the
    engine's callers pass R = 1, a KVCache's layout)."""
    from leapvox.engine.fast import fused as fusion

    stack = w8a8_stack()
    fusion.fuse_stack_layers(stack.layers)
    f = stack.layers[0].kernel
    x = torch.randn(2, 256)
    stack.setup_cache(8)
    cos, sin = stack.rope_cos[:2], stack.rope_sin[:2]
    one = [torch.zeros(2, 1, 8, 64) for _ in range(2)]
    four = [torch.zeros(2, 4, 8, 64) for _ in range(2)]
    mask = torch.tensor([[True, False], [True, True]])
    with torch.inference_mode():
        a = f(x, *one, 0, cos, sin, mask, 2)
        b = f(x, *four, 0, cos, sin, None, 2)  # no mask: causal, the same rows
    assert torch.equal(a, b)
    for r in range(4):
        assert torch.equal(four[0][:, r], one[0][:, 0]) and torch.equal(four[1][:, r], one[1][:, 0])
    assert four[0][:, :, 2:].abs().sum() == 0  # nothing past the rows written


def test_fused_layer_only_for_shapes_it_takes(op):
    from leapvox.engine.fast import fused as fusion

    stack = w8a8_stack(head_dim=48)  # not a multiple of 32: the module path
    assert fusion.fuse_stack_layers(stack.layers) == 0 and not any(fusion.takes(layer) for layer in stack.layers)
    with torch.inference_mode():
        stack.setup_cache(4)
        assert stack(torch.randn(1, 2, 256), 0).shape == (1, 2, 256)


# ---- the portable fp32 decoder layer (fp32.cpp, fused.fuse_fp32_layers) --------------------------------------------


@pytest.fixture
def fp32_op():
    return op_or_skip(kernels.fp32_layer_op(), kernels.fp32_unavailable_reason(), "fp32 layer",
                      "the module path it replaces is tested everywhere else")


def fp32_stack(head_dim: int = 48):
    """A random 2-layer fp32 Qwen3 stack of the demo's kind (head_dim 48: no vector-width multiple)."""
    return random_stack(head_dim, 720)


def test_fp32_layer_equals_the_module_path(fp32_op):
    """The one parity test of the fp32 C++ backend (`qwen3_layer_f32`) against the Python decoder layer: prefill,
    a decode step and masked rows at repeated positions, outputs and every K/V slot, up to fp32 rounding."""
    from leapvox.engine.fast import fused as fusion

    stack = fp32_stack()
    assert fusion.fuse_fp32_stack_layers(stack.layers) == 2
    assert all(isinstance(layer.kernel, fusion.FusedLayerF32) for layer in stack.layers)
    fast, slow = run_stack(stack, True), run_stack(stack, False)
    for a, b in zip(fast, slow, strict=True):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-5
    assert not torch.equal(fast[0], slow[0])  # really two computations


def test_fp32_layer_gives_a_row_the_same_bits_alone_or_among_others(fp32_op):
    """Spec's verify call holds the root row that an ar call would compute alone: the kernel sums every value in one
    order whatever the rows, so the root row's output and K/V are bit-identical."""
    from leapvox.engine.fast import fused as fusion

    stack = fp32_stack()
    fusion.fuse_fp32_stack_layers(stack.layers)
    f = stack.layers[0].kernel
    g = torch.Generator().manual_seed(3)
    prefix = torch.randn(5, 256, generator=g)
    rows = torch.randn(9, 256, generator=g)
    stack.setup_cache(16)
    cos, sin = stack.rope_cos, stack.rope_sin
    outs, caches = [], []
    with torch.inference_mode():
        for n in (1, 9):
            kc, vc = torch.zeros(2, 1, 16, 48), torch.zeros(2, 1, 16, 48)
            f(prefix, kc, vc, 0, cos[:5], sin[:5], None, 5)
            mask = torch.ones(n, 5 + n, dtype=torch.bool)
            mask[:, 5:] = torch.eye(n, dtype=torch.bool)  # each row sees the prefix and itself
            outs.append(f(rows[:n], kc, vc, 5, cos[5 : 5 + n], sin[5 : 5 + n], mask, 5 + n))
            caches.append((kc[:, :, 5].clone(), vc[:, :, 5].clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


def test_fp32_layer_only_for_plain_fp32_layers(fp32_op):
    from leapvox.engine.fast import fused as fusion

    stack = fp32_stack()
    stack.layers[0].self_attn.q_proj = torch.nn.Linear(256, 8 * 48, bias=True)  # a bias: the module path
    stack.layers[1].to(torch.bfloat16)
    assert not fusion.takes_fp32(stack.layers[0]) and not fusion.takes_fp32(stack.layers[1])
    assert fusion.fuse_fp32_stack_layers(stack.layers) == 0
    assert fusion.fuse_fp32_stack_layers(fp32_stack(head_dim=32).layers) == 2


def test_the_loader_fuses_a_narrow_fp32_model_only(fp32_op):
    """load_checkpoint swaps the demo's fp32 layers (talker 4, predictor 2) for compiled ones, not in another weight
    format."""
    from leapvox.engine.fast import fused as fusion
    from leapvox.models.catalog import ASSETS
    from leapvox.models.checkpoint import load_checkpoint

    def fused_layers(weights):
        tts = load_checkpoint(ASSETS / "demo", weights).tts
        layers = [*tts.talker.model.layers, *tts.talker.code_predictor.model.layers]
        return sum(isinstance(layer, fusion.FusedDecoderLayer) for layer in layers), len(layers)

    assert fused_layers("fp32") == (6, 6)
    assert fused_layers("bf16") == (0, 6)


def test_a_first_load_does_not_wait_for_the_fp32_build(fp32_op, tmp_path):
    """With nothing built, the loader's call starts the build in a detached process and goes without (a first
    `speak` of the demo never waits for an optional compile); the next process finds the library and fuses."""
    import time

    env = dict(os.environ, LEAPVOX_HOME=str(tmp_path))  # an empty build cache
    code = ("import time; t0 = time.perf_counter(); from leapvox.engine.fast import kernels; "
            "from leapvox.models.catalog import ASSETS; from leapvox.models.checkpoint import load_checkpoint; "
            "tts = load_checkpoint(ASSETS / 'demo', 'fp32').tts; "
            "print(sum(type(x).__name__ == 'FusedDecoderLayer' for x in tts.talker.model.layers)); "
            "print(kernels.describe_fp32())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    fused, described = r.stdout.splitlines()
    assert fused == "0" and "being built in the background for the next run" in described
    assert "building" not in r.stderr  # no notice: nothing waited
    folder = tmp_path / "cache" / "kernels"
    deadline = time.monotonic() + 240
    while not list(folder.glob("*.so")) or list(folder.glob("*.building")):
        assert time.monotonic() < deadline, "the background build did not finish"
        time.sleep(0.5)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["4", "leapvox's compiled fp32 layer (built here)"]


# ---- the codec's kernels (codec.cpp) -------------------------------------------------------------------------------


def test_snake_kernel_matches_the_torch_composite(op):
    from leapvox.engine.fast.codec_ops import FastCodecOps
    from leapvox.engine.nets.codec import SnakeBeta, use_ops

    torch.manual_seed(0)
    snake = use_ops(SnakeBeta(24), FastCodecOps())
    with torch.no_grad():
        snake.alpha.normal_(0, 1)
        snake.beta.normal_(0, 1)
    x = torch.randn(2, 24, 101) * 5  # a length that is not a multiple of 16: the masked tail too
    with torch.inference_mode():
        fast = snake(x)
        with kernels.disabled():
            slow = snake(x)
        wide = torch.linspace(-3000, 3000, 50001)[None, None]
        one = use_ops(SnakeBeta(1), FastCodecOps())
        wide_fast = one(wide)
    assert not torch.equal(fast, slow)  # really the kernel
    assert (fast - slow).abs().max().item() < 1e-5 * slow.abs().max().item()
    ref = (wide.double() + torch.sin(wide.double()) ** 2 / (1 + 1e-9)).float()
    assert (wide_fast - ref).abs().max().item() <= 3e-4  # ~1 ulp of |x| = 3000: the reduction holds far out


def test_overlap_add_kernel_keeps_the_bits_and_streams(op):
    from leapvox.engine.fast.codec_ops import FastCodecOps
    from leapvox.engine.nets.codec import CausalTransConv1d, use_ops

    torch.manual_seed(0)
    for k, s in ((16, 8), (6, 3), (4, 4)):
        conv = use_ops(CausalTransConv1d(32, 24, k, s).eval(), FastCodecOps())
        x = torch.randn(1, 32, 37)
        with torch.inference_mode():
            whole = conv(x)
            cache: dict = {}
            streamed = torch.cat([conv(x[..., a:b], cache) for a, b in ((0, 5), (5, 6), (6, 37))], dim=-1)
            with kernels.disabled():
                composite = conv(x)
        assert torch.equal(whole, composite) and torch.equal(streamed, whole), (k, s)


@pytest.mark.parametrize("m,k,n", [(1, 5, 3), (7, 100, 13), (16, 512, 37), (130, 33, 9)])
def test_linear_f32_rounds_each_value_alike_for_any_number_of_rows(op, m, k, n):
    linear = kernels.linear_op()
    g = torch.Generator().manual_seed(m * k + n)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    y = linear(x, w, b)
    ref = x.double() @ w.double().T + b.double()
    assert (y.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    one_by_one = torch.cat([linear(x[i : i + 1], w, b) for i in range(m)])
    assert torch.equal(y, one_by_one)  # the property the codec's streaming relies on
    assert torch.equal(linear(x, w[: n // 2 + 1], None) + b[: n // 2 + 1], y[:, : n // 2 + 1])  # bias added last


def test_codec_window_attention_kernel_equals_the_composite_and_streams(op):
    from leapvox.engine.fast.codec_ops import FastCodecOps
    from leapvox.engine.nets.codec import CodecConfig, PreTransformer, use_ops
    from leapvox.models.recipes.geometry import SPEECH_TOKENIZER

    cfg = CodecConfig.from_dict({**SPEECH_TOKENIZER, "num_hidden_layers": 2})
    torch.manual_seed(0)
    pt = use_ops(PreTransformer(cfg).eval(), FastCodecOps())
    x = torch.randn(1, 90, cfg.latent_dim)  # past the 72-frame window, so the mask and the eviction both matter
    with torch.inference_mode():
        whole = pt(x, {})
        cache: dict = {}
        streamed = torch.cat([pt(x[:, a:b], cache) for a, b in ((0, 1), (1, 17), (17, 90))], dim=1)
        with kernels.disabled():
            composite = pt(x, {})
    assert torch.equal(streamed, whole)
    assert not torch.equal(whole, composite)  # really the kernels
    assert (whole - composite).abs().max().item() < 1e-5 * composite.abs().max().item()
