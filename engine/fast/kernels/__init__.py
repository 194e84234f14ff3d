"""Optional compiled CPU kernels, built on this machine on first use, with torch's prebuilt kernels as the fallback.

`w8a8.cpp`: the w8a8 format's linear product on x86-64 CPUs with AVX-512 VNNI (int8 weights in blocks of 64 rows,
4 input features at a time, 8-bit activations quantized per row, exact int32 dot products, blocks split over
torch's own threads). It reads the weights faster than torch's FBGEMM route (`tests/benchmarks/kernels.py`) and
quantizes each row of a multi-row call on its own (so the root row of spec's verify call is computed exactly as
the ar call computes it). Calls over
5+ rows run on AMX-INT8 tiles where the CPU has them and Linux grants them (the packed block is the tile layout;
the same integer sums, so the same bits; `LEAPVOX_AMX=0` turns it off). Also `w4a8_linear` (4-bit weights in
groups of 64: `quantize4`, `pack4`) and `qwen3_layer`: a whole w8a8 / w4a8 decoder layer in one call
(engine/fast/fused.py).
`codec.cpp`: the codec decoder's SnakeBeta in one pass and its transposed convolutions' overlap-add.

Nothing here is needed: leapvox installs with pip alone and runs torch's kernels when this one is not available:
a CPU without AVX-512 VNNI, no C++ compiler (`c++`, or $CXX), no torch headers, `LEAPVOX_KERNELS=0`, or a build or
self-check that failed (`unavailable_reason()` says which; `leapvox doctor` prints it). The build runs once per
torch version and source (about 15-30 s), prints one line, and is cached in leapvox's cache folder (kernels/, under
$LEAPVOX_HOME when that is set, else ~/.cache/leapvox on Linux; `leapvox paths` shows it), written atomically so
concurrent first runs cannot load half a library.

A library prebuilt for exactly these sources and this torch version (`python -m leapvox.engine.fast.kernels prebuild`,
which packaging/build.sh runs so the standalone bundle, which has no compiler or torch headers, gets the kernels
too) is taken from `prebuilt/` next to this file before anything is built; one made for other sources or another
torch is not looked at (its name carries both), and one the loader refuses is built afresh where a compiler is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

SOURCES = [Path(__file__).with_name(name) for name in ("w8a8.cpp", "codec.cpp")]
# the portable fp32 layer (fp32.cpp; fp32_layer_op): plain C++ for the compiler's vectoriser, x86-64-v3 (AVX2, FMA)
FP32_SOURCES = [Path(__file__).with_name("fp32.cpp")]
FP32_FLAGS = ("-mavx2", "-mfma")
FP32_CPU = frozenset({"avx2", "fma"})
COLS, K_GROUP = 64, 4  # the packed layout: blocks of 64 weight rows (output columns), 4 input features at a time
ISA_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
ENV_SWITCH = "LEAPVOX_KERNELS"  # "0": never build or load (torch's kernels only)
PREBUILT_DIR = Path(__file__).with_name("prebuilt")  # libraries made ahead of time (prebuild), e.g. in the bundle

_STATE: dict[str, object] = {}


def notice(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where built libraries are kept: leapvox's cache folder (under $LEAPVOX_HOME when it is set; `leapvox paths`)."""
    from leapvox.engine.dirs import base_dirs

    return base_dirs()["cache"] / "kernels"


def cpu_flags() -> set[str]:
    """This CPU's feature flags as Linux reports them (/proc/cpuinfo); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def bf16_products() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16, read from Linux's /proc/cpuinfo), so
    oneDNN's bf16 convolutions beat fp32 ones; elsewhere False."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _static_reason(needs: frozenset[str] = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
                   sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> str | None:
    """Why the library of `sources` (default: the w8a8 one) cannot run here without trying to build it, or None."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"turned off ({ENV_SWITCH}=0)"
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"written for x86-64 Linux (this is {sys.platform} {platform.machine()})"
    missing = needs - cpu_flags()
    if missing:
        return f"this CPU lacks {', '.join(sorted(missing))}"
    if prebuilt_library(sources, flags) is not None:
        return None
    return _build_reason()


def _build_reason() -> str | None:
    """Why the library cannot be built here (no compiler, no torch headers), or None."""
    if _compiler() is None:
        return "no C++ compiler (c++, g++ or clang++; or set CXX)"
    if not (Path(torch.__file__).parent / "include" / "torch" / "library.h").is_file():
        return "this torch install has no C++ headers"
    return None


