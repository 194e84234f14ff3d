"""The Qwen3 decoder stack used by both the talker and the code predictor, with a preallocated KV cache.

The cache is a pair of buffers per layer, written at explicit slots; attention reads the slots [0, end).
Static buffer shapes keep torch.compile and Core ML export possible; rewinding is moving `end` back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.config import TransformerConfig
from leapvox.engine.nets.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq


class KVCache(nn.Module):
    """Keys and values of one layer: [B, n_kv, max_len, head_dim] each."""

    def __init__(
        self, batch: int, n_kv: int, max_len: int, head_dim: int, dtype: torch.dtype, device=None, zeroed: bool = True
    ):
        super().__init__()
        shape = (batch, n_kv, max_len, head_dim)
        new = torch.zeros if zeroed else torch.empty  # empty: no page is touched (resident) before a row is written
        self.register_buffer("k", new(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", new(shape, dtype=dtype, device=device), persistent=False)
        self.zeroed = zeroed  # False: slots not yet written may hold anything

    def zero_slots(self, n: int) -> None:
        """Zero slots 0 .. n-1 (in inference mode when the buffers were made in it)."""
        with torch.inference_mode(self.k.is_inference()):
            self.k[:, :, :n].zero_()
            self.v[:, :, :n].zero_()

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [B, n_kv, T, D] in slots start .. start+T-1."""
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """Grouped-query attention, the one helper of every decoder layer: q [B, H, T, D] over keys, values
    [B, KV, S, D] (query head h reads KV head h // (H / KV)) under `mask` (bool True = may attend, or additive,
    broadcastable to [B, H, T, S]; None: every key), or causally -> [B, T, H * D]."""
    b, h, t, d = q.shape
    rep = h // keys.shape[1]
    if t == 1 and rep > 1 and not causal:  # one row (a decode step): group the query heads by KV head, no copy
        out = F.scaled_dot_product_attention(q.reshape(b, h // rep, rep, d), keys, values, attn_mask=mask)
        return out.reshape(b, 1, h * d)  # [B, KV, rep, D] = [B, 1, H * D]
    if rep > 1:
        keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)  # [B, H, S, D]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(b, t, h * d)


class Attention(nn.Module):
    """Multi-head attention with per-head RMS QK-norm before RoPE and grouped KV heads."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The q, k, v projections of x [B, T, H]."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start: int = 0,
        mask: torch.Tensor | None = None,
        span: int | None = None,
    ) -> torch.Tensor:
        """With a cache: write k, v of x at slots start..start+T-1, attend over slots [0, span) (default start+T)
        under mask. Without (training, teacher forcing): attend over x itself, causally unless `mask` is given."""
        b, t, _ = x.shape
        q, k, v = self.project(x)
        q = self.q_norm(q.view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(k.view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)  # [B, KV, T, D]
        v = v.view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            return self.o_proj(attend(q, k, v, mask, causal=mask is None))
        cache.write(start, k, v)
        end = start + t if span is None else span
        return self.o_proj(attend(q, cache.k[:, :, :end], cache.v[:, :, :end], mask))


class DecoderLayer(nn.Module):
    """A pre-norm Qwen3 block: x + attention(norm(x)), then + SwiGLU(norm(x)). The cached forward (talker steps,
    the reference predictor loop, spec verify calls, the window ring) and the training forward (no cache, residual
    dropout) are this one call; fast backends replace the whole module (engine.fast.fused) or its products
    (engine.fast.quant) from outside, with the same call."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, cache=None, start=0, mask=None, span=None, dropout: float = 0.0):
        """x [B, T, H] -> [B, T, H]; cache, start, mask, span as `Attention.forward`; `dropout` on the residual
        branches while training."""
        a = self.self_attn(self.input_layernorm(x), cos, sin, cache, start, mask, span)
        x = x + (F.dropout(a, dropout, self.training) if dropout else a)
        m = self.mlp(self.post_attention_layernorm(x))
        return x + (F.dropout(m, dropout, self.training) if dropout else m)


def causal_mask(start: int, t: int, device=None) -> torch.Tensor | None:
    """Boolean [T, start+T] mask (True = may attend) for T new rows after `start` cached ones; None for T = 1."""
    if t == 1:
        return None
    rows = torch.arange(start, start + t, device=device)[:, None]
    cols = torch.arange(start + t, device=device)[None, :]
    return cols <= rows


class DecoderStack(nn.Module):
    """Layers + final norm over input embeddings. Call `setup_cache` before `forward`."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.caches: nn.ModuleList | None = None

    def setup_cache(
        self, max_len: int, batch: int = 1, dtype: torch.dtype | None = None, zeroed: bool = True
    ) -> None:
        """Allocate KV buffers for `max_len` positions and the RoPE table (reused if already big enough and of the
        same batch size and dtype). `zeroed=False` is for callers that read only slots they wrote (ar's full
        cache): the buffers are left unset, so memory becomes resident as rows are written, not for the whole
        frame cap up front; a zeroed request that reuses such buffers zeroes its first `max_len` slots."""
        p = next(self.layers.parameters())
        dtype = dtype or p.dtype
        c = self.cfg
        if (
            self.caches is not None
            and self.cache_len >= max_len
            and self.caches[0].k.dtype == dtype
            and self.caches[0].k.shape[0] == batch
        ):
            if zeroed:
                for cache in self.caches:
                    if not cache.zeroed:
                        cache.zero_slots(max_len)
            return
        self.caches = nn.ModuleList(
            KVCache(batch, c.num_key_value_heads, max_len, c.head_dim, dtype, p.device, zeroed) for _ in self.layers
        )
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta).to(p.device)
        cos, sin = rope_cos_sin(inv_freq, torch.arange(max_len, device=p.device), dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward_train(self, x: torch.Tensor, dropout: float = 0.0, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Whole sequences x [B, T, H] at positions 0..T-1, no cache -> final-normed hidden [B, T, H]. Causal, or
        under `mask` (boolean True = may attend, or additive float; [B or 1, 1, T, T]) when given."""
        c = self.cfg
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta).to(x.device)
        cos, sin = rope_cos_sin(inv_freq, torch.arange(x.shape[1], device=x.device), x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask=mask, dropout=dropout)
        return self.norm(x)

    @property
    def cache_len(self) -> int:
        return 0 if self.caches is None else self.caches[0].k.shape[2]

    def kv_bytes(self, used: int) -> int:
        """Bytes of K and V held for `used` positions."""
        if self.caches is None:
            return 0
        k = self.caches[0].k
        return 2 * len(self.caches) * k.shape[0] * k.shape[1] * used * k.shape[3] * k.element_size()

    def forward(
        self,
        x: torch.Tensor,
        start: int,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B, T, H] written to cache slots start..start+T-1 -> final-normed hidden states [B, T, H].

        RoPE positions default to the slots; a draft tree passes its own `positions` [T] and `mask`.
        """
        t = x.shape[1]
        if self.caches is None or start + t > self.cache_len:
            raise RuntimeError(f"KV cache too small: need {start + t} positions, have {self.cache_len}")
        if positions is None:
            cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        if mask is None:
            mask = causal_mask(start, t, x.device)
        for layer, cache in zip(self.layers, self.caches, strict=True):
            x = layer(x, cos, sin, cache, start, mask)
        return self.norm(x)

    def rope_at(self, position: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, D] for positions position..position+T-1, computed when they run past the table."""
        if position + t <= self.rope_cos.shape[0]:
            return self.rope_cos[position : position + t], self.rope_sin[position : position + t]
        c = self.cfg
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta).to(self.rope_cos.device)
        positions = torch.arange(position, position + t, device=inv_freq.device)
        return rope_cos_sin(inv_freq, positions, self.rope_cos.dtype)

    def forward_ring(self, x: torch.Tensor, slot: int, position: int, mask: torch.Tensor, span: int) -> torch.Tensor:
        """x [B, T, H] written to slots slot..slot+T-1 with RoPE at absolute positions position..; attends over
        slots [0, span) under the boolean mask [T, span] -> final-normed hidden [B, T, H] (a windowed cache)."""
        if self.caches is None or max(slot + x.shape[1], span) > self.cache_len:
            raise RuntimeError(f"KV cache too small: need {max(slot + x.shape[1], span)} slots, have {self.cache_len}")
        cos, sin = self.rope_at(position, x.shape[1])
        for layer, cache in zip(self.layers, self.caches, strict=True):
            x = layer(x, cos, sin, cache, slot, mask, span)
        return self.norm(x)
