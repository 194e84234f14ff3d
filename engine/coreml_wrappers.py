"""Static-shape export wrappers of the talker and the code predictor (plain torch modules, traced for Core ML).

They reuse the engine's modules (so the weights are the same tensors) and recompute what the engine computes
in a form Core ML admits:

- KV caches are registered buffers `k{i}` / `v{i}` [1, n_kv, S, head_dim], one pair per layer: traced in-place
  writes become Core ML states (macOS 15). Functions that share a cache are built on the same buffers.
- Masks are additive float inputs with a finite large negative value (`MASK_MIN`), never -inf.
- RoPE cos/sin come from a table indexed by integer positions (computing pos * inv_freq in fp16 would be off
  by whole radians at long positions).
- Embedding lookups stay on the host: inputs are rows of embeddings, as the engine's stacks take them.
- RMSNorm can be told to square x / s for a power-of-two s (`norm_scales`): the result is bit-identical in fp32,
  and the sum of squares stays far from fp16's 65504 when the residual stream is large.

Code predictor calls (`PredictorCall`) cover prefill (T = 2), ar (T = 1) and verify (T = N + 1 rows of a draft
tree) with one formula: row r has depth d_r (static) and the call has a head base k (an input); the row's
verify logits come from LM head k + d_r on its hidden h_r, and its K draft logits from heads k + d_r + j on
h_r + b_{k+d_r, j} (j = 1..K; spec.py's drafting from the node where a walk stops). One call therefore verifies
a tree and drafts the next one. Rows are written at host-chosen cache slots (`slots`), so accepted rows never
move: the host marks them committed in the next mask (`PredictorSlots`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .code_predictor import CodePredictor
from .layers import RMSNorm, rope_cos_sin, rope_inv_freq
from .talker import Talker
from .transformer import DecoderLayer, DecoderStack

MASK_MIN = -1.0e4  # additive mask value: exp underflows to exactly 0 in fp32 and fp16, and it stays finite
PREDICTOR_ROPE_LEN = 32  # predictor positions stay below 1 + 15 + tree depth <= 31


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (True = may attend) -> 0 / MASK_MIN."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.full((), MASK_MIN, dtype=dtype))


def new_kv_state(stack: DecoderStack, context: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Zeroed per-layer K and V buffers [1, n_kv, context, head_dim]: k0, v0, k1, v1, ..."""
    c = stack.cfg
    shape = (1, c.num_key_value_heads, context, c.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * c.num_hidden_layers)]


def power_of_two_scale(max_rms: float) -> float:
    """The smallest power of two s >= max_rms (1 when activations are small): (x / s) has RMS <= 1."""
    return 1.0 if max_rms <= 1.0 else float(2 ** math.ceil(math.log2(max_rms)))


def rms_norm(norm: RMSNorm, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The engine's RMSNorm; with a power-of-two `scale` it squares x / scale (bit-identical in fp32)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    if scale != 1.0:
        h = h * (1.0 / scale)
        return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps / (scale * scale))).to(dtype)
    return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps)).to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """layers.apply_rope with the half width as a constant (no shape arithmetic in the traced graph)."""
    half = head_dim // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Stack(nn.Module):
    """Shared machinery: one decoder stack, its per-layer K/V buffers and a RoPE table."""

    def __init__(self, stack: DecoderStack, state: list[torch.Tensor], rope_len: int, norm_scales: dict | None,
                 rows: int):
        super().__init__()
        self.stack, self.rows = stack, rows
        self.kv_len = state[0].shape[2]  # keys attended per call (prefill: its own rows)
        self.n_layers = len(stack.layers)
        for i in range(self.n_layers):
            self.register_buffer(f"k{i}", state[2 * i])
            self.register_buffer(f"v{i}", state[2 * i + 1])
        c = stack.cfg
        dtype = next(stack.parameters()).dtype
        cos, sin = rope_cos_sin(rope_inv_freq(c.head_dim, c.rope_theta), torch.arange(rope_len), dtype)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)
        self.norm_scales = dict(norm_scales or {})

    def state_names(self) -> list[str]:
        return [f"{kv}{i}" for i in range(self.n_layers) for kv in "kv"]

    def _scale(self, name: str) -> float:
        return self.norm_scales.get(name, 1.0)

    def _layer(self, i: int, layer: DecoderLayer, x, cos, sin, write, mask) -> torch.Tensor:
        """One decoder block; `write(i, k, v)` stores the new rows and returns the keys/values to attend over.
        Shapes are static Python ints (batch 1, T rows), so the traced graph has no shape arithmetic."""
        a = layer.self_attn
        t, nh, nkv, hd = self.rows, a.n_heads, a.n_kv, a.head_dim
        h = rms_norm(layer.input_layernorm, x, self._scale(f"layers.{i}.input_layernorm"))
        q = a.q_proj(h).view(1, t, nh, hd)
        k = a.k_proj(h).view(1, t, nkv, hd)
        q = rms_norm(a.q_norm, q, self._scale(f"layers.{i}.self_attn.q_norm")).transpose(1, 2)  # [1, H, T, D]
        k = rms_norm(a.k_norm, k, self._scale(f"layers.{i}.self_attn.k_norm")).transpose(1, 2)  # [1, KV, T, D]
        v = a.v_proj(h).view(1, t, nkv, hd).transpose(1, 2)
        q, k = _rope(q, cos, sin, hd), _rope(k, cos, sin, hd)
        keys, values = write(i, k, v)  # [1, KV, S, D]
        rep, s = nh // nkv, self.kv_len
        if rep > 1:
            keys = keys[:, :, None].expand(1, nkv, rep, s, hd).reshape(1, nh, s, hd)  # = repeat_interleave(rep, 1)
            values = values[:, :, None].expand(1, nkv, rep, s, hd).reshape(1, nh, s, hd)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [1, H, T, D]
        x = x + a.o_proj(out.transpose(1, 2).reshape(1, t, nh * hd))
        h = rms_norm(layer.post_attention_layernorm, x, self._scale(f"layers.{i}.post_attention_layernorm"))
        return x + layer.mlp(h)

    def _run(self, x, cos, sin, write, mask) -> torch.Tensor:
        for i, layer in enumerate(self.stack.layers):
            x = self._layer(i, layer, x, cos, sin, write, mask)
        return rms_norm(self.stack.norm, x, self._scale("norm"))