def _build_command(cxx: str, out: Path, sources: list[Path] | None = None,
                   flags: tuple[str, ...] = ISA_FLAGS) -> list[str]:
    root = Path(torch.__file__).parent
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [
        cxx, "-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", *flags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-w", f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
        *map(str, sources or SOURCES), "-o", str(out), f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}", "-lc10",
        "-ltorch_cpu",
    ]  # -fopenmp links torch's own libgomp (its lib/ comes first): one OpenMP runtime in the process


def _library_key(compiler: str = "", sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> str:
    """A hash of the kernel sources (default SOURCES), this torch version, `compiler` (its --version text, or none)
    and the ISA flags."""
    return hashlib.sha256(b"".join(s.read_bytes() for s in (sources or SOURCES)) + torch.__version__.encode()
                          + compiler.encode() + " ".join(flags).encode()).hexdigest()[:16]


def _prebuilt_name(sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> str:
    """The file name a prebuilt library has for these sources, this torch and these ISA flags (no compiler: any
    compiler's build of the same sources against the same torch headers is the same library to its users)."""
    return f"leapvox-{_library_key('', sources, flags)}.so"


def prebuilt_library(sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> Path | None:
    """The prebuilt library for these sources and this torch in PREBUILT_DIR, or None (also where the sources that
    name it are not installed)."""
    try:
        lib = PREBUILT_DIR / _prebuilt_name(sources, flags)
    except OSError:
        return None
    return lib if lib.is_file() else None


def prebuild(out: Path | None = None, sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> Path:
    """Build the library of `sources` (default SOURCES; FP32_SOURCES with FP32_FLAGS for the fp32 layer) here, or
    take this machine's cached build, and place it in `out` (default PREBUILT_DIR) under the name that
    prebuilt_library() looks for; written atomically. Needs x86-64 Linux, a C++ compiler and torch's headers, not
    the CPU features (the library checks those where it runs). Raises RuntimeError."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"the kernels are written for x86-64 Linux (this is {sys.platform} {platform.machine()})")
    why = _build_reason()
    if why is not None:
        raise RuntimeError(f"cannot build the kernels here: {why}")
    folder = PREBUILT_DIR if out is None else Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / _prebuilt_name(sources, flags)
    fd, tmp = tempfile.mkstemp(suffix=".so.part", dir=folder)
    os.close(fd)
    try:
        shutil.copyfile(_library(sources, flags), tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a bundle's library is read by whoever runs the bundle
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _cached_library(sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> Path:
    """Where the cache keeps (or will keep) the library for these sources, torch and this machine's compiler."""
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    return cache_dir() / f"leapvox-{_library_key(version, sources, flags)}.so"


def _library(sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS,
             what: str = "the w8a8 CPU kernel", seconds: str = "15-30 s") -> Path:
    """The built library for these sources (default SOURCES), torch and compiler (built now if it is not in the
    cache)."""
    cxx = _compiler()
    lib = _cached_library(sources, flags)
    folder = lib.parent
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    notice(f"building {what} for this machine, once ({seconds}; LEAPVOX_KERNELS=0 skips it)")
    fd, tmp = tempfile.mkstemp(suffix=".so.part", dir=folder)
    os.close(fd)
    try:
        r = subprocess.run(_build_command(cxx, Path(tmp), sources, flags), capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"the build failed: {last[:160]}")
        os.replace(tmp, lib)  # atomic: another process sees the whole library or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [N, K] -> the kernel's layout [ceil(N/64), ceil(K/4), 64, 4], zero-padded: per block of 64
    output rows, per group of 4 input features, the 4 weights of each row in turn."""
    n, k = codes.shape
    np_, kp = -(-n // COLS) * COLS, -(-k // K_GROUP) * K_GROUP
    padded = F.pad(codes, (0, kp - k, 0, np_ - n))
    return padded.view(np_ // COLS, COLS, kp // K_GROUP, K_GROUP).permute(0, 2, 1, 3).contiguous()


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The int8 codes [N, K] of a packed weight (pack's inverse)."""
    blocks, groups = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(blocks * COLS, groups * K_GROUP)[:n, :k].contiguous()


GROUP4 = 64  # w4a8: input features per weight scale and min, and per activation scale


def quantize4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [N, K] (K % GROUP4 == 0) -> (codes uint8 [N, K] in 0..15, scales fp16 [N, K/64], mins fp16 [N, K/64]) with
    W ~ codes * scale + min per group of 64 input features (asymmetric over the group's range). Scale and min are
    rounded to fp16 first and the codes computed against the rounded pair, so the kernel uses exactly those."""
    n, k = w.shape
    groups = w.detach().to(torch.float32, copy=True).view(n, k // GROUP4, GROUP4)  # a copy: a view of a weight
    # made outside inference mode cannot be reshaped inside it (the doctor's probe builds layers in inference mode)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-8).half()
    low = lo.half()
    codes = torch.round((groups - low.float()[..., None]) / scale.float()[..., None]).clamp_(0, 15)
    return codes.to(torch.uint8).reshape(n, k), scale, low


def dequantize4(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """The fp32 weight [N, K] that w4a8 codes, scales and mins stand for."""
    n, k = codes.shape
    w = codes.float().reshape(n, k // GROUP4, GROUP4) * scales.float()[..., None] + mins.float()[..., None]
    return w.reshape(n, k)


def pack4(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize4's output -> the kernel's layout: nibbles uint8 [ceil(N/64), K/8, 64, 4] (per block of 64 output rows,
    per 8 input features, byte i of each row holds feature i in its low nibble and feature 4 + i in its high one) and
    scales/mins [ceil(N/64), K/64, 2, 64] as fp16 bit patterns in int16; padded rows are zero."""
    n, k = codes.shape
    np_ = -(-n // COLS) * COLS
    c = F.pad(codes, (0, 0, 0, np_ - n)).view(np_ // COLS, COLS, k // 8, 2, 4)
    nibbles = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).permute(0, 2, 1, 3).contiguous()
    sm = torch.stack([F.pad(t.half(), (0, 0, 0, np_ - n)) for t in (scales, mins)], dim=1)  # [Np, 2, G]
    sm = sm.view(np_ // COLS, COLS, 2, k // GROUP4).permute(0, 3, 2, 1).contiguous()
    return nibbles, sm.view(torch.int16)  # fp16 bits in an integer tensor: Module.to(dtype) leaves it alone


def unpack4(nibbles: torch.Tensor, sm: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack4's inverse: (codes [N, K], scales [N, K/64], mins [N, K/64])."""
    blocks, octets = nibbles.shape[:2]
    c = torch.stack([nibbles & 15, nibbles >> 4], dim=3)  # [B, K/8, 64, 2, 4]
    codes = c.permute(0, 2, 1, 3, 4).reshape(blocks * COLS, octets * 8)[:n].contiguous()
    t = sm.view(torch.float16).permute(0, 3, 2, 1).reshape(blocks * COLS, 2, -1)[:n]  # [N, 2, G]
    return codes, t[:, 0].contiguous(), t[:, 1].contiguous()


def w4a8_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """The w4a8 kernel's arithmetic in float64: x [M, K] quantized per row and group of 64 (symmetric, 8 bits)."""
    m, k = x.shape
    xg = x.double().reshape(m, k // GROUP4, GROUP4)
    sx = (xg.abs().amax(-1).float() / 127).double()
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    qx = torch.round(xg.float() * (1 / sx.float())[..., None]).clamp(-127, 127).double()  # as the kernel rounds
    dot = torch.einsum("mgi,ngi->mng", qx, codes.double().reshape(-1, k // GROUP4, GROUP4))
    return (sx[:, None] * (scales.double()[None] * dot + mins.double()[None] * qx.sum(-1)[:, None])).sum(-1)


def _self_check(op: Callable) -> str | None:
    """Compare the kernel with the same arithmetic in float64 on odd shapes; None when it agrees."""
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((1, 1024, 40), (5, 100, 7), (17, 64, 9)):
        x = torch.randn(m, k, generator=g)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        s, b = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
        y = op(x, pack(w), s, w.sum(1, dtype=torch.int32), b)
        lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
        sx = (hi - lo) / 255
        zx = torch.round(-lo / sx).clamp(0, 255)
        qx = (torch.round(x / sx[:, None]) + zx[:, None]).clamp(0, 255).double()
        ref = sx[:, None].double() * s.double() * (qx @ w.double().T - zx[:, None].double() * w.double().sum(1))
        err = ((y.double() - (ref + b.double())).abs().max() / ref.abs().max()).item()
        if not err < 1e-5:
            return f"its self-check failed (relative error {err:.3g} at M={m}, K={k}, N={n})"
    return None


def _load_prebuilt(sources: list[Path] | None = None, flags: tuple[str, ...] = ISA_FLAGS) -> bool:
    """Load the prebuilt library if there is one; False if there is none, or it does not load and one can be built
    here instead (the loader's error is raised where none can)."""
    lib = prebuilt_library(sources, flags)
    if lib is None:
        return False
    try:
        torch.ops.load_library(str(lib))
    except OSError as e:  # the loader refused it (an older C library than it was built for, a damaged file)
        if _build_reason() is not None:
            raise
        notice(f"the prebuilt kernel library did not load ({str(e)[:120]}); building one for this machine instead")
        return False
    return True


def w8a8_op() -> Callable | None:
    """torch.ops.leapvox_kernels.w8a8_linear(x fp32 [M, K], packed int8, scales fp32 [N], row sums int32 [N],
    bias fp32 [N] or None) -> fp32 [M, N], or None where it is unavailable (unavailable_reason says why).
    Built and checked on the first call in a process; later calls return the cached answer."""
    if "op" not in _STATE:
        op, reason = None, _static_reason()
        if reason is None:
            op, reason = _load_checked(_STATE, "leapvox_kernels", "w8a8_linear", _self_check, SOURCES, ISA_FLAGS)
        _STATE["op"], _STATE["reason"] = (None if reason else op), reason
    return _STATE["op"]


def _load_checked(state: dict, namespace: str, name: str, check: Callable, sources: list[Path],
                  flags: tuple[str, ...], what: str = "the w8a8 CPU kernel",
                  seconds: str = "15-30 s") -> tuple[Callable | None, str | None]:
    """torch.ops.<namespace>.<name> from the prebuilt library, the build cache or a build now, and `check`'s verdict
    on it: (op, None), or (None or op, why it is not to be used). Records in `state` whether it was prebuilt."""
    try:
        if not hasattr(getattr(torch.ops, namespace), name):
            state["prebuilt"] = _load_prebuilt(sources, flags)
            if not state["prebuilt"]:
                torch.ops.load_library(str(_library(sources, flags, what, seconds)))
        op = getattr(getattr(torch.ops, namespace), name)
        with torch.inference_mode():
            return op, check(op)
    except Exception as e:  # no compiler output we can use, a loader error: torch's kernels then
        return None, str(e) if isinstance(e, RuntimeError) and str(e).startswith("the build") else \
            f"it could not be loaded ({type(e).__name__}: {str(e)[:120]})"


def _op(name: str) -> Callable | None:
    """torch.ops.leapvox_kernels.<name> (built with w8a8_op(): one library), or None where it is unavailable."""
    return None if w8a8_op() is None else getattr(torch.ops.leapvox_kernels, name)


def layer_op() -> Callable | None:
    """qwen3_layer: one w8a8 decoder layer in C++ (engine/fast/fused.py), or None."""
    return _op("qwen3_layer")


def w4a8_op() -> Callable | None:
    """w4a8_linear(x fp32 [M, K], nibbles, scales/mins (pack4), N, bias fp32 [N] or None) -> fp32 [M, N], or
    None where the library is unavailable or this op failed its own check against `w4a8_reference` here (checked
    once per process)."""
    op = _op("w4a8_linear")
    if op is not None and "w4a8_ok" not in _STATE:
        g = torch.Generator().manual_seed(0)
        ok = True
        for m, k, n in ((1, 1024, 40), (6, 128, 70)):
            x, parts = torch.randn(m, k, generator=g), quantize4(torch.randn(n, k, generator=g))
            ref = w4a8_reference(x, *parts)
            err = ((op(x, *pack4(*parts), n, None).double() - ref).abs().max() / ref.abs().max()).item()
            ok = ok and err < 1e-5
        _STATE["w4a8_ok"] = ok
    return op if op is not None and _STATE["w4a8_ok"] else None


def snake_op() -> Callable | None:
    """snake(x fp32 [B, C, L], a [C], b [C]) -> x + sin(a x)^2 b in one pass (codec.cpp), or None."""
    return _op("snake")


def overlap_add_op() -> Callable | None:
    """overlap_add(cols fp32 [B, L, C, k], spill [B, C, k - s], bias [C], s) -> [B, C, L*s]: a transposed
    convolution's overlap-add in one pass (codec.cpp), or None."""
    return _op("overlap_add")


def linear_op() -> Callable | None:
    """linear_f32(x fp32 [M, K], w fp32 [N, K], bias [N] or None) -> [M, N] with a fixed summation order per output,
    so a value's rounding does not depend on M (codec.cpp), or None."""
    return _op("linear_f32")


def window_attention_op() -> Callable | None:
    """window_attention(q fp32 [B, H, n, D], k, v [B, H, W-1+n, D], mask bool [n, W], scale) -> [B, H, n, D]: query i
    attends to keys i .. i+W-1 where the mask allows, in a fixed order per query (codec.cpp), or None."""
    return _op("window_attention")


def takes(x: torch.Tensor) -> bool:
    """Whether a compiled op may take x: fp32 on the CPU, not being traced, and no autograd graph to build."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or torch.jit.is_tracing():
        return False
    return not (x.requires_grad and torch.is_grad_enabled())


def unavailable_reason() -> str | None:
    """None when w8a8_op() runs here, else why not (one line)."""
    w8a8_op()
    return _STATE["reason"]


def amx_enabled() -> bool:
    """Whether the kernel multiplies calls over 5+ rows on AMX-INT8 tiles here (the CPU has them, Linux grants them,
    LEAPVOX_AMX is not 0)."""
    return w8a8_op() is not None and bool(torch.ops.leapvox_kernels.amx_enabled())


def describe() -> str:
    """One line for `leapvox doctor`: which kernel the w8a8 format uses here."""
    why = unavailable_reason()
    if why is not None:
        return f"torch's FBGEMM/QNNPACK ({why})"
    where = "prebuilt" if _STATE.get("prebuilt") else "built here"
    return f"leapvox AVX-512 VNNI kernel ({where}" + ("; AMX-INT8 tiles for 5+ rows)" if amx_enabled() else ")")


def hint() -> str | None:
    """What would give leapvox's kernel here, where only a missing compiler stands in the way; else None."""
    if unavailable_reason() != _build_reason() or _compiler() is not None:
        return None
    return ("install a C++ compiler (Debian/Ubuntu: apt install g++) and leapvox builds its kernel on the next run, "
            "once: w8a8 speaks faster with it")


# ---- the portable fp32 decoder layer (fp32.cpp) -------------------------------------------------------------------

_FP32: dict[str, object] = {}


def _fp32_self_check(op: Callable) -> str | None:
    """A small random layer (head_dim 48: no vector-width multiple) through the op, two prefix rows then three
    more over the cached ones, against the Python decoder layer (`transformer.DecoderLayer`) in float64 over all
    five rows at once; None when they agree."""
    from leapvox.engine.config import TransformerConfig
    from leapvox.engine.nets.layers import rope_cos_sin, rope_inv_freq
    from leapvox.engine.nets.transformer import DecoderLayer

    g = torch.Generator().manual_seed(0)
    cfg = TransformerConfig(hidden_size=80, intermediate_size=112, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=48)
    layer = DecoderLayer(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 + (1 if p.dim() == 1 else 0))
    x = torch.randn(5, 80, generator=g)
    cos, sin = rope_cos_sin(rope_inv_freq(48, cfg.rope_theta), torch.arange(5), torch.float32)
    kc, vc = torch.zeros(2, 1, 8, 48), torch.zeros(2, 1, 8, 48)
    a, mlp = layer.self_attn, layer.mlp
    w = [layer.input_layernorm.weight, a.q_norm.weight, a.k_norm.weight, layer.post_attention_layernorm.weight,
         *(m.weight for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj))]
    w = [t.detach() for t in w]  # fused.FusedLayerF32's order
    y = torch.cat([op(x[:2], w, kc, vc, 0, cos[:2], sin[:2], None, 2, 4, 2, cfg.rms_norm_eps, cfg.rms_norm_eps),
                   op(x[2:], w, kc, vc, 2, cos[2:], sin[2:], None, 5, 4, 2, cfg.rms_norm_eps, cfg.rms_norm_eps)])
    ref = layer.double()(x.double()[None], cos.double(), sin.double())[0]
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    return None if err < 1e-5 else f"its self-check failed (relative error {err:.3g})"


BUILDING_STALE_S = 600  # a background build's marker older than this is taken as a build that died


def _build_in_background() -> str:
    """Start building the fp32 layer's library in a detached process (nice 10; the cache's atomic write makes a
    half-built library invisible) unless one is building already; returns the reason this process goes without."""
    lib = _cached_library(FP32_SOURCES, FP32_FLAGS)
    marker = lib.with_suffix(".building")
    why = "being built in the background for the next run (once, 5-15 s)"
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if time.time() - marker.stat().st_mtime < BUILDING_STALE_S:
                return why  # another process is building it
            marker.unlink(missing_ok=True)
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        code = ("import os, sys; os.nice(10); from leapvox.engine.fast import kernels; "
                "sys.exit(kernels.build_fp32_now(sys.argv[1]))")
        subprocess.Popen([sys.executable, "-c", code, str(marker)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:  # an unwritable cache, no process to start: this run and the next use torch's ops
        return f"it could not be built in the background ({e.strerror or e})"
    return why


def build_fp32_now(marker: str | None = None) -> int:
    """Build the fp32 layer's library into the cache (the detached process `_build_in_background` starts); removes
    `marker` when done, built or not. Returns 0 when the library is there."""
    try:
        _library(FP32_SOURCES, FP32_FLAGS)
        return 0
    except Exception:
        return 1
    finally:
        if marker:
            Path(marker).unlink(missing_ok=True)


def fp32_layer_op(build: str = "now") -> Callable | None:
    """torch.ops.leapvox_fp32.qwen3_layer_f32: one fp32 decoder layer in C++ for batch-1 decode steps of narrow
    models (engine/fast/fused.py), or None where it is unavailable (fp32_unavailable_reason says why). Taken
    prebuilt or from the build cache, and checked, on the first call in a process. Where neither has it, `build`
    "now" builds it here and waits (tests, benchmarks), "background" starts the build in a detached process and
    this process goes without (the loader: a first `speak` never waits for an optional compile)."""
    if "op" not in _FP32:
        op, reason = None, _static_reason(FP32_CPU, FP32_SOURCES, FP32_FLAGS)
        if reason is None and build == "background" and not getattr(sys, "frozen", False) \
                and not hasattr(torch.ops.leapvox_fp32, "qwen3_layer_f32") \
                and prebuilt_library(FP32_SOURCES, FP32_FLAGS) is None:
            try:
                cached = _cached_library(FP32_SOURCES, FP32_FLAGS).is_file()
            except (OSError, subprocess.SubprocessError) as e:
                cached, reason = False, f"the compiler did not answer ({e})"
            if not cached and reason is None:
                if "pending" not in _FP32:
                    _FP32["pending"] = _build_in_background()
                return None  # not remembered: a later call with build="now" (or the next process) takes it
        if reason is None:
            op, reason = _load_checked(_FP32, "leapvox_fp32", "qwen3_layer_f32", _fp32_self_check, FP32_SOURCES,
                                       FP32_FLAGS, "the fp32 layer kernel", "5-15 s")
        _FP32["op"], _FP32["reason"] = (None if reason else op), reason
    return _FP32["op"]


def fp32_unavailable_reason() -> str | None:
    """None when fp32_layer_op() runs here, else why not (one line)."""
    fp32_layer_op()
    return _FP32["reason"]


def describe_fp32() -> str:
    """One line for `leapvox doctor`: what a narrow fp32 model's decoder layers run on here (where the library is
    not built yet, its build starts in the background, as a model's load would start it)."""
    if fp32_layer_op("background") is None and "op" not in _FP32:
        return f"torch's ops, layer by layer (leapvox's compiled fp32 layer is {_FP32['pending']})"
    why = fp32_unavailable_reason()
    if why is not None:
        return f"torch's ops, layer by layer ({why})"
    return f"leapvox's compiled fp32 layer ({'prebuilt' if _FP32.get('prebuilt') else 'built here'})"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Layers built inside this block use torch's kernels (for A/B benchmarks in one process)."""
    saved, saved_fp32 = dict(_STATE), dict(_FP32)
    _STATE.update(op=None, reason="disabled for this block")
    _FP32.update(op=None, reason="disabled for this block")
    try:
        yield
    finally:
        _STATE.clear()
        _STATE.update(saved)
        _FP32.clear()
        _FP32.update(saved_fp32)
