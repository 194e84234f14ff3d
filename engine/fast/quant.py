"""Low-bit weights for the CPU, applied to a loaded model from outside by swapping modules: the talker's and
predictor's linears become `Int8Linear` (`int8`: W8A16), `W8A8Linear` (`w8a8`: 8-bit dynamic activations through
leapvox's compiled kernel or else torch's quantized-linear kernels, a Hadamard-rotated down-projection input),
`W4A8Linear` (`w4a8`: 4-bit weights in groups of 64, leapvox's kernel only) or `Int4Linear` (`int4`, torch's
kernel); in w8a8 / w4a8 each layer's attention and MLP become `FusedAttention` / `FusedSwiGLU` (one product for
q/k/v, one for gate/up). `auto` resolves to w8a8 where it runs. The networks never see any of this.

`int8` stores each linear weight W [N, K] as int8 codes q [N, K] and one scale per output row s [N], with
W ~ s * q (symmetric, |q| <= 127). Activations stay bf16 in the product (the int8pack kernel is many times slower
with fp32 activations) and everything else keeps the model's dtype. Products over up to DEQUANT_ROWS rows use
`aten._weight_int8pack_mm`, bigger ones dequantize on the fly (faster there; `tests/benchmarks/kernels.py`).
The int8pack kernel crashes or miscomputes unless in_features is a multiple of 16 (torch 2.13, CPU), so other
layers always dequantize (`kernel_ok`); the checkpoints' widths (1024, 2048, 3072, ...) all take the kernel.
"""

from __future__ import annotations

import functools
import math
import platform
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.errors import FormatUnavailableError
from leapvox.engine.fast import kernels
from leapvox.engine.memory import return_freed_memory
from leapvox.engine.nets.layers import SwiGLU
from leapvox.engine.nets.transformer import Attention
from leapvox.engine.options import WEIGHT_FORMATS  # the one weight-format table, torch-free there

QUANT_FORMATS = ("int8", "w8a8", "w4a8", "int4")  # the formats quantize_model converts (fp32 / bf16 are load dtypes)
INT4_GROUP = 64  # int4: one scale and zero per this many input features of an output feature
# w8a8 rotates the inputs of these layers before their 8-bit rounding: the MLP down-projection's input,
# silu(gate) * up, is heavy-tailed, and one 8-bit scale per row costs it most of the fidelity. The rotation is a
# Hadamard matrix per block of ROTATION_BLOCK features (or of the largest power of two >= MIN_ROTATION_BLOCK
# dividing the layer's width); a narrower or odd width keeps 16-bit activations.
ROTATED_LAYERS = ("down_proj",)
# w4a8 puts these (a decoder layer's products) in 4 bits; the predictor's LM heads and input projection keep w8a8:
# a frame reads one 2 MB head per code against 79 MB of layers, and the heads pick the codes directly
W4_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROTATION_BLOCK, MIN_ROTATION_BLOCK = 256, 16
DEQUANT_ROWS = 16  # above this many rows, dequantize-then-matmul beats the int8pack kernel
ACT_DTYPE = torch.bfloat16  # the kernel's activation dtype (it is slow with fp32 activations)
INT8PACK_K_MULTIPLE = 16  # the kernel crashes or miscomputes unless in_features is a multiple of this


def kernel_ok(in_features: int) -> bool:
    """Whether `aten._weight_int8pack_mm` handles weights of this many input features (see the module docstring)."""
    return in_features % INT8PACK_K_MULTIPLE == 0


