"""A Qwen3 decoder layer as one call into leapvox's compiled kernels at batch 1: w8a8 / w4a8 weights, and fp32 ones of
narrow models.

At batch 1 a decoder layer's time on the CPU is mostly not its products but the ~25 small torch ops around them.
`engine/fast/kernels/w8a8.cpp`'s `qwen3_layer` runs the whole layer in C++ instead: the norms, the fused q/k/v product,
per-head q/k norms and RoPE, the K/V write, attention over the cached slots (causal or under a mask), the output
product and residual, then the MLP (fused gate/up, SiLU, the rotation as a fast Walsh-Hadamard transform, down) and
its residual. The products are the same kernel calls the module path makes; the rest is fp32 in another order of
operations, so it equals `transformer.DecoderLayer` up to fp32 rounding (tests/test_kernels.py), not bit for bit.

`fuse_decoder_layers(tts)` swaps each decoder layer that the kernel takes (every product a W8A8Linear on leapvox's
kernel, q/k/v and gate/up fused, no bias, fp32 norms, shapes it handles) for a `FusedDecoderLayer`: the same
module tree and call, so the talker's steps, the reference predictor loop and `predictor.PredictorLoop` all run it.
`fuse_fp32_layers(tts)` does the same with `kernels/fp32.cpp`'s `qwen3_layer_f32` (portable C++, AVX2/FMA; the
layer's own nn.Linear weights read in place) for the narrow fp32 models the loader gives it: there the ~25 torch ops
are nearly all of a step. Equal to the module path up to fp32 rounding; a row gives the same bits alone or among
others (spec's verify call).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from leapvox.engine.fast import kernels
from leapvox.engine.fast.quant import FusedAttention, FusedSwiGLU, W8A8Linear
from leapvox.engine.nets.transformer import DecoderLayer


class FusedLayer:
    """One decoder layer's weights gathered for `kernels.layer_op()`."""

    def __init__(self, layer: nn.Module, op):
        a, mlp = layer.self_attn, layer.mlp
        self.op = op
        self.nh, self.nkv = a.n_heads, a.n_kv
        self.eps, self.qk_eps = float(layer.input_layernorm.eps), float(a.q_norm.eps)
        down = mlp.down_proj
        self.rot_block = 0 if down.rotation is None else int(down.rotation.shape[0])
        self.weights = [
            layer.input_layernorm.weight.detach(), a.q_norm.weight.detach(), a.k_norm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
            *(t for m in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, down) for t in (m.wpack, m.wscale, m.wsum)),
        ]

    def __call__(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slot: int, cos: torch.Tensor,
                 sin: torch.Tensor, mask: torch.Tensor | None, span: int) -> torch.Tensor:
        """Rows x [T, H] written to slots slot..slot+T-1 of kc, vc [nkv, R, P, D] (every repeat R; attention reads
        the first), attending over slots [0, span) under `mask` [T, span] (bool) or causally -> the layer's output
        [T, H]. cos, sin [T, D]: the rows' RoPE tables."""
        return self.op(x, self.weights, kc, vc, slot, cos, sin, mask, span, self.nh, self.nkv, self.eps,
                       self.qk_eps, self.rot_block)


class FusedLayerF32:
    """One fp32 decoder layer's own weight tensors (read in place, not copied) for `kernels.fp32_layer_op()`; the
    same call as FusedLayer."""

    def __init__(self, layer: nn.Module, op):
        a, mlp = layer.self_attn, layer.mlp
        self.op = op
        self.nh, self.nkv = a.n_heads, a.n_kv
        self.eps, self.qk_eps = float(layer.input_layernorm.eps), float(a.q_norm.eps)
        self.weights = [
            layer.input_layernorm.weight.detach(), a.q_norm.weight.detach(), a.k_norm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
            *(m.weight.detach() for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj,
                                          mlp.down_proj)),
        ]

    def __call__(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slot: int, cos: torch.Tensor,
                 sin: torch.Tensor, mask: torch.Tensor | None, span: int) -> torch.Tensor:
        return self.op(x, self.weights, kc, vc, slot, cos, sin, mask, span, self.nh, self.nkv, self.eps, self.qk_eps)


class FusedDecoderLayer(DecoderLayer):
    """A DecoderLayer whose cached batch-1 calls on fp32 CPU rows (no autograd, a boolean [T, S] mask or none) are
    one compiled call (`qwen3_layer` for w8a8 / w4a8, `qwen3_layer_f32` for fp32); every other call (batches,
    training, a float mask, inside `disabled()`) takes the module path of the same weights. Built by
    `fuse_decoder_layers` or `fuse_fp32_layers` once the model has its final dtype."""

    def __init__(self, layer: DecoderLayer, op, kind: type = FusedLayer):
        nn.Module.__init__(self)
        self.input_layernorm, self.self_attn = layer.input_layernorm, layer.self_attn
        self.post_attention_layernorm, self.mlp = layer.post_attention_layernorm, layer.mlp
        self.kernel = kind(self, op)

    def forward(self, x, cos, sin, cache=None, start=0, mask=None, span=None, dropout: float = 0.0):
        if cache is not None and x.shape[0] == 1 and _ENABLED[0] and usable(x, mask):
            end = start + x.shape[1] if span is None else span
            return self.kernel(x[0], cache.k[0, :, None], cache.v[0, :, None], start, cos, sin, mask, end)[None]
        return super().forward(x, cos, sin, cache, start, mask, span, dropout)


