"""The codec decoder's fast ops, handed to `codec.CodecDecoder` by the loader (models/checkpoint.py): oneDNN's direct
convolution and leapvox's compiled kernels (engine/fast/kernels/codec.cpp). Each keeps `codec.CodecOps`' contract (a
sample's bits do not depend on how the frames are chunked) and falls back to the plain torch op where its kernel
cannot take the input; the kernels are looked up at each call, so `kernels.disabled()` turns them off in a block."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.fast import kernels
from leapvox.engine.nets.codec import CodecOps

# Dense convs with at least this many (in x out) channel pairs take im2col + one matmul instead of oneDNN: oneDNN
# reorders a conv's weights on every call, which costs the first decoder conv (1024 -> 1536, k 7) more than the
# matmul; smaller convs are faster in oneDNN (tests/benchmarks/README.md, "Codec decoder").
ONEDNN_MAX_WEIGHTS = 1 << 20


def _onednn(x: torch.Tensor) -> bool:
    """Whether oneDNN's convolution can take x (a CPU torch build with oneDNN, fp32, or bf16 where the CPU has
    oneDNN's bf16 path: AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere torch's own bf16 convolution runs)."""
    if x.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return x.dtype == torch.float32 or x.dtype == torch.bfloat16 and _onednn_bf16()


@functools.cache
def _onednn_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class FastCodecOps(CodecOps):
    """oneDNN's convolution, and where they run, the compiled kernels: a fixed summation order per value for the
    products (`linear_f32`: no padding of small pushes), one pass for SnakeBeta and for the overlap-add, and the
    windowed attention without [n, W, D] temporaries."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        op = kernels.linear_op() if kernels.takes(x) and weight.dtype == torch.float32 else None
        if op is None or weight.stride(-1) != 1:
            return super().linear(x, weight, bias)
        return op(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])

    def swiglu(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if kernels.linear_op() is None or not kernels.takes(x) or mlp.gate_proj.weight.dtype != torch.float32:
            return super().swiglu(mlp, x)
        gate, up = self.linear(x, mlp.gate_proj.weight), self.linear(x, mlp.up_proj.weight)
        return self.linear(F.silu(gate) * up, mlp.down_proj.weight)

    def pointwise(self, h: torch.Tensor, pw1: nn.Linear, pw2: nn.Linear) -> torch.Tensor:
        if kernels.linear_op() is None or not kernels.takes(h) or pw1.weight.dtype != torch.float32:
            return super().pointwise(h, pw1, pw2)
        return self.linear(F.gelu(self.linear(h, pw1.weight, pw1.bias)), pw2.weight, pw2.bias)

    def conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int) -> torch.Tensor:
        if not _onednn(x) or weight.shape[0] * weight.shape[1] >= ONEDNN_MAX_WEIGHTS:
            return super().conv(x, weight, bias, dilation)
        x = x.contiguous()  # one layout in, one out, whatever the caller's strides (bf16 kernels follow them)
        return torch.mkldnn_convolution(x, weight, bias, [0], [1], [dilation], 1)

    def snake(self, x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        op = kernels.snake_op() if kernels.takes(x) and alpha.dtype == torch.float32 else None
        return super().snake(x, alpha, inv_beta) if op is None else op(x, alpha.view(-1), inv_beta.view(-1))

    def overlap_add(self, cols: torch.Tensor, prev: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
        op = kernels.overlap_add_op() if kernels.takes(cols) else None
        return super().overlap_add(cols, prev, bias, stride) if op is None else op(cols, prev, bias, stride)

    def window_attention(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        op = kernels.window_attention_op() if kernels.takes(q) and q.shape[-1] % 16 == 0 else None
        return super().window_attention(q, kv, mask, scale) if op is None else op(q, kv[0], kv[1], mask, scale)