def quantize_weight(
    w: torch.Tensor, scale_dtype: torch.dtype = ACT_DTYPE, top: float = 126.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (int8 codes [N, K], per-row scales [N] in `scale_dtype`) with W ~ scales[:, None] * codes.

    The scale is rounded to its dtype first and the codes are computed against that rounded scale, so the
    kernel's scale is exactly the one the codes were made with; 126.5 (not 127) leaves room for bf16's rounding."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1).clamp_min(1e-12)
    scales = (amax / top).to(scale_dtype)
    codes = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes.contiguous(), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 weight that int8 codes and scales stand for."""
    return codes.float() * scales.float()[:, None]


class Int8Linear(nn.Module):
    """A bias-optional linear layer over int8 weight codes with per-output-channel scales (W8A16)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = codes.shape[1], codes.shape[0]
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.kernel = kernel_ok(self.in_features)  # False: every product dequantizes (the kernel would crash)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        codes, scales = quantize_weight(linear.weight)
        return cls(codes, scales, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(ACT_DTYPE)
        if self.kernel and x2.shape[0] <= DEQUANT_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.codes, self.scales)
        else:
            y = F.linear(x2, self.codes.to(ACT_DTYPE) * self.scales[:, None])
        y = y.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def weight(self) -> torch.Tensor:
        """The fp32 weight the codes stand for (computed on each access), for code that reads `.weight`."""
        return dequantize(self.codes, self.scales)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class W8A8Linear(nn.Module):
    """A linear layer over int8 weights (per-output-channel scales) whose activations are quantized to 8 bits on
    each call and multiplied in integers: by leapvox's own AVX-512 VNNI kernel where it is built (engine.fast.kernels:
    activations quantized per row) or else by torch's prebuilt quantized-linear kernels
    (FBGEMM on x86-64: AVX-512 VNNI / AVX2; QNNPACK on arm64: activations quantized per tensor, one scale and zero
    point for the whole input; the same as per row at batch 1).

    The weights live only in the kernel's packed form; `codes`, `scales` and `weight` unpack them. With torch's
    kernels on an x86 CPU without VNNI the activations use 7 bits (`REDUCE_RANGE`): FBGEMM's AVX2 path sums pairs of
    8-bit products in 16 bits, which 8-bit activations can overflow."""

    def __init__(
        self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
        rotation: torch.Tensor | None = None,
    ):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.has_bias = bias is not None
        bias = None if bias is None else bias.detach().float().clone()
        self.op = kernels.w8a8_op()  # leapvox's kernel, or None: torch's
        if self.op is not None:
            self.packed = None
            self.register_buffer("wpack", kernels.pack(codes))
            self.register_buffer("wscale", scales.detach().float().contiguous())
            self.register_buffer("wsum", codes.sum(1, dtype=torch.int32))
            self.register_buffer("wbias", bias)
        else:
            self.packed = _prepack(codes, scales, bias)
        # [B, B] orthonormal, or None: the weight's codes stand for W R^T block by block, so inputs are rotated by R
        self.register_buffer("rotation", rotation)
        self.split_sizes = [self.out_features]  # a fused layer's parts (fuse_projections), in output order

    @classmethod
    def from_linear(cls, linear: nn.Linear, rotate: int = 0) -> W8A8Linear:
        """Quantize `linear`; with `rotate` B, its input is first turned by a B x B Hadamard rotation per block of B
        features, which spreads a few large activations over many features before the 8-bit rounding."""
        w, rotation = rotated_weight(linear, rotate)
        codes, scales = quantize_weight(w, torch.float32, 127.0)
        return cls(codes, scales, linear.bias, rotation)

    def product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """x fp32 [T, K] (contiguous rows, already rotated) -> fp32 [T, N]: the bare kernel call."""
        if self.op is not None:
            op, w, s, ws, b = self.op, self.wpack, self.wscale, self.wsum, self.wbias
            return lambda x: op(x, w, s, ws, b)
        packed = self.packed
        return lambda x: torch.ops.quantized.linear_dynamic(x, packed, REDUCE_RANGE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        if self.rotation is not None:
            x2 = (x2.reshape(-1, self.rotation.shape[0]) @ self.rotation).reshape(-1, shape[-1])  # R x per block
        y = self.product()(x2.contiguous())
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def _unpacked(self):
        return torch.ops.quantized.linear_unpack(self.packed)

    @property
    def codes(self) -> torch.Tensor:
        if self.op is not None:
            return kernels.unpack(self.wpack, self.out_features, self.in_features)
        return self._unpacked()[0].int_repr()

    @property
    def scales(self) -> torch.Tensor:
        return self.wscale if self.op is not None else self._unpacked()[0].q_per_channel_scales().float()

    @property
    def bias(self) -> torch.Tensor | None:
        return self.wbias if self.op is not None else self._unpacked()[1]

    @property
    def weight(self) -> torch.Tensor:
        """The fp32 weight the codes stand for (computed on each access; rotated back when the input is rotated)."""
        w = dequantize(self.codes, self.scales)
        if self.rotation is None:
            return w
        return (w.reshape(-1, self.rotation.shape[0]) @ self.rotation).reshape(w.shape)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"


class W4A8Linear(W8A8Linear):
    """A linear layer over 4-bit weights in groups of GROUP4 = 64 input features (asymmetric: an fp16 scale and min per
    group and output feature, W ~ code * scale + min with code in 0..15) whose activations are quantized to 8 bits per
    row and group of 64 on each call and multiplied in integers by leapvox's AVX-512 VNNI kernel (engine.fast.kernels,
    `w4a8_linear`; there is no torch fallback: the format is offered only where the kernel is built). Half the bytes of
    w8a8 per weight plus 1/16 for the scales; like w8a8, the down projection's input is Hadamard-rotated
    (`from_linear(rotate=...)`). It subclasses W8A8Linear for the rotation, forward and fusion code; `wpack`,
    `wscale` and `wsum` hold the nibbles, the fp16 scales and mins (as int16 bit patterns, so that a model's
    `.float()` or `.to(dtype)` leaves them alone), and an empty [N, 0] tensor (qwen3_layer's slots)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                 bias: torch.Tensor | None = None, rotation: torch.Tensor | None = None):
        nn.Module.__init__(self)
        self.out_features, self.in_features = codes.shape
        self.has_bias = bias is not None
        self.op = kernels.w4a8_op()
        if self.op is None:
            raise ValueError(f"the w4a8 format needs leapvox's compiled kernel: {kernels.unavailable_reason()}")
        self.packed = None
        nibbles, sm = kernels.pack4(codes, scales, mins)
        self.register_buffer("wpack", nibbles)
        self.register_buffer("wscale", sm)
        self.register_buffer("wsum", torch.empty((self.out_features, 0), dtype=torch.int32))
        self.register_buffer("wbias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("rotation", rotation)
        self.split_sizes = [self.out_features]

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % kernels.GROUP4 == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, rotate: int = 0) -> W4A8Linear:
        w, rotation = rotated_weight(linear, rotate)
        return cls(*kernels.quantize4(w), linear.bias, rotation)

    def product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        op, w, sm, n, b = self.op, self.wpack, self.wscale, self.out_features, self.wbias
        return lambda x: op(x, w, sm, n, b)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes uint8 [N, K], scales fp16 [N, K/64], mins fp16 [N, K/64])."""
        return kernels.unpack4(self.wpack, self.wscale, self.out_features)

    @property
    def codes(self) -> torch.Tensor:
        return self.unpacked()[0]

    @property
    def scales(self) -> torch.Tensor:
        return self.unpacked()[1]

    @property
    def weight(self) -> torch.Tensor:
        w = kernels.dequantize4(*self.unpacked())
        if self.rotation is None:
            return w
        return (w.reshape(-1, self.rotation.shape[0]) @ self.rotation).reshape(w.shape)


def rotated_weight(linear: nn.Linear, rotate: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W R^T per block of `rotate` input features, R), or (W, None) when `rotate` is 0: the weight whose products
    take inputs turned by R = hadamard(rotate) block by block."""
    w = linear.weight.detach().float()
    if not rotate:
        return w, None
    rotation = hadamard(rotate)
    return (w.reshape(-1, rotate) @ rotation.T).reshape(w.shape), rotation


@functools.cache
def hadamard(n: int) -> torch.Tensor:
    """The n x n orthonormal Hadamard matrix (Sylvester's construction; n a power of two), fp32. It is symmetric
    and its own inverse. One tensor per size, shared by every rotated layer (read-only)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two size, not {n}")
    with torch.inference_mode(False):  # cached: a plain tensor, usable whatever mode the first caller was in
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
        return h / math.sqrt(n)


class Int4Linear(nn.Module):
    """4-bit weights in groups of INT4_GROUP input features (asymmetric: a bf16 scale and zero per group and output
    feature, w ~ (q - 8) * scale + zero with q in 0..15), bf16 activations, torch's prebuilt int4 CPU kernel
    (aten._weight_int4pack_mm_for_cpu). Needs out_features % 16 == 0 and in_features % INT4_GROUP == 0 (`fits`)."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)  # [K / group, N, 2] bf16
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.out_features % 16 == 0 and linear.in_features % INT4_GROUP == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        w = linear.weight.detach().float().clone()  # a fresh tensor: also fine for weights made outside inference mode
        n, k = w.shape
        groups = w.reshape(n, k // INT4_GROUP, INT4_GROUP)
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-12).to(ACT_DTYPE).float()  # the kernel's own (bf16) scale
        zero = (lo + 8 * scale).to(ACT_DTYPE).float()
        q = torch.round((groups - zero) / scale + 8).clamp_(0, 15).to(torch.int32).view(n, k)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scales_zeros = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1).to(ACT_DTYPE).contiguous()
        return cls(packed, scales_zeros, k, n, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(ACT_DTYPE)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, INT4_GROUP, self.scales_zeros)
        y = y.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def weight(self) -> torch.Tensor:
        """The weight the codes stand for, rounded to bf16 (the kernel applied to the identity; computed on access)."""
        eye = torch.eye(self.in_features, dtype=ACT_DTYPE)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scales_zeros).t().float()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FusedPart(nn.Module):
    """One projection of a fused W8A8 product (output features start..end of `fused`), kept under its own name for
    code that calls or reads that projection alone; the fused modules' forward passes call the fused product once."""

    def __init__(self, fused: W8A8Linear, start: int, end: int):
        super().__init__()
        object.__setattr__(self, "fused", fused)  # not a submodule: the parent holds it (no double counting)
        self.start, self.end = start, end
        self.in_features, self.out_features = fused.in_features, end - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)[..., self.start : self.end]

    @property
    def weight(self) -> torch.Tensor:
        return self.fused.weight[self.start : self.end]

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.end} of a fused product"


def _fused(parts: list[W8A8Linear]) -> W8A8Linear:
    if all(isinstance(p, W4A8Linear) for p in parts):  # per output row quantized: concatenating changes nothing
        fused = W4A8Linear(*(torch.cat(ts) for ts in zip(*(p.unpacked() for p in parts), strict=True)))
    else:
        fused = W8A8Linear(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]))
    fused.split_sizes = [p.out_features for p in parts]
    return fused