def takes(layer: nn.Module) -> bool:
    """Whether `qwen3_layer` takes this layer: fused q/k/v and gate/up, every product a W8A8Linear (or W4A8Linear)
    on leapvox's kernel without a bias, fp32 norms, and shapes the kernel handles (`fits`)."""
    a, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not (isinstance(a, FusedAttention) and isinstance(mlp, FusedSwiGLU)):
        return False
    parts = (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if not all(isinstance(m, W8A8Linear) and m.op is not None and not m.has_bias for m in parts):
        return False
    return layer.input_layernorm.weight.dtype == torch.float32 and fits(layer)


def fuse_decoder_layers(tts) -> int:
    """Swap every decoder layer of the talker and the code predictor that the kernel takes (`takes`) for a
    FusedDecoderLayer; call it once the model has its final dtype. Returns how many were swapped (0 where the
    kernel is not built here)."""
    talker = tts.talker
    return fuse_stack_layers(talker.model.layers) + fuse_stack_layers(talker.code_predictor.model.layers)


def fuse_stack_layers(layers: nn.ModuleList) -> int:
    """fuse_decoder_layers over one stack's layers."""
    op = kernels.layer_op()
    if op is None:
        return 0
    n = 0
    for i, layer in enumerate(layers):
        if not isinstance(layer, FusedDecoderLayer) and takes(layer):
            layers[i] = FusedDecoderLayer(layer, op)
            n += 1
    return n


def takes_fp32(layer: nn.Module) -> bool:
    """Whether `qwen3_layer_f32` takes this layer: the plain DecoderLayer (separate q/k/v and gate/up nn.Linear
    products without biases), every weight fp32 on the CPU, an even head_dim and whole query heads per KV head."""
    if type(layer) is not DecoderLayer:
        return False
    a, mlp = layer.self_attn, layer.mlp
    linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if not all(type(m) is nn.Linear and m.bias is None for m in linears):
        return False
    weights = [m.weight for m in linears] + [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                                             a.q_norm.weight, a.k_norm.weight]
    if not all(w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous() for w in weights):
        return False
    return a.head_dim % 2 == 0 and a.head_dim <= 1024 and a.n_heads % a.n_kv == 0


def fuse_fp32_layers(tts, build: str = "now") -> int:
    """Swap every fp32 decoder layer of the talker and the code predictor that `qwen3_layer_f32` takes
    (`takes_fp32`) for a FusedDecoderLayer. The loader calls it for narrow models in fp32 (quant.NARROW_HIDDEN), whose
    decode steps are mostly the ~25 small torch ops around each layer's products; the wide models keep the module
    path (its products are the time there, and its bits are the reference's). Returns how many were swapped (0
    where the kernel is not built here; with `build="background"` a library not built yet is built in a detached
    process for the next load: `kernels.fp32_layer_op`)."""
    talker = tts.talker
    return sum(fuse_fp32_stack_layers(s.layers, build) for s in (talker.model, talker.code_predictor.model))


def prepare_fp32_layers(talker_hidden: int) -> None:
    """Build the fp32 layer's library now (or find it) for a narrow model, before a command that times or compares
    runs (tune, bench, compare): every load then fuses alike, rather than a first load going without while the
    library builds in the background. Nothing for a wide model (which never fuses fp32 layers)."""
    from leapvox.engine.fast.quant import NARROW_HIDDEN

    if talker_hidden < NARROW_HIDDEN:
        kernels.fp32_layer_op()


def fuse_fp32_stack_layers(layers: nn.ModuleList, build: str = "now") -> int:
    """fuse_fp32_layers over one stack's layers."""
    op = kernels.fp32_layer_op(build)
    if op is None:
        return 0
    n = 0
    for i, layer in enumerate(layers):
        if takes_fp32(layer):
            layers[i] = FusedDecoderLayer(layer, op, FusedLayerF32)
            n += 1
    return n


ENV_SWITCH = "LEAPVOX_FUSED"  # "0": every layer takes the module path (A/B benchmarks)
_ENABLED = [os.environ.get(ENV_SWITCH, "1") != "0"]


def enabled() -> bool:
    """False inside `disabled()`."""
    return _ENABLED[0]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside this block every FusedDecoderLayer takes the module path (A/B tests in one process; a PredictorLoop
    built or looked up here calls no fused layer)."""
    saved = _ENABLED[0]
    _ENABLED[0] = False
    try:
        yield
    finally:
        _ENABLED[0] = saved


def fits(layer: nn.Module) -> bool:
    """Whether the kernel takes this layer's shapes (AVX-512 widths): head_dim a multiple of 32 up to 512, hidden and
    MLP widths multiples of 16, whole query heads per KV head. The checkpoints' (128; 1024, 2048; 3072, 6144) do."""
    a, mlp = layer.self_attn, layer.mlp
    d, hidden, inner = a.head_dim, mlp.down_proj.out_features, mlp.down_proj.in_features
    return d % 32 == 0 and d <= 512 and hidden % 16 == 0 and inner % 16 == 0 and a.n_heads % a.n_kv == 0


def usable(x: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether rows x [T, H] (and a mask, if any) can take a FusedLayer: fp32 on the CPU, no autograd, no tracing,
    a boolean [T, S] mask."""
    return kernels.takes(x) and (mask is None or (mask.dtype == torch.bool and mask.dim() == 2))
