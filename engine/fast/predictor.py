"""The code predictor's codes 1..15 of a frame (ar), and its 15-code loop for batch 1 without generic machinery.

`PredictorLoop` computes exactly what `predict_codes_reference` (the loop over `CodePredictor.forward`) computes,
bit for bit in every weight format, with the same random draws in the same order. It is a specialisation of
`transformer.DecoderLayer`, kept because it is faster (no module calls, and fp32 single-row products on both
threads; `tests/benchmarks/bench.py` times both loops): it reads the layers' own weight tensors (no copy), and
norms, rotates and attends with the layer's own helpers (`layers.rms_norm`, `layers.apply_rope`,
`transformer.attend`); a layer swapped for a `fused.FusedDecoderLayer` runs as that layer's one compiled call.

  - its own K/V buffers (the `KVCache` layout), RoPE tables and prefill mask, allocated once;
  - q and k are normed and rotated together (one RMSNorm over the query and key heads, one RoPE);
  - both cores on fp32 matrix-vector products: PyTorch's fp32 product over one row runs on one thread (MKL), so
    each single-row fp32 product on the CPU is one batched product over the two halves of the weight's rows
    (torch.bmm hands one half to each thread; the result is bit-identical).

spec mode's verify calls run here too (`rows`: the root and draft-tree rows under a tree mask at depth positions,
in slots after the committed prefix; `commit`: the accepted rows moved into place); their fp32 products over
several rows take the same two-half split, equal to the module path's up to rounding (SPLIT_ROWS_MAX).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.fast import fused as fusion
from leapvox.engine.fast.quant import ACT_DTYPE, DEQUANT_ROWS, FusedAttention, FusedSwiGLU, Int8Linear, W8A8Linear
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.nets.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq
from leapvox.engine.nets.transformer import attend, causal_mask
from leapvox.engine.sampling import SamplingParams, pick

Product = Callable[[torch.Tensor], torch.Tensor]


def predict_codes_reference(
    cp: CodePredictor,
    talker_hidden: torch.Tensor,
    code0_embed: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The plain loop over the predictor's modules (the naive path the fast loop must equal): codes 1..15 [B, 15]
    from the talker's normed hidden [B, 1, H] and C(code 0) [B, 1, H]. Uses the predictor's own KV cache."""
    x = cp.prefill_rows(talker_hidden, code0_embed)  # [B, 2, Hc]
    start = 0
    codes = []
    for head in range(cp.num_heads):
        h = cp.model(x, start)[:, -1]  # [B, Hc]
        codes.append(pick(cp.lm_head[head](h).float(), params, generator))
        start += x.shape[1]
        if head + 1 < cp.num_heads:
            x = cp.embed(head + 1, codes[-1][:, None])  # [B, 1, Hc]
    return torch.stack(codes, dim=1)


# spec's verify calls feed 2..65 rows (root + draft tree); PyTorch's fp32 product over that few rows runs far from
# the bandwidth floor on the CPU and the two-half bmm is faster there. Not bit-identical to F.linear at T > 1, so
# only verify calls use it.
SPLIT_ROWS_MAX = 128


