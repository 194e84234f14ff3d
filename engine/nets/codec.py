"""12 Hz codec decoder: 16 codebooks x T frames -> 24 kHz mono waveform, 1920 samples per frame.

Conventions: codes are LongTensor [B, 16, T] (codebook-major, as the official decoder takes them); waveforms
are [B, 1, 1920*T] in [-1, 1]. Parameter names equal the official `decoder.*` checkpoint keys with the
`decoder.` prefix removed, so `load_state_dict(strict=True)` works on the stripped tensors.

Streaming: every module with memory takes an optional `cache` dict (module -> carried tensors). With
`cache=None` a call decodes from scratch (zero left context, positions from 0), exactly like the official
forward; with a dict the call continues where the previous call on that dict stopped. `CodecStream` owns one.

Products: the modules compute through a `CodecOps` (plain torch, chunking-safe); whoever loads the decoder may hand it
faster ops with the same contract (`CodecDecoder(cfg, ops)`, `use_ops`; the loader's are engine/fast/codec_ops.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.nets.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq

Cache = dict  # module -> carried state; see the module docstring


@dataclass(frozen=True)
class CodecConfig:
    """`decoder_config` of speech_tokenizer/config.json plus the top-level output rates."""

    codebook_size: int = 2048
    codebook_dim: int = 512  # quantizer in/out width; the codebooks themselves are codebook_dim // 2 wide
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    attention_bias: bool = False
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920

    @classmethod
    def from_dict(cls, d: dict) -> CodecConfig:
        """Build from the whole speech_tokenizer config.json dict (or from its bare `decoder_config`)."""
        src = dict(d.get("decoder_config", d))
        for key in ("output_sample_rate", "decode_upsample_rate"):
            if key in d:
                src[key] = d[key]
        if src.get("head_dim") is None and "hidden_size" in src:
            src["head_dim"] = src["hidden_size"] // src.get("num_attention_heads", cls.num_attention_heads)
        names = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in src.items() if k in names}
        return cls(**kw)

    def __post_init__(self):
        if self.samples_per_frame != self.decode_upsample_rate:
            raise ValueError(
                f"upsampling_ratios {self.upsampling_ratios} x upsample_rates {self.upsample_rates} give "
                f"{self.samples_per_frame} samples per frame, but decode_upsample_rate is {self.decode_upsample_rate}"
            )
        if self.hidden_act != "silu" or self.num_quantizers < 2:
            raise ValueError(f"unsupported codec: hidden_act {self.hidden_act!r}, {self.num_quantizers} quantizers")

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @property
    def frame_rate(self) -> float:
        return self.output_sample_rate / self.samples_per_frame


def _with_context(x: torch.Tensor, cache: Cache | None, key: nn.Module, size: int, dim: int = -1) -> torch.Tensor:
    """Prepend `size` entries of left context along `dim` (zeros at the start) and remember the new last `size`."""
    ctx = cache.get(key) if cache is not None else None
    if ctx is None:
        shape = list(x.shape)
        shape[dim] = size
        ctx = x.new_zeros(shape)
    x = torch.cat([ctx, x], dim=dim)  # [..., size + L, ...]
    if cache is not None:
        cache[key] = x.narrow(dim, x.shape[dim] - size, size).clone()
    return x


def _rowwise(fn, x: torch.Tensor, min_rows: int = 16) -> torch.Tensor:
    """Apply a per-frame op to x [B, n, C] on at least `min_rows` rows. BLAS takes other kernels (other rounding)
    for a handful of rows; zero-padding small pushes keeps streaming bit-identical to one-shot decoding."""
    B, n = x.shape[:2]
    if B * n >= min_rows:
        return fn(x)
    return fn(F.pad(x, (0, 0, 0, -(-min_rows // B) - n)))[:, :n]


class CodecOps:
    """The decoder's products in plain torch. Each gives a sample the same bits however the frames are chunked, so a
    stream equals one-shot decoding; faster ops (engine/fast/codec_ops.py) keep that contract and fall back to these."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, n, K] times weight [N, K] (+ bias) -> [B, n, N]: BLAS on at least 16 rows (_rowwise)."""
        return _rowwise(lambda t: F.linear(t, weight, bias), x)

    def swiglu(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The pre-transformer's SwiGLU MLP on x [B, n, C]."""
        return _rowwise(mlp, x)

    def pointwise(self, h: torch.Tensor, pw1: nn.Linear, pw2: nn.Linear) -> torch.Tensor:
        """ConvNeXt's Linear -> GELU (erf) -> Linear on h [B, L, C], in the weights' dtype, back in h's. Both
        products on the same padded rows (padding each on its own changed the rounding by 3e-6)."""
        return _rowwise(lambda t: pw2(F.gelu(pw1(t))), h.to(pw1.weight.dtype)).to(h.dtype)

    def conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int) -> torch.Tensor:
        """A dense conv [C_out, C_in, k] over x [B, C_in, pad + L] already left-padded -> [B, C_out, L]: im2col + one
        product per block of steps (length-independent rounding)."""
        pad = (weight.shape[-1] - 1) * dilation
        w, L, out = weight.flatten(1), x.shape[-1] - pad, []  # w: [C_out, C_in*k]
        for s in range(0, L, 4096):  # blocks bound the im2col copy
            win = x[..., s : min(s + 4096, L) + pad].unfold(-1, pad + 1, 1)[..., ::dilation]
            out.append(self.linear(win.permute(0, 2, 1, 3).flatten(2), w))  # [B, l, C_out]
        return (torch.cat(out, dim=1) + bias).transpose(1, 2)  # [B, C_out, L]

    def snake(self, x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
        """x + sin^2(x * alpha) * inv_beta with x [B, C, L], alpha and inv_beta [1, C, 1]."""
        s = torch.sin(x * alpha)
        if torch.jit.is_tracing():  # an exported graph (Core ML) keeps to plain ops; some converters lack addcmul
            return x + inv_beta * (s * s)
        return torch.addcmul(x, s.mul_(s), inv_beta)  # three passes over x instead of five

    def overlap_add(self, cols: torch.Tensor, prev: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
        """A transposed conv's overlap-add: cols [B, L, C, k] (frame t's contribution to samples t*s .. t*s+k-1),
        prev [B, C, k - s] (the spill of the frame before the first) -> [B, C, L*s] + bias."""
        B, L, C, k = cols.shape
        y = cols[..., :stride]
        if k > stride:
            spill = torch.cat([prev[:, None], cols[:, : L - 1, :, stride:]], dim=1)  # frame t-1's, at t
            y = torch.cat([y[..., : k - stride] + spill, y[..., k - stride :]], dim=-1)
        return y.permute(0, 2, 1, 3).reshape(B, -1, L * stride) + bias[:, None]

    def window_attention(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, H, n, D], kv [2, B, H, W-1+n, D], mask [n, W] -> [B, H, n, D]: query i against keys i .. i+W-1."""
        span = 127 + mask.shape[1]  # blocks of 128 queries bound the size of the window copies
        blocks = range(0, q.shape[2], 128)
        return torch.cat([_attend(q[:, :, s : s + 128], kv[..., s : s + span, :], mask[s : s + 128], scale)
                          for s in blocks], dim=2)  # [B, H, n, D]


def _attend(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    # Broadcast products and sums, not matmul: BLAS rounds a single-query block differently.
    k, v = kv.unfold(3, mask.shape[1], 1).transpose(-1, -2)  # each [B, H, n, W, D]: query i's keys
    scores = (q.unsqueeze(-2) * k).sum(-1) * scale  # [B, H, n, W]
    probs = scores.float().masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
    return (probs.unsqueeze(-1) * v).sum(-2)  # [B, H, n, D]


class _Computes(nn.Module):
    """A module whose products run through `ops` (plain torch unless `use_ops` hands it others)."""

    ops: CodecOps = CodecOps()


def use_ops(module: nn.Module, ops: CodecOps) -> nn.Module:
    """Hand `ops` to every part of `module` that computes with them; returns `module`."""
    for m in module.modules():
        if isinstance(m, _Computes):
            m.ops = ops
    return module


# Input steps (4 per frame) the decoder's conv stack takes at a time (CodecDecoder.decode): a 16-frame push in two
# slices holds half the 24 kHz activations (slices of 8 or 16 steps measured slower).
DECODER_SLICE = 32


class CausalConv1d(_Computes):
    """Stride-1 conv, left-padded by (k-1)*dilation so the length is kept and no output sees the future.
    Every sample is rounded the same whatever the length of the call, so streamed output equals one-shot output bit
    for bit (F.conv1d is not: it picks other kernels for short inputs): depthwise convs as torch computes them, 1x1
    convs as one matmul, dense convs through `ops.conv`."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.pad, self.dilation = (kernel - 1) * dilation, dilation

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:  # [B, C_in, L]
        if self.conv.weight.dtype != x.dtype:  # weights lowered (CodecDecoder.lower_precision): compute in theirs
            return self._conv(x.to(self.conv.weight.dtype), cache).to(x.dtype)
        return self._conv(x, cache)

    def _conv(self, x: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        if self.pad:
            x = _with_context(x, cache, self, self.pad)  # [B, C_in, pad + L]
        if self.conv.groups > 1:
            return self.conv(x)  # depthwise: its rounding does not depend on the length
        if self.pad == 0:  # 1x1: one matmul; oneDNN's 1x1 kernels split the work (and rounding) by length
            L = x.shape[-1]
            x = F.pad(x, (0, 16 - L)) if L < 16 else x  # BLAS rounds a handful of columns differently
            return torch.matmul(self.conv.weight[..., 0], x).add_(self.conv.bias[:, None])[..., :L]  # bias in place
        return self.ops.conv(x, self.conv.weight, self.conv.bias, self.dilation)


class CausalTransConv1d(_Computes):
    """ConvTranspose1d(k, stride), k <= 2*stride, keeping the first stride*L samples. The k - stride samples that
    spill past the end are dropped in one-shot decoding (as the official code does) and carried when streaming.
    Computed as one matmul plus an explicit overlap-add, so the rounding does not depend on the chunking."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        if not stride <= kernel <= 2 * stride:
            raise ValueError(f"transposed conv needs stride <= kernel <= 2*stride, got k={kernel}, s={stride}")
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride, self.overlap = stride, kernel - stride

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        if self.conv.weight.dtype != x.dtype:  # weights lowered (CodecDecoder.lower_precision): compute in theirs
            return self._conv(x.to(self.conv.weight.dtype), cache).to(x.dtype)
        return self._conv(x, cache)

    def _conv(self, x: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        B, _, L = x.shape
        w = self.conv.weight  # [C_in, C_out, k]
        cols = _rowwise(lambda t: t @ w.flatten(1), x.transpose(1, 2).contiguous())  # [B, L, C_out*k]
        cols = cols.view(B, L, w.shape[1], -1)  # [B, L, C_out, k]: frame t's contribution to t*s .. t*s+k-1
        prev = cache.get(self) if cache is not None else None  # the last frame's spill past its stride
        prev = cols.new_zeros(B, w.shape[1], self.overlap) if prev is None else prev  # [B, C_out, overlap]
        if cache is not None and self.overlap:
            cache[self] = cols[:, -1, :, self.stride :].clone()
        return self.ops.overlap_add(cols, prev, self.conv.bias, self.stride)


class SnakeBeta(_Computes):
    """x + sin^2(x * e^alpha) / e^beta, per channel; alpha and beta are stored in log space."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, L]
        alpha = self.alpha.exp()[None, :, None]
        return self.ops.snake(x, alpha, 1.0 / (self.beta.exp()[None, :, None] + 1e-9))


class ConvNeXtBlock(_Computes):
    """Causal depthwise conv k=7 -> LayerNorm -> Linear 4x -> GELU (erf) -> Linear -> gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:  # [B, C, L]
        h = self.norm(self.dwconv(x, cache).transpose(1, 2))  # [B, L, C]
        h = self.ops.pointwise(h, self.pwconv1, self.pwconv2)  # in the weights' dtype (CodecDecoder.lower_precision)
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        h = self.conv1(self.act1(x), cache)
        return self.conv2(self.act2(h)).add_(x)  # in place: one activation-sized temporary fewer


class DecoderBlock(nn.Module):
    """Snake, transposed conv (x rate, halving channels), three residual units with dilation 1, 3, 9."""

    def __init__(self, c_in: int, rate: int):
        super().__init__()
        c_out = c_in // 2
        units = [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(c_in), CausalTransConv1d(c_in, c_out, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        x = self.block[1](self.block[0](x), cache)  # [B, C_in/2, rate*L]
        for unit in self.block[2:]:
            x = unit(x, cache)
        return x


def _holder(**params: torch.Tensor) -> nn.Module:
    """A bare module holding parameters, for checkpoint key paths that have no behaviour of their own."""
    m = nn.Module()
    for name, value in params.items():
        setattr(m, name, nn.Parameter(value))
    return m


class ResidualVQ(_Computes):
    """n EMA codebooks, looked up and added one after another, then a 1x1 conv up to the quantizer width.
    A stored codebook row is embedding_sum[i] / max(cluster_usage[i], 1e-5), divided in the parameter dtype."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int):
        super().__init__()
        # input_proj belongs to the encoder path; it is unused here and kept only so strict loading works.
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = nn.Module()  # key layout: vq.layers.{i}._codebook.{embedding_sum, cluster_usage}
        self.vq.layers = nn.ModuleList(nn.Module() for _ in range(n))
        for layer in self.vq.layers:
            layer._codebook = _holder(cluster_usage=torch.ones(size), embedding_sum=torch.zeros(size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, n, T] -> [B, io_dim, T]
        q = None
        for i, layer in enumerate(self.vq.layers):
            book = layer._codebook  # dividing only the rows used gives the same bits as dividing the table
            row = F.embedding(codes[:, i], book.embedding_sum) / book.cluster_usage.clamp(min=1e-5)[codes[:, i], None]
            q = row if q is None else q + row  # [B, T, D]
        return self.ops.linear(q, self.output_proj.weight[..., 0]).transpose(1, 2)  # 1x1 conv


class Attention(_Computes):
    """Causal sliding-window MHA with RoPE, no QK-norm. Every query is scored against exactly its own window of
    `sliding_window` keys (zero-padded and masked at the start), so the arithmetic per query is the same however
    the frames are chunked. When streaming it keeps the last window-1 keys/values."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.window = cfg.sliding_window
        bias, dim = cfg.attention_bias, cfg.hidden_size
        self.q_proj = nn.Linear(dim, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, dim, bias=bias)

    def forward(self, x, cos, sin, mask, cache: Cache | None = None) -> torch.Tensor:
        B, n, _ = x.shape
        q, k, v = (
            self.ops.linear(x, p.weight, p.bias).view(B, n, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )  # [B, H(kv), n, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv = _with_context(torch.stack([k, v]), cache, self, self.window - 1, dim=3)  # [2, B, Hkv, W-1+n, D]
        if self.n_kv != self.n_heads:
            kv = kv.repeat_interleave(self.n_heads // self.n_kv, dim=2)
        out = self.ops.window_attention(q, kv, mask, self.head_dim**-0.5)  # [B, H, n, D]
        return self.ops.linear(out.transpose(1, 2).reshape(B, n, -1), self.o_proj.weight, self.o_proj.bias)


class TransformerLayer(_Computes):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = _holder(scale=torch.full((cfg.hidden_size,), 0.01))
        self.mlp_layer_scale = _holder(scale=torch.full((cfg.hidden_size,), 0.01))

    def forward(self, x, cos, sin, mask, cache: Cache | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp_layer_scale.scale * self.ops.swiglu(self.mlp, self.post_attention_layernorm(x))


class PreTransformer(_Computes):
    """latent -> hidden, sliding-window transformer, RMSNorm, hidden -> latent. Positions continue across
    streamed calls (absolute, so streaming reproduces one-shot rounding)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.window, self.head_dim, self.theta = cfg.sliding_window, cfg.head_dim, cfg.rope_theta
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:  # [B, n, latent]
        n, dev = x.shape[1], x.device
        start = cache.get(self, 0) if cache is not None else 0
        past = min(start, self.window - 1)  # keys carried by every layer's window
        if cache is not None:
            cache[self] = start + n
        inv_freq = rope_inv_freq(self.head_dim, self.theta).to(dev)  # fp32 even for a bf16 module
        cos, sin = rope_cos_sin(inv_freq, torch.arange(start, start + n, device=dev), x.dtype)  # [n, D]
        offset = torch.arange(n, device=dev)[:, None] + torch.arange(self.window, device=dev)[None, :]
        mask = offset >= self.window - 1 - past  # [n, W]: window slot w of query i holds frame i - (W-1) + w
        h = self.ops.linear(x, self.input_proj.weight, self.input_proj.bias)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, cache)
        return self.ops.linear(self.norm(h), self.output_proj.weight, self.output_proj.bias)  # [B, n, latent]


class CodecDecoder(nn.Module):
    """The decoder half of the 12 Hz speech tokenizer. Keys match the official `decoder.*` tensors. `ops`: what
    computes its products (default plain torch; see `use_ops`). A streaming.StreamingCodec."""

    # a stream's samples do not depend on how the frames are chunked (bit for bit; tests/test_codec.py), so callers
    # may pick chunk sizes for speed alone (app/speak.py does, writing a file)
    streams_exactly = True

    def __init__(self, cfg: CodecConfig, ops: CodecOps | None = None):
        super().__init__()
        self.config = cfg
        latent, dims = cfg.latent_dim, [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        # Code group 0 (semantic) uses rvq_first, groups 1.. use rvq_rest; the codebooks are codebook_dim // 2 wide.
        self.quantizer = nn.Module()
        books = (cfg.codebook_size, cfg.codebook_dim // 2, cfg.codebook_dim)
        self.quantizer.rvq_first = ResidualVQ(1, *books)
        self.quantizer.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, *books)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, latent, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv1d(latent, latent, r, r), ConvNeXtBlock(latent)])
            for r in cfg.upsampling_ratios
        )
        blocks = [DecoderBlock(dims[i], r) for i, r in enumerate(cfg.upsample_rates)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(latent, dims[0], 7), *blocks, SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )
        if ops is not None:
            use_ops(self, ops)

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def sample_rate(self) -> int:
        return self.config.output_sample_rate

    def decode(self, codes: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """codes [B, Q, n] -> wav [B, 1, spf*n]; from scratch if `cache` is None, else continuing `cache`."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"expected codes [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")
        if codes.shape[-1] == 0:
            return self.pre_conv.conv.weight.new_zeros(codes.shape[0], 1, 0)
        h = self.quantizer.rvq_first(codes[:, :1]) + self.quantizer.rvq_rest(codes[:, 1:])  # [B, codebook_dim, n]
        h = self.pre_conv(h, cache).transpose(1, 2).contiguous()  # [B, n, latent]; row layout, as BLAS wants
        h = self.pre_transformer(h, cache).transpose(1, 2)  # [B, latent, n]
        for trans, convnext in self.upsample:
            h = convnext(trans(h, cache), cache)  # [B, latent, 4n] after both stages
        # The conv stack in slices of DECODER_SLICE steps, carried through a cache as a stream is: the same bits
        # (its products round independently of the length), and a 16-frame push holds half the activations.
        cache = {} if cache is None else cache
        wavs = []
        for s in range(0, h.shape[-1], DECODER_SLICE):
            x = self.decoder[0](h[..., s : s + DECODER_SLICE], cache)  # [B, decoder_dim, steps]
            for block in self.decoder[1:-2]:
                x = block(x, cache)  # channels halve, time x rate
            wavs.append(self.decoder[-1](self.decoder[-2](x), cache))  # [B, 1, spf/4 * steps]
        return (wavs[0] if len(wavs) == 1 else torch.cat(wavs, dim=-1)).clamp(-1.0, 1.0)

    def lower_precision(self, dtype: torch.dtype = torch.bfloat16) -> CodecDecoder:
        """Keep the upsampling and decoder stacks' convolution and ConvNeXt weights in `dtype` (bf16) and run
        those products in it: activations are rounded to `dtype` on the way into each product and come back in
        the module's dtype; SnakeBeta, norms, residual sums, the quantizer and the transformer keep theirs.
        Those weights are 64% of the codec's; CPUs with bf16 products (AVX512-BF16, AMX) run them faster.
        Streaming equals one-shot decoding bit for bit where oneDNN's bf16 kernels round independently of the
        length (AVX512-BF16 without AMX); with AMX about one sample in 10^4 of the wide layers moves by about one bf16
        step between chunkings (tests/test_codec.py). The waveform moves by bf16 rounding, measured by
        the codec benchmark (tests/benchmarks/README.md, "Codec decoder"). Returns self."""
        for mod in [*self.upsample.modules(), *self.decoder.modules()]:
            if isinstance(mod, (CausalConv1d, CausalTransConv1d)) and mod.conv.groups == 1:
                mod.conv.to(dtype)
            elif isinstance(mod, ConvNeXtBlock):
                mod.pwconv1.to(dtype)
                mod.pwconv2.to(dtype)
        return self

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot decode: codes LongTensor [B, 16, T] -> wav [B, 1, 1920*T] in [-1, 1]."""
        return self.decode(codes)

    def chunked_decode(self, codes: torch.Tensor, chunk_size: int = 300, left_context: int = 25) -> torch.Tensor:
        """The official decode rule: chunks starting at 0, chunk_size, ...; each decoded from scratch together
        with up to `left_context` preceding frames (none for the first chunk), whose audio is dropped."""
        spf, total, wavs, start = self.config.samples_per_frame, codes.shape[-1], [], 0
        while start < total:
            end = min(start + chunk_size, total)
            ctx = left_context if start - left_context > 0 else start
            wavs.append(self.decode(codes[..., start - ctx : end])[..., ctx * spf :])
            start = end
        return torch.cat(wavs, dim=-1) if wavs else self.decode(codes)

    def stream(self, official_chunking: bool = False) -> CodecStream:
        """A fresh incremental decoder; see CodecStream."""
        return CodecStream(self, official_chunking)


class CodecStream:
    """Incremental decode: push(codes [B, Q, n]) -> wav [B, 1, 1920*n]. Concatenated pushes equal the one-shot
    `forward` of all codes so far (any chunking, frame-by-frame included). With `official_chunking` the stream
    instead restarts at every chunk_size-frame boundary from the last `left_context` frames, reproducing
    `chunked_decode`. Memory is bounded: conv tails, 71-frame K/V windows, and at most left_context codes."""

    def __init__(self, decoder: CodecDecoder, official_chunking: bool = False, chunk_size=300, left_context=25):
        self.decoder, self.official_chunking = decoder, official_chunking
        self.chunk_size, self.left_context = chunk_size, left_context
        self.reset()

    def reset(self) -> None:
        """Forget everything; the next push starts a new utterance."""
        self.cache: Cache = {}
        self.frames = 0
        self.recent: torch.Tensor | None = None  # last left_context codes, [B, Q, <= left_context]

    def state(self) -> tuple:
        """Where the stream stands, to `restore` later (any number of times). Pushes replace cached tensors and never
        write into them, so the snapshot shares them."""
        return dict(self.cache), self.frames, self.recent

    def restore(self, state: tuple) -> None:
        cache, self.frames, self.recent = state
        self.cache = dict(cache)

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next n frames: codes [B, Q, n] -> wav [B, 1, 1920*n]."""
        if not self.official_chunking:
            self.frames += codes.shape[-1]
            return self.decoder.decode(codes, self.cache)
        wavs = [self.decoder.decode(codes[..., :0])]
        while codes.shape[-1]:
            if self.frames and self.frames % self.chunk_size == 0:
                self._restart()
            take = self.chunk_size - self.frames % self.chunk_size
            part, codes = codes[..., :take], codes[..., take:]
            wavs.append(self.decoder.decode(part, self.cache))
            self.frames += part.shape[-1]
            recent = part if self.recent is None else torch.cat([self.recent, part], dim=-1)
            self.recent = recent[..., max(0, recent.shape[-1] - self.left_context) :]
        return torch.cat(wavs, dim=-1)

    def _restart(self) -> None:
        ctx = self.left_context if self.frames - self.left_context > 0 else self.frames
        self.cache = {}
        if ctx:
            self.decoder.decode(self.recent[..., -ctx:], self.cache)  # warm-up; its audio is discarded
