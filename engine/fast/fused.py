"""A Qwen3 decoder layer as one call into leapvox's compiled kernel, for w8a8 weights at batch 1.

At batch 1 a decoder layer's time on the CPU is mostly not its products: the 0.6B code predictor's 15-code frame
spent 36 of its 80 ms outside the w8a8 kernel (RMSNorms, RoPE, the attention call, the down projection's Hadamard
rotation, and dispatching ~25 small torch ops per layer). `engine/kernels/w8a8.cpp`'s `qwen3_layer` runs the whole
layer in C++ instead: the norms, the fused q/k/v product, per-head q/k norms and RoPE, the K/V write, attention over
the cached slots (causal or under a mask), the output product and residual, then the MLP (fused gate/up, SiLU, the
rotation as a fast Walsh-Hadamard transform, down) and its residual. The products are the same w8a8 kernel calls
the module path makes; the rest is fp32 in another order of operations, so it equals the module path up to fp32
rounding (tests/test_kernels.py), not bit for bit.

`fused_layer(layer)` returns the layer's `FusedLayer` when every product in it is a W8A8Linear on leapvox's kernel
(none has a bias; the model's dtype is fp32), else None. Both the module path (`transformer.DecoderLayer`, which the
talker and the reference predictor loop run) and `predictor.PredictorLoop` take it, so they stay equal to each
other. Measured in tests/benchmarks/README.md ("Fused layer").
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from . import kernels
from .quant import W8A8Linear


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


def _parts(layer: nn.Module) -> tuple | None:
    a, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    parts = (getattr(a, "qkv_proj", None), getattr(a, "o_proj", None), getattr(mlp, "gate_up_proj", None),
             getattr(mlp, "down_proj", None))
    if not all(isinstance(m, W8A8Linear) and m.op is not None and not m.has_bias for m in parts):
        return None
    return parts


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ENV_SWITCH = "LEAPVOX_FUSED"  # "0": every layer takes the module path (A/B benchmarks)
_ENABLED = [os.environ.get(ENV_SWITCH, "1") != "0"]


def enabled() -> bool:
    """False inside `disabled()`."""
    return _ENABLED[0]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside this block every layer takes the module path (A/B benchmarks and tests in one process; a
    PredictorLoop built or looked up here has no fused layers)."""
    saved = _ENABLED[0]
    _ENABLED[0] = False
    try:
        yield
    finally:
        _ENABLED[0] = saved


def fused_layer(layer: nn.Module) -> FusedLayer | None:
    """The layer's FusedLayer (built on first use, rebuilt when its product modules are replaced), or None when
    the layer is not entirely w8a8 on leapvox's kernel, its norms are not fp32, the kernel is not built here, or
    inside `disabled()`."""
    if not _ENABLED[0]:
        return None
    cached = _FUSED.get(layer)
    parts = _parts(layer)
    sig = None if parts is None else tuple(id(m.wpack) for m in parts)
    if cached is not None and cached[0] == sig:
        return cached[1]
    fused = None
    if parts is not None and layer.input_layernorm.weight.dtype == torch.float32 and fits(layer):
        op = kernels.layer_op()
        fused = None if op is None else FusedLayer(layer, op)
    _FUSED[layer] = (sig, fused)
    return fused


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
