"""Static-shape export wrappers of the talker, the code predictor and the codec decoder (plain torch modules,
traced for Core ML).

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

The codec decoder (`CodecChunk`) is one streaming step of C frames whose carried state (conv tails, spills,
attention windows) is explicit inputs and outputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# the host-side mask and slot bookkeeping the runtime uses are the export's too
from leapvox.engine.coreml.runtime import MASK_MIN, PredictorSlots, additive_mask  # noqa: F401
from leapvox.engine.nets import layers
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.nets.layers import RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq
from leapvox.engine.nets.talker import Talker
from leapvox.engine.nets.transformer import DecoderLayer, DecoderStack

PREDICTOR_ROPE_LEN = 32  # predictor positions stay below 1 + 15 + tree depth <= 31


def new_kv_state(stack: DecoderStack, context: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Zeroed per-layer K and V buffers [1, n_kv, context, head_dim]: k0, v0, k1, v1, ..."""
    c = stack.cfg
    shape = (1, c.num_key_value_heads, context, c.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * c.num_hidden_layers)]


def power_of_two_scale(max_rms: float) -> float:
    """The smallest power of two s >= max_rms (1 when activations are small): (x / s) has RMS <= 1."""
    return 1.0 if max_rms <= 1.0 else float(2 ** math.ceil(math.log2(max_rms)))