def product(linear: nn.Module, split: bool, rows: bool = False) -> Product:
    """x [T, K] -> linear(x) [T, N], bit-identical to calling the module, without the module call.

    With `split`, a single-row fp32 product is one torch.bmm over the two halves of the weight's output rows,
    which PyTorch runs on two threads (its fp32 matrix-vector product uses one). With `rows` too, products over
    2..SPLIT_ROWS_MAX rows take the same two-half bmm: faster, equal to the module's product up to rounding."""
    if isinstance(linear, Int8Linear):
        codes, scales = linear.codes, linear.scales
        if linear.bias is not None or not linear.kernel:  # no kernel for this shape: the layer's dequantize path
            return linear.forward

        def int8(x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > DEQUANT_ROWS:
                return linear.forward(x)
            return torch.ops.aten._weight_int8pack_mm(x.to(ACT_DTYPE), codes, scales).to(x.dtype)

        return int8
    if isinstance(linear, W8A8Linear):  # x is fp32 [T, K] here: the kernel's own input, no reshape or cast
        if linear.rotation is not None:
            return linear.forward
        return linear.product()
    if not isinstance(linear, nn.Linear):
        return linear  # Identity, or a module we do not know: call it
    w, b = linear.weight, linear.bias
    n, k = w.shape
    # a bias is added inside F.linear's product (not always the same bits as adding it after): no split then
    if not (split and w.dtype == torch.float32 and w.device.type == "cpu" and n % 2 == 0 and b is None):
        return lambda x: F.linear(x, w, b)
    halves = w.view(2, n // 2, k).transpose(1, 2)  # [2, K, N/2]

    def fp32(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        if t == 1:
            return torch.bmm(x.expand(2, 1, k), halves).view(1, n)
        if rows and t <= SPLIT_ROWS_MAX:
            return torch.bmm(x.expand(2, t, k), halves).transpose(0, 1).reshape(t, n)
        return F.linear(x, w)

    return fp32


class _Layer:
    """One decoder layer's weights as plain tensors and product functions."""

    def __init__(self, layer, n_heads: int, n_kv: int, split: bool, rows: bool = False):
        a = layer.self_attn
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.eps
        self.qk_eps = a.q_norm.eps
        d = a.head_dim
        # per-head norm weights of the q heads then the k heads: [nh + nkv, D]
        self.qk_norm = torch.cat([a.q_norm.weight.expand(n_heads, d), a.k_norm.weight.expand(n_kv, d)])
        self.q, self.k, self.v, self.o = (product(m, split, rows) for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
        mlp = layer.mlp
        self.gate, self.up, self.down = (
            product(m, split, rows) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        # w8a8 fuses q/k/v and gate/up into one product each (engine.fast.quant.fuse_layers): [q | k | v], [gate | up]
        self.qkv = product(a.qkv_proj, split, rows) if isinstance(a, FusedAttention) else None
        self.gate_up = product(mlp.gate_up_proj, split, rows) if isinstance(mlp, FusedSwiGLU) else None
        self.hidden = mlp.down_proj.in_features
        # the whole layer in one compiled call (engine.fast.fused), unless inside fused.disabled()
        self.fused = layer.kernel if isinstance(layer, fusion.FusedDecoderLayer) and fusion.enabled() else None


class PredictorLoop:
    """The ar loop of one CodePredictor at batch 1 (see the module docstring). Build once per predictor and
    thread setting (`CodePredictor`'s weights are read, not copied: in-place weight updates are seen; replaced
    modules or moved weights need a new loop, see `loop_for`)."""

    def __init__(self, cp: CodePredictor, split: bool | None = None):
        cfg = cp.cfg
        self.split = torch.get_num_threads() >= 2 if split is None else split
        ref = cp.model.norm.weight
        self.dtype, device = ref.dtype, ref.device
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.rope_theta, self.device = cfg.rope_theta, device
        self.layers = [_Layer(layer, self.nh, self.nkv, self.split) for layer in cp.model.layers]
        # the same weights with multi-row split products, for verify calls (`rows`)
        self.row_layers = [_Layer(layer, self.nh, self.nkv, self.split, rows=True) for layer in cp.model.layers]
        self.norm, self.eps = cp.model.norm.weight, cp.model.norm.eps
        self.heads = [product(h, self.split) for h in cp.lm_head]
        self.tables = [e.weight for e in cp.model.codec_embedding]
        self.project = product(cp.small_to_mtp_projection, self.split)
        self.positions = 0
        self.reserve(cfg.num_code_groups)  # prefill rows 0, 1, then one row per code 1..14
        self.prefill_mask = causal_mask(0, 2, device)

    def reserve(self, slots: int) -> None:
        """K/V buffers and RoPE tables for `slots` rows (spec mode's verify calls need the tree's rows too)."""
        if slots <= self.positions:
            return
        self.positions = slots
        cos, sin = rope_cos_sin(rope_inv_freq(self.d, self.rope_theta), torch.arange(slots), self.dtype)
        self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)  # [P, D]
        # K/V per layer [nkv, 1, P, D]: a KVCache's layout ([1, nkv, P, D]), as the fused layer takes it
        shape = (self.nkv, 1, slots, self.d)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]

    def _attend(self, L: _Layer, x: torch.Tensor, start: int, kc: torch.Tensor, vc: torch.Tensor,
                mask: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rows x [T, Hc] in slots start.. -> attention output rows [T, nh * D] (K/V written to kc, vc). RoPE
        positions are the slots unless `positions` [T] is given; the mask is causal unless `mask` is given."""
        t, nh, nkv, d = x.shape[0], self.nh, self.nkv, self.d
        end = start + t
        h = rms_norm(x, L.ln1, L.eps)
        if L.qkv is not None:  # one product [T, (nh + 2 nkv) D]: q and k side by side, then v
            y = L.qkv(h)
            qk, v = y[:, : (nh + nkv) * d].reshape(t, nh + nkv, d), y[:, (nh + nkv) * d :]
        else:
            qk, v = torch.cat([L.q(h).view(t, nh, d), L.k(h).view(t, nkv, d)], dim=1), L.v(h)  # [T, nh + nkv, D]
        qk = rms_norm(qk, L.qk_norm, L.qk_eps)
        rows = slice(start, end) if positions is None else positions
        qk = apply_rope(qk, self.rope_cos[rows, None], self.rope_sin[rows, None])  # [T, nh + nkv, D]
        kc[:, 0, start:end] = qk[:, nh:].transpose(0, 1)  # [nkv, T, D]
        vc[:, 0, start:end] = v.reshape(t, nkv, d).transpose(0, 1)
        q = qk[:, :nh].transpose(0, 1)[None]  # [1, nh, T, D]
        if mask is None:
            mask = self.prefill_mask if t == 2 and start == 0 else causal_mask(start, t, x.device)
        return attend(q, kc[:, 0, :end][None], vc[:, 0, :end][None], mask)[0]  # [T, nh * D]

    def hidden(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rows x [T, Hc] at positions start..start+T-1 -> the last row's final-normed hidden [1, Hc]."""
        return rms_norm(self._stack(x, start)[-1:], self.norm, self.eps)

    def rows(self, x: torch.Tensor, start: int, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A verify call: rows x [T, Hc] written to slots start..start+T-1 at RoPE `positions` [T], attending under
        `mask` [T, start+T] (bool, True = may attend) -> every row's final-normed hidden [T, Hc]. The module path's
        computation (`DecoderStack.forward` with mask and positions); bit for bit except fp32 with the split, whose
        multi-row products differ from F.linear's by rounding (SPLIT_ROWS_MAX)."""
        if start + x.shape[0] > self.positions:
            raise RuntimeError(f"predictor buffers too small: need {start + x.shape[0]} rows, have {self.positions}")
        return rms_norm(self._stack(x, start, mask, positions, self.row_layers), self.norm, self.eps)

    def commit(self, src: torch.Tensor, dst: int) -> None:
        """Copy the K/V rows in slots `src` [n] to slots dst..dst+n-1 (an accepted draft path)."""
        for kc, vc in zip(self.keys, self.values, strict=True):
            kc[:, :, dst : dst + len(src)] = kc[:, :, src]
            vc[:, :, dst : dst + len(src)] = vc[:, :, src]

    def kv(self, layer: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cached K, V of slots 0..slots-1 as [nkv, slots, D] (as `KVCache` holds them)."""
        return self.keys[layer][:, 0, :slots], self.values[layer][:, 0, :slots]

    def _stack(self, x, start, mask=None, positions=None, layers=None):
        t = x.shape[0]
        for L, kc, vc in zip(layers or self.layers, self.keys, self.values, strict=True):
            if L.fused is not None and fusion.usable(x, mask):  # the FusedDecoderLayer's own call
                rows = slice(start, start + t) if positions is None else positions
                x = L.fused(x, kc, vc, start, self.rope_cos[rows], self.rope_sin[rows], mask, start + t)
                continue
            x = x + L.o(self._attend(L, x, start, kc, vc, mask, positions))
            h = rms_norm(x, L.ln2, L.eps)
            if L.gate_up is not None:
                y = L.gate_up(h)
                x = x + L.down(F.silu(y[:, : L.hidden]) * y[:, L.hidden :])
            else:
                x = x + L.down(F.silu(L.gate(h)) * L.up(h))
        return x

    @torch.inference_mode()
    def _codes(self, talker_hidden, code0_embed, params, generator) -> torch.Tensor:
        x = self.project(torch.cat([talker_hidden[0], code0_embed[0]]))  # [2, Hc]
        h = self.hidden(x, 0)
        codes = []
        for head, lm_head in enumerate(self.heads):
            code = pick(lm_head(h).float(), params, generator)  # [1]
            codes.append(code)
            if head + 1 < len(self.heads):
                h = self.hidden(self.project(F.embedding(code, self.tables[head]).to(self.dtype)), head + 2)
        return torch.stack(codes, dim=1)

    def __call__(
        self,
        talker_hidden: torch.Tensor,
        code0_embed: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Codes 1..15 of one frame [1, 15] from the talker's normed hidden [1, 1, H] and C(code 0) [1, 1, H]."""
        if talker_hidden.shape[0] != 1:
            raise ValueError("PredictorLoop runs batch 1; use predict_codes_reference for batches")
        codes = self._codes(talker_hidden, code0_embed, params, generator)
        return codes if torch.is_inference_mode_enabled() else codes.clone()


class _Watch:
    """What a built loop depends on, recorded flat at build time: the thread setting, whether fused layers are on,
    every module of the predictor's tree (a layer swapped for a fused one, a replaced head) and the identity and
    storage of every parameter and buffer (and a W8A8Linear's packed weight). `same(cp)` checks the record without
    walking the tree (walking it every frame cost ~0.5 ms, a quarter of a narrow model's fused predictor frame). The
    predictor itself is not held (the loops' table is keyed weakly by it): its own entries are checked against `cp`."""

    def __init__(self, cp: CodePredictor):
        self.threads, self.fused = torch.get_num_threads(), fusion.enabled()
        self.top = list(cp._modules.items())
        subs = [m for m in cp.modules() if m is not cp]
        self.edges = [(m._modules, name, child) for m in subs for name, child in m._modules.items()]
        self.own = _tensors(cp)
        self.tensors = [(m, *entry) for m in subs for entry in _tensors(m)]
        self.packed = [(m, m.packed) for m in subs if isinstance(m, W8A8Linear)]

    def same(self, cp: CodePredictor) -> bool:
        if torch.get_num_threads() != self.threads or fusion.enabled() != self.fused:
            return False
        if len(cp._modules) != len(self.top) or any(cp._modules.get(n) is not c for n, c in self.top):
            return False
        if any(d.get(name) is not child for d, name, child in self.edges):
            return False
        for m, kind, name, t, ptr in itertools.chain(((cp, *entry) for entry in self.own), self.tensors):
            if getattr(m, kind).get(name) is not t or (t is not None and t.data_ptr() != ptr):
                return False
        return all(m.packed is packed for m, packed in self.packed)


def _tensors(m: nn.Module) -> list[tuple]:
    """(kind, name, tensor, data pointer) of a module's own parameters and buffers."""
    return [(kind, name, t, None if t is None else t.data_ptr())
            for kind in ("_parameters", "_buffers") for name, t in getattr(m, kind).items()]


_LOOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loop_for(cp: CodePredictor) -> PredictorLoop:
    """The predictor's PredictorLoop, built on first use and again when its modules, weights or the thread count
    changed (in-place weight updates are read live and need no rebuild)."""
    cached = _LOOPS.get(cp)
    if cached is None or not cached[0].same(cp):
        cached = _LOOPS[cp] = (_Watch(cp), PredictorLoop(cp))
    return cached[1]


def predict_codes(
    cp: CodePredictor,
    talker_hidden: torch.Tensor,
    code0_embed: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Codes 1..15 of one frame [B, 15] from the talker's normed hidden [B, 1, H] and C(code 0) [B, 1, H] (ar).

    Batch 1 runs the overhead-free loop (PredictorLoop: the same bits and random draws as the plain module loop,
    predict_codes_reference, which batches use)."""
    if talker_hidden.shape[0] == 1:
        return loop_for(cp)(talker_hidden, code0_embed, params, generator)
    return predict_codes_reference(cp, talker_hidden, code0_embed, params, generator)