class TalkerPrefill(_Stack):
    """Prompt rows x [1, P, H] at positions/slots 0..P-1 (pad a shorter prompt; padded rows are never attended
    to by real rows, and decode overwrites their slots) -> (hidden [1, P, H], code-0 logits [1, P, V])."""

    def __init__(self, talker: Talker, state: list[torch.Tensor], prefill_len: int, norm_scales: dict | None = None):
        context = state[0].shape[2]
        if prefill_len > context:
            raise ValueError(f"prefill length {prefill_len} exceeds the cache length {context}")
        super().__init__(talker.model, state, context, norm_scales, prefill_len)
        self.head = talker.codec_head
        self.prefill_len = self.kv_len = prefill_len
        causal = torch.ones(prefill_len, prefill_len, dtype=torch.bool).tril()
        self.register_buffer("causal", additive_mask(causal, self.rope_cos.dtype))

    def _write(self, i, k, v):
        p = self.prefill_len
        kb, vb = getattr(self, f"k{i}"), getattr(self, f"v{i}")
        kb[:, :, :p] = k
        vb[:, :, :p] = v
        return k, v  # prefill attends to its own rows only

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.prefill_len
        h = self._run(x, self.rope_cos[:p], self.rope_sin[:p], self._write, self.causal)
        return h, self.head(h)


class TalkerDecode(_Stack):
    """One frame row x [1, 1, H] at slot = position `pos` [1] (int32), attending under `mask` [1, S] (0 or
    MASK_MIN; allow slots 0..pos) -> (hidden [1, 1, H], code-0 logits [1, 1, V]). Shares buffers with prefill."""

    def __init__(self, talker: Talker, state: list[torch.Tensor], norm_scales: dict | None = None):
        super().__init__(talker.model, state, state[0].shape[2], norm_scales, 1)
        self.head = talker.codec_head

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def write(i, k, v):
            kb, vb = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            torch.ops.aten.index_put_(kb, [None, None, pos], k)  # one slot at a dynamic index: slice_update
            torch.ops.aten.index_put_(vb, [None, None, pos], v)
            return kb, vb

        cos, sin = self.rope_cos.index_select(0, pos), self.rope_sin.index_select(0, pos)
        h = self._run(x, cos, sin, write, mask)
        return h, self.head(h)


def stacked_offsets(offsets: torch.Tensor | None, heads: int, drafts: int, hidden: int) -> torch.Tensor:
    """Offsets as [heads, 1 + K, Hc]: column 0 is zero (verify), column j is b_{head, j} (shared or per position)."""
    out = torch.zeros(heads, 1 + drafts, hidden)
    if offsets is not None and drafts:
        b = offsets.float()
        b = b[None].expand(heads, *b.shape) if b.dim() == 2 else b
        if b.shape[1] < drafts:
            raise ValueError(f"offsets hold {b.shape[1]} draft depths, the call drafts {drafts}")
        out[:, 1:] = b[:heads, :drafts]
    return out