def rms_norm(norm: RMSNorm, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The engine's RMSNorm (`layers.rms_norm`); with a power-of-two `scale` it squares x / scale (the same bits in
    fp32)."""
    return layers.rms_norm(x, norm.weight, norm.eps, scale)


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
        """`transformer.DecoderLayer.forward` for Core ML (tests/test_coreml.py checks one against the other):
        `write(i, k, v)` stores the new rows and returns the keys/values to attend over, norms take their
        `norm_scales`, and shapes are static Python ints (batch 1, T rows), so the traced graph has no shape
        arithmetic."""
        a = layer.self_attn
        t, nh, nkv, hd = self.rows, a.n_heads, a.n_kv, a.head_dim
        h = rms_norm(layer.input_layernorm, x, self._scale(f"layers.{i}.input_layernorm"))
        q, k, v = a.project(h)
        q = rms_norm(a.q_norm, q.view(1, t, nh, hd), self._scale(f"layers.{i}.self_attn.q_norm")).transpose(1, 2)
        k = rms_norm(a.k_norm, k.view(1, t, nkv, hd), self._scale(f"layers.{i}.self_attn.k_norm")).transpose(1, 2)
        v = v.view(1, t, nkv, hd).transpose(1, 2)  # q [1, H, T, D]; k, v [1, KV, T, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
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


# ---------------------------------------------------------------------------------------------------- codec


class CodecChunk(nn.Module):
    """One streaming step of the 12 Hz codec decoder: codes [1, 16, C] (int32) + carried state -> wav
    [1, 1, 1920 * C] + the next state, equal to `CodecStream.push` of the same C frames (to fp32 rounding).

    The carried state is explicit inputs/outputs (`state_shapes()`, in order): each causal conv's last input
    samples, each transposed conv's spill, each attention layer's last window-1 keys and values. The frame
    counter stays on the host, which passes the RoPE cos/sin [C, D] and the window mask [C, W-1+C] for it
    (`host_inputs`). Convolutions are plain conv1d here (the engine's im2col matmuls have no Core ML op)."""

    def __init__(self, decoder, frames: int):
        super().__init__()
        self.dec, self.frames, cfg = decoder, frames, decoder.config
        self.window, self.head_dim, self.theta = cfg.sliding_window, cfg.head_dim, cfg.rope_theta
        q = decoder.quantizer
        books = [layer._codebook for layer in (*q.rvq_first.vq.layers, *q.rvq_rest.vq.layers)]
        # codebook rows as the engine forms them (embedding_sum / usage), one table per quantizer
        self.register_buffer("books", torch.stack([b.embedding_sum / b.cluster_usage.clamp(min=1e-5)[:, None]
                                                   for b in books]))  # [16, size, dim]
        self._shapes: list[tuple[int, ...]] = []
        self._state_in: list[torch.Tensor] = []
        self._state_out: list[torch.Tensor] = []

    # -- state plumbing: modules take their carried tensor in a fixed call order
    def _take(self, shape: tuple[int, ...]) -> torch.Tensor:
        i = len(self._state_out)
        if self._state_in is None:  # shape discovery pass
            self._shapes.append(shape)
            return torch.zeros(shape)
        return self._state_in[i]

    def _conv(self, m, x: torch.Tensor) -> torch.Tensor:
        c = m.conv
        if m.pad:
            x = torch.cat([self._take((1, x.shape[1], m.pad)), x], dim=-1)
            self._state_out.append(x[..., -m.pad :])
        return F.conv1d(x, c.weight, c.bias, dilation=m.dilation, groups=c.groups)

    def _trans(self, m, x: torch.Tensor, length: int) -> torch.Tensor:
        """Transposed conv over `length` input frames (a static int: no shape arithmetic in the traced graph)."""
        w, c_out = m.conv.weight, m.conv.out_channels  # w: [C_in, C_out, k]
        cols = (x.transpose(1, 2) @ w.flatten(1)).view(1, length, c_out, -1)  # [1, L, C_out, k]
        y = cols[..., : m.stride]
        if m.overlap:
            tail = cols[..., m.stride :]  # [1, L, C_out, overlap]
            spill = torch.cat([self._take((1, 1, c_out, m.overlap)), tail], dim=1)
            self._state_out.append(spill[:, length:])
            y = torch.cat([y[..., : m.overlap] + spill[:, :length], y[..., m.overlap :]], dim=-1)
        return y.permute(0, 2, 1, 3).reshape(1, c_out, length * m.stride) + m.conv.bias[:, None]

    def _attention(self, a, x, cos, sin, mask) -> torch.Tensor:
        n, hd = self.frames, self.head_dim
        q, k, v = (p(x).view(1, n, -1, hd).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv = torch.cat([self._take((2, 1, a.n_kv, self.window - 1, hd)), torch.stack([k, v])], dim=3)
        self._state_out.append(kv[:, :, :, n:])
        keys, values = kv[0], kv[1]
        if a.n_kv != a.n_heads:
            rep = a.n_heads // a.n_kv
            keys = keys[:, :, None].expand(1, a.n_kv, rep, -1, hd).reshape(1, a.n_heads, -1, hd)
            values = values[:, :, None].expand(1, a.n_kv, rep, -1, hd).reshape(1, a.n_heads, -1, hd)
        scores = (q @ keys.transpose(-1, -2)) * hd**-0.5 + mask  # [1, H, C, W-1+C]
        out = scores.softmax(-1) @ values
        return a.o_proj(out.transpose(1, 2).reshape(1, n, -1))

    def _convnext(self, m, x) -> torch.Tensor:
        h = m.norm(self._conv(m.dwconv, x).transpose(1, 2))
        return x + (m.gamma * m.pwconv2(F.gelu(m.pwconv1(h)))).transpose(1, 2)

    def _unit(self, m, x) -> torch.Tensor:
        return self._conv(m.conv2, m.act2(self._conv(m.conv1, m.act1(x)))) + x

    def forward(self, codes, cos, sin, mask, *state):
        self._state_in, self._state_out = list(state), []
        return self._decode(codes, cos, sin, mask)

    def _decode(self, codes, cos, sin, mask):
        d, idx = self.dec, codes[0]  # [16, C]
        rows = [self.books[i].index_select(0, idx[i]) for i in range(self.books.shape[0])]  # each [C, dim]
        first, rest = rows[0], torch.stack(rows[1:]).sum(0)
        q = d.quantizer
        h = first @ q.rvq_first.output_proj.weight[..., 0].t() + rest @ q.rvq_rest.output_proj.weight[..., 0].t()
        h = self._conv(d.pre_conv, h.t()[None]).transpose(1, 2)  # [1, C, latent]
        pt = d.pre_transformer
        x = pt.input_proj(h)
        for layer in pt.layers:
            x = x + layer.self_attn_layer_scale.scale * self._attention(
                layer.self_attn, layer.input_layernorm(x), cos, sin, mask)
            x = x + layer.mlp_layer_scale.scale * layer.mlp(layer.post_attention_layernorm(x))
        h = pt.output_proj(pt.norm(x)).transpose(1, 2)  # [1, latent, C]
        length = self.frames
        for trans, convnext in d.upsample:
            h = self._convnext(convnext, self._trans(trans, h, length))
            length *= trans.stride
        h = self._conv(d.decoder[0], h)
        for block in d.decoder[1:-2]:
            h = self._trans(block.block[1], block.block[0](h), length)
            length *= block.block[1].stride
            for unit in block.block[2:]:
                h = self._unit(unit, h)
        wav = self._conv(d.decoder[-1], d.decoder[-2](h)).clamp(-1.0, 1.0)
        return (wav, *self._state_out)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the carried tensors, in input/output order (found by one dry run)."""
        if not self._shapes:
            self._state_in, self._state_out = None, []
            cos, sin, mask = self.host_inputs(0)
            with torch.no_grad():
                self._decode(torch.zeros(1, 16, self.frames, dtype=torch.int32), cos, sin, mask)
        return list(self._shapes)

    def initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(s) for s in self.state_shapes()]

    def host_inputs(self, start: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin [C, D] for frames start..start+C-1 and the additive window mask [C, W-1+C]: query i sees keys
        i..i+W-1 (key j holds frame start + j - (W-1)), of which those before frame 0 are masked."""
        n, w = self.frames, self.window
        cos, sin = rope_cos_sin(rope_inv_freq(self.head_dim, self.theta), torch.arange(start, start + n), dtype)
        i, j = torch.arange(n)[:, None], torch.arange(w - 1 + n)[None, :]
        allowed = (j >= i) & (j <= i + w - 1) & (j >= w - 1 - min(start, w - 1))
        return cos, sin, additive_mask(allowed, dtype)