def _parts_views(parts: list[W8A8Linear]) -> tuple[W8A8Linear, list[FusedPart]]:
    """The fused product of `parts` and a FusedPart view per part, in order."""
    fused, views, start = _fused(parts), [], 0
    for part in parts:
        views.append(FusedPart(fused, start, start + part.out_features))
        start += part.out_features
    return fused, views


class FusedAttention(Attention):
    """`Attention` whose q, k, v projections are one product, `qkv_proj` ([q | k | v] rows); `q_proj`, `k_proj`,
    `v_proj` stay as FusedPart views of it. Swapped in for an Attention by `fuse_layers`."""

    def __init__(self, attn: Attention):
        nn.Module.__init__(self)
        self.n_heads, self.n_kv, self.head_dim = attn.n_heads, attn.n_kv, attn.head_dim
        self.qkv_proj, (self.q_proj, self.k_proj, self.v_proj) = _parts_views([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj, self.q_norm, self.k_norm = attn.o_proj, attn.q_norm, attn.k_norm

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qkv_proj(x).split(self.qkv_proj.split_sizes, dim=-1)


class FusedSwiGLU(SwiGLU):
    """`SwiGLU` whose gate and up projections are one product, `gate_up_proj` ([gate | up] rows); `gate_proj` and
    `up_proj` stay as FusedPart views of it. Swapped in for a SwiGLU by `fuse_layers`."""

    def __init__(self, mlp: SwiGLU):
        nn.Module.__init__(self)
        self.gate_up_proj, (self.gate_proj, self.up_proj) = _parts_views([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.gate_up_proj.split_sizes, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def fuse_projections(tts) -> int:
    """Fuse each decoder layer's w8a8 q/k/v projections into one product and its gate/up projections into another
    (`fuse_layers`) in the talker and the code predictor: one activation quantization and one kernel call instead
    of three and two, with the same results bit for bit (the activations' 8-bit parameters come from the same
    input; the products are exact integer sums per output feature). Returns how many modules were fused."""
    talker = tts.talker
    return fuse_layers([*talker.model.layers, *talker.code_predictor.model.layers])


def fuse_layers(layers) -> int:
    """Swap each layer's `self_attn` for a FusedAttention and its `mlp` for a FusedSwiGLU where their projections
    are all plain w8a8 or all w4a8 (no rotation, no bias). Returns how many modules were swapped."""
    n = 0
    for layer in layers:
        for name, names, cls in (("self_attn", ("q_proj", "k_proj", "v_proj"), FusedAttention),
                                 ("mlp", ("gate_proj", "up_proj"), FusedSwiGLU)):
            module = getattr(layer, name)
            parts = [getattr(module, p) for p in names]
            plain = all(isinstance(p, W8A8Linear) and p.rotation is None and not p.has_bias for p in parts)
            if isinstance(module, cls) or not plain or len({type(p) for p in parts}) != 1:
                continue  # fused only when all w8a8 or all w4a8
            setattr(layer, name, cls(module))
            del parts, module
            return_freed_memory()  # the separate layers' weights (glibc would keep their pages)
            n += 1
    return n


def _has_vnni() -> bool:
    """Whether this x86 CPU has 8-bit dot-product instructions (AVX-512 VNNI or AVX-VNNI); read from Linux's
    /proc/cpuinfo (elsewhere: False, the safe answer)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return " avx512_vnni" in flags or " avx_vnni" in flags


REDUCE_RANGE = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86") and not _has_vnni()


def _prepack(codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    zero = torch.zeros(codes.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch >= 2.10 warns that quantized tensors will move out of core torch
        warnings.simplefilter("ignore", UserWarning)
        q = torch._make_per_channel_quantized_tensor(codes.contiguous(), scales.double(), zero, 0)
        return torch.ops.quantized.linear_prepack(q, bias)


# A talker narrower than this (hidden size) runs `auto` in fp32: its products are so small that an 8-bit format's
# per-call work (quantizing each activation row, the module path: the fused layer does not take such shapes) costs
# more than its smaller weights save. The demo (192 wide) is such a model; every Qwen3-TTS model is 1024 or wider.
NARROW_HIDDEN = 512


def resolve_weights(weights: str, hidden: int | None = None) -> str:
    """A weight format by name. `auto`: fp32 for a model whose talker is narrower than NARROW_HIDDEN (`hidden`,
    when the caller knows it), else w8a8 where torch's quantized kernels run here (the faster), else int8 (the
    more faithful)."""
    if weights == "auto":
        if hidden is not None and hidden < NARROW_HIDDEN:
            return "fp32"
        return "int8" if w8a8_unavailable_reason() else "w8a8"
    return weights


def w8a8_unavailable_reason() -> str | None:
    """None when this torch runs W8A8Linear here (a tiny product checked against its dequantized weight), else why
    not (a torch without quantized kernels, an engine that rejects per-channel weights, ...)."""
    global _W8A8_REASON
    if _W8A8_REASON is None:
        try:
            g = torch.Generator().manual_seed(0)
            lin = nn.Linear(64, 8, bias=False)
            lin.weight.data = torch.randn(8, 64, generator=g)
            q = W8A8Linear.from_linear(lin)
            x = torch.randn(2, 64, generator=g)
            ref = x @ q.weight.T
            err = ((q(x) - ref).abs().max() / ref.abs().max()).item()  # 8-bit activations: ~1 % is normal
            _W8A8_REASON = "" if err < 0.05 else f"its products are wrong here (relative error {err:.3g})"
        except Exception as e:  # a missing op or engine: the format is not offered
            _W8A8_REASON = f"torch's quantized linear kernels are unavailable ({type(e).__name__}: {str(e)[:80]})"
    return _W8A8_REASON or None


_W8A8_REASON: str | None = None


def lowers_codec(weights: str) -> bool:
    """Whether a model loaded in `weights` runs its codec's convolutions in bf16 (CodecDecoder.lower_precision): w4a8,
    the speed-first format, does so on CPUs that multiply bf16 in hardware; every other format keeps the codec in
    its load dtype."""
    return weights == "w4a8" and kernels.bf16_products()


def w4a8_unavailable_reason() -> str | None:
    """None when leapvox's compiled kernel (which w4a8 needs: there is no torch route) runs here, else why not."""
    if kernels.w4a8_op() is None:
        why = kernels.unavailable_reason() or "its 4-bit product failed its self-check on this CPU"
        return f"it needs leapvox's compiled CPU kernel, which is unavailable: {why}"
    return None


FALLBACK_HINTS = {"w8a8": "use --weights int8", "w4a8": "use --weights w8a8 or int4"}  # where a format does not run


def format_unavailable_reason(weights: str) -> str | None:
    """None when the weight format `weights` runs on this machine, else why not (w8a8 and w4a8 need kernels)."""
    if weights == "w8a8":
        return w8a8_unavailable_reason()
    if weights == "w4a8":
        return w4a8_unavailable_reason()
    return None


def rotation_block(width: int) -> int:
    """The Hadamard block size for a rotated layer of `width` input features, or 0 when none fits."""
    block = ROTATION_BLOCK
    while block >= MIN_ROTATION_BLOCK and width % block:
        block //= 2
    return block if block >= MIN_ROTATION_BLOCK else 0


def quantized_linear(linear: nn.Linear, weights: str, name: str = "") -> nn.Module:
    """`linear` in the quantized format `weights` (int8, w8a8 or int4); `name` is its attribute name (w8a8 rotates the
    inputs of ROTATED_LAYERS, and keeps 16-bit activations where no rotation block fits)."""
    if weights == "int8":
        return Int8Linear.from_linear(linear)
    if weights == "int4":  # a shape the int4 kernel cannot take keeps 8 bits
        return Int4Linear.from_linear(linear) if Int4Linear.fits(linear) else Int8Linear.from_linear(linear)
    if weights not in ("w8a8", "w4a8"):
        raise ValueError(f"not a quantized weight format: {weights!r}")
    cls = W4A8Linear if weights == "w4a8" and name in W4_LAYERS and W4A8Linear.fits(linear) else W8A8Linear
    if name not in ROTATED_LAYERS:
        return cls.from_linear(linear)
    block = rotation_block(linear.in_features)
    return cls.from_linear(linear, rotate=block) if block else Int8Linear.from_linear(linear)


def quantizable_linears(tts) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every linear that `int8` converts: the talker's decoder layers, the code
    predictor's decoder layers, its 15 LM heads and its input projection (1.7B). Not the code-0 head, the text
    projection, embeddings or the codec."""
    talker = tts.talker
    cp = talker.code_predictor
    found = []
    for stack in (talker.model.layers, cp.model.layers):
        for parent in stack.modules():
            for name, child in parent.named_children():
                if isinstance(child, nn.Linear):
                    found.append((parent, name, child))
    for i, head in enumerate(cp.lm_head):
        if isinstance(head, nn.Linear):
            found.append((cp.lm_head, str(i), head))
    if isinstance(cp.small_to_mtp_projection, nn.Linear):
        found.append((cp, "small_to_mtp_projection", cp.small_to_mtp_projection))
    return found


@torch.no_grad()
def quantize_model(tts, weights: str = "int8") -> dict:
    """Convert a loaded TTSModel in place to the weight format `weights`; returns a summary (layers converted,
    bytes of their weights before and after). `fp32`/`bf16` are dtypes chosen at load time: nothing to do here."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weights!r}; choose from {', '.join(WEIGHT_FORMATS)}")
    summary = {"weights": weights, "layers": 0, "bytes_before": 0, "bytes_after": 0}
    if weights not in QUANT_FORMATS:
        return summary
    if why := format_unavailable_reason(weights):
        raise FormatUnavailableError(f"the {weights} format does not run here: {why}", hint=FALLBACK_HINTS[weights])

    # (parent, name) only: holding the linears until the end would keep every source weight alive (memory-mapped
    # from the checkpoint) until all are converted; dropped one by one, the peak is the int8 model plus one layer
    trimmed = 0
    for parent, name in [(parent, name) for parent, name, _ in quantizable_linears(tts)]:
        linear = getattr(parent, name)
        if linear.weight.device.type != "cpu":
            raise ValueError(f"{weights} weights run on the CPU only; load the model on the CPU")
        q = quantized_linear(linear, weights, name)
        summary["layers"] += 1
        summary["bytes_before"] += linear.weight.numel() * linear.weight.element_size()
        summary["bytes_after"] += linear_weight_bytes(q)
        setattr(parent, name, q)
        del linear
        if summary["bytes_before"] - trimmed >= TRIM_BYTES:
            trimmed = summary["bytes_before"]
            return_freed_memory()
    if weights in ("w8a8", "w4a8"):
        summary["fused"] = fuse_projections(tts)
    return_freed_memory()
    return summary


TRIM_BYTES = 64 << 20  # quantize_model hands freed memory back after about this many bytes of source weights



def linear_weight_bytes(module: nn.Module) -> int:
    """Bytes of the linear weights (or int8 codes and scales) under `module`: what one forward pass reads."""
    total = 0
    for m in module.modules():
        if isinstance(m, Int8Linear):
            total += m.codes.numel() + m.scales.numel() * m.scales.element_size()
        elif isinstance(m, W4A8Linear):
            total += m.wpack.numel() + m.wscale.numel() * m.wscale.element_size()
        elif isinstance(m, W8A8Linear):
            total += m.in_features * m.out_features + 4 * m.out_features
        elif isinstance(m, Int4Linear):
            total += m.packed.numel() * m.packed.element_size() + m.scales_zeros.numel() * 2
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total
