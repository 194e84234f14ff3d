"""Building blocks shared by the talker, the code predictor and the codec transformer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back, then scaled by the weight in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scale: float = 1.0) -> torch.Tensor:
    """x normalised over its last dim in fp32, cast back to x's dtype, times `weight`: the one RMSNorm of the
    decoder layer, the predictor loop and the Core ML wrappers. A power-of-two `scale` squares x / scale instead
    (the same bits in fp32; keeps the sum of squares inside fp16's range in an export)."""
    h = x.to(torch.float32)
    if scale != 1.0:
        h, eps = h * (1.0 / scale), eps / (scale * scale)
    if not hasattr(F, "rms_norm") or torch.jit.is_tracing():  # the composite (same bits): torch < 2.4, an export
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * F.rms_norm(h, (h.shape[-1],), eps=eps).to(x.dtype)  # one fused kernel


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """Rotary inverse frequencies, [head_dim // 2], fp32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotate-half RoPE at integer `positions` [T]; each [T, head_dim] in `dtype`."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)  # no shape arithmetic: an exported (traced) graph stays static
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; cos/sin: [T, D] (or any shape that broadcasts against x)."""
    return x * cos + rotate_half(x) * sin


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