class PredictorCall(_Stack):
    """One code-predictor call over T rows with static per-row `depths` (non-decreasing, rows grouped by depth).

    Inputs: rows [1, T, H_talker] (embeddings at talker width; projected here), positions [T] and slots [T]
    (int32), mask [T, S] additive (committed slots, ancestors and self at 0), k [1] int32 (head base).
    Outputs: logits [T, V] (head k + d_r on h_r) and, with drafts K > 0, drafts [T, K, V] (heads k + d_r + j on
    h_r + b_{k+d_r, j}). Head indices past the last head are clamped: such rows carry codes past 15 and the host
    ignores them."""

    def __init__(self, cp: CodePredictor, state: list[torch.Tensor], depths: tuple[int, ...], drafts: int = 0,
                 offsets: torch.Tensor | None = None, norm_scales: dict | None = None):
        super().__init__(cp.model, state, PREDICTOR_ROPE_LEN, norm_scales, len(depths))
        if list(depths) != sorted(depths) or depths[0] != 0:
            raise ValueError(f"row depths must start at 0 and not decrease, got {depths}")
        self.proj = cp.small_to_mtp_projection
        self.depths, self.drafts, self.n_heads = tuple(depths), drafts, cp.num_heads
        dtype = self.rope_cos.dtype
        # LM heads stacked as [15 * V, Hc] so that per-channel weight quantization is per output row
        self.register_buffer("heads", torch.cat([h.weight for h in cp.lm_head]))
        hidden = self.hidden = cp.cfg.hidden_size
        self.vocab = cp.cfg.vocab_size
        self.register_buffer("offsets", stacked_offsets(offsets, cp.num_heads, drafts, hidden).to(dtype))
        self.register_buffer("slot_ids", torch.arange(state[0].shape[2], dtype=torch.int32))
        self.register_buffer("head_steps", torch.arange(32, dtype=torch.int32))
        self.register_buffer("last_head", torch.tensor([cp.num_heads - 1], dtype=torch.int32))
        self.groups = [(d, depths.index(d), len(depths) - depths[::-1].index(d)) for d in sorted(set(depths))]

    def _write_at(self, slots: torch.Tensor):
        onehot = (slots[:, None] == self.slot_ids[None, :]).to(self.rope_cos.dtype)  # [T, S]
        keep = (1.0 - onehot.sum(0))[:, None]  # [S, 1]: 0 where a row lands

        def write(i, k, v):
            kb, vb = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            k_all = kb * keep + onehot.t() @ k  # [1, KV, S, D]: exact (one non-zero term per slot)
            v_all = vb * keep + onehot.t() @ v
            kb[0] = k_all[0]  # select + copy: a whole-state update in the traced graph
            vb[0] = v_all[0]
            return k_all, v_all

        return write

    def forward(self, rows, positions, slots, mask, k):
        x = self.proj(rows)  # [1, T, Hc]
        cos, sin = self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions)
        h = self._run(x, cos, sin, self._write_at(slots), mask)[0]  # [T, Hc]
        span = self.depths[-1] + self.drafts + 1
        head_ids = torch.minimum(k + self.head_steps[:span], self.last_head)  # int32 throughout
        heads = self.heads.view(self.n_heads, self.vocab, self.hidden)  # [15, V, Hc]
        w = heads.index_select(0, head_ids)  # [span, V, Hc]
        b = self.offsets.index_select(0, torch.minimum(k + self.head_steps[: self.depths[-1] + 1], self.last_head))
        out = []
        for d, lo, hi in self.groups:
            xd = h[lo:hi][None] + b[d][:, None]  # [1+K, n_d, Hc]
            out.append(xd @ w[d : d + self.drafts + 1].transpose(1, 2))  # [1+K, n_d, V]
        y = torch.cat(out, dim=1)  # [1+K, T, V]
        if self.drafts == 0:
            return y[0]
        return y[0], y[1:].transpose(0, 1)


class PredictorSlots:
    """Host-side bookkeeping of the predictor cache: which slots hold committed rows (never moved or rewritten);
    each call's rows go to free slots; the mask lets a row see every committed slot plus its own tree ancestors."""

    def __init__(self, context: int):
        self.context = context
        self.committed: list[int] = []

    def reset(self) -> None:
        self.committed = []

    def alloc(self, n: int) -> list[int]:
        taken = set(self.committed)
        free = [s for s in range(self.context) if s not in taken][:n]
        if len(free) < n:
            raise RuntimeError(f"predictor cache of {self.context} slots is full")
        return free

    def mask(self, slots: list[int], ancestors: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """[T, S] additive mask; `ancestors` [T, T] bool (row i may see row j of this call)."""
        allowed = torch.zeros(len(slots), self.context, dtype=torch.bool)
        allowed[:, self.committed] = True
        allowed[:, slots] = ancestors
        return additive_mask(allowed, dtype)

    def commit(self, slots: list[int]) -> None:
        self.committed.extend(slots)
