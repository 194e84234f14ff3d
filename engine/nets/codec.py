"""12 Hz codec decoder: 16 codebooks x T frames -> 24 kHz mono waveform, 1920 samples per frame.

Conventions: codes are LongTensor [B, 16, T] (codebook-major, as the official decoder takes them); waveforms
are [B, 1, 1920*T] in [-1, 1]. Parameter names equal the official `decoder.*` checkpoint keys with the
`decoder.` prefix removed, so `load_state_dict(strict=True)` works on the stripped tensors.

Streaming: every module with memory takes an optional `cache` dict (module -> carried tensors). With
`cache=None` a call decodes from scratch (zero left context, positions from 0), exactly like the official
forward; with a dict the call continues where the previous call on that dict stopped. `CodecStream` owns one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq

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


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, n, K] times weight [N, K] (+ bias) -> [B, n, N], each value rounded the same whatever n: leapvox's
    compiled kernel (a fixed summation order per value; at 1-16 rows 3-13x faster than BLAS here) where it runs,
    else BLAS on at least 16 rows (_rowwise)."""
    op = kernels.linear_op() if kernels.takes(x) and weight.dtype == torch.float32 and weight.stride(-1) == 1 else None
    if op is None:
        return _rowwise(lambda t: F.linear(t, weight, bias), x)
    return op(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def _swiglu(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The pre-transformer's SwiGLU MLP through _linear (its three products rounded alike for any number of rows)."""
    if kernels.linear_op() is None or not kernels.takes(x) or mlp.gate_proj.weight.dtype != torch.float32:
        return _rowwise(mlp, x)
    gate, up = _linear(x, mlp.gate_proj.weight), _linear(x, mlp.up_proj.weight)
    return _linear(F.silu(gate) * up, mlp.down_proj.weight)


def _onednn(x: torch.Tensor) -> bool:
    """Whether oneDNN's convolution can take x (a CPU torch build with oneDNN, fp32, or bf16 where the CPU has
    oneDNN's bf16 path: AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere torch's own bf16 convolution runs)."""
    if x.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return x.dtype == torch.float32 or x.dtype == torch.bfloat16 and _onednn_bf16()


@functools.cache
def _onednn_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# Dense convs with at least this many (in x out) channel pairs take im2col + one matmul instead of oneDNN: oneDNN
# reorders a conv's weights on every call, which for the first decoder conv (1024 -> 1536, k 7, 44 MB) measured
# ~27 ms a call at 1-16 frames against 8-11 ms for the matmul; the 768-channel convs and smaller are faster in
# oneDNN from about 8 frames a call, so they stay (tests/benchmarks/README.md, "Fused layers and codec kernels").
ONEDNN_MAX_WEIGHTS = 1 << 20

# Input steps (4 per frame) the decoder's conv stack takes at a time (CodecDecoder.decode): a 16-frame push in two
# slices holds half the 24 kHz activations (~12 MB a tensor at 16 frames); 40-frame decodes measured as fast as
# unsliced (slices of 8 or 16 steps were 8-25 % slower).
DECODER_SLICE = 32


class CausalConv1d(nn.Module):
    """Stride-1 conv, left-padded by (k-1)*dilation so the length is kept and no output sees the future.
    Dense convs run through oneDNN's direct convolution (`torch.mkldnn_convolution`), whose rounding of an output
    sample does not depend on the length of the call, so streamed output equals one-shot output bit for bit
    (F.conv1d is not: it picks other kernels for short inputs, and oneDNN's 1x1 kernels split by length, so 1x1
    convs are one matmul). Without oneDNN, and for the largest convs (ONEDNN_MAX_WEIGHTS): im2col + matmul, also
    length-independent (2-3x slower than oneDNN on long inputs, faster on the codec's largest conv)."""

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
        if _onednn(x) and self.conv.in_channels * self.conv.out_channels < ONEDNN_MAX_WEIGHTS:
            x = x.contiguous()  # one layout in, one out, whatever the caller's strides (bf16 kernels follow them)
            return torch.mkldnn_convolution(x, self.conv.weight, self.conv.bias, [0], [1], [self.dilation], 1)
        w, L, out = self.conv.weight.flatten(1), x.shape[-1] - self.pad, []  # w: [C_out, C_in*k]
        for s in range(0, L, 4096):  # blocks bound the im2col copy
            win = x[..., s : min(s + 4096, L) + self.pad].unfold(-1, self.pad + 1, 1)[..., :: self.dilation]
            out.append(_linear(win.permute(0, 2, 1, 3).flatten(2), w))  # [B, l, C_out]
        return (torch.cat(out, dim=1) + self.conv.bias).transpose(1, 2)  # [B, C_out, L]


class CausalTransConv1d(nn.Module):
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
        op = kernels.overlap_add_op() if kernels.takes(cols) else None
        if op is not None:
            # leapvox's compiled kernel: the same additions in one pass (engine/kernels/codec.cpp)
            prev = cache.get(self) if cache is not None else None  # [B, 1, C_out, overlap], as _with_context keeps
            spill = cols.new_zeros(B, w.shape[1], self.overlap) if prev is None else prev[:, 0]
            if cache is not None and self.overlap:
                cache[self] = cols[:, -1:, :, self.stride :].clone()
            return op(cols, spill, self.conv.bias, self.stride)
        y = cols[..., : self.stride]
        if self.overlap:
            spill = _with_context(cols[..., self.stride :], cache, self, 1, dim=1)[:, :L]  # frame t-1's, at t
            y = torch.cat([y[..., : self.overlap] + spill, y[..., self.overlap :]], dim=-1)
        return y.permute(0, 2, 1, 3).reshape(B, -1, L * self.stride) + self.conv.bias[:, None]


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel; alpha and beta are stored in log space."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, L]
        alpha = self.alpha.exp()[None, :, None]
        inv_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
        op = kernels.snake_op() if kernels.takes(x) and alpha.dtype == torch.float32 else None
        if op is not None:  # leapvox's compiled kernel: one pass instead of four (engine/kernels/codec.cpp)
            return op(x, alpha.view(-1), inv_beta.view(-1))
        s = torch.sin(x * alpha)
        if torch.jit.is_tracing():  # an exported graph (Core ML) keeps to plain ops; some converters lack addcmul
            return x + inv_beta * (s * s)
        return torch.addcmul(x, s.mul_(s), inv_beta)  # three passes over x instead of five


class ConvNeXtBlock(nn.Module):
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
        dt = self.pwconv1.weight.dtype  # the input's, unless lowered (CodecDecoder.lower_precision)
        if kernels.linear_op() is not None and kernels.takes(h) and dt == torch.float32:
            h = F.gelu(_linear(h, self.pwconv1.weight, self.pwconv1.bias))
            h = _linear(h, self.pwconv2.weight, self.pwconv2.bias)
        else:  # BLAS: both products on the same padded rows (padding each on its own changed the rounding by 3e-6)
            h = _rowwise(lambda t: self.pwconv2(F.gelu(self.pwconv1(t))), h.to(dt)).to(x.dtype)
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


class ResidualVQ(nn.Module):
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
        return _linear(q, self.output_proj.weight[..., 0]).transpose(1, 2)  # 1x1 conv


class Attention(nn.Module):
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
            _linear(x, p.weight, p.bias).view(B, n, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )  # [B, H(kv), n, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv = _with_context(torch.stack([k, v]), cache, self, self.window - 1, dim=3)  # [2, B, Hkv, W-1+n, D]
        if self.n_kv != self.n_heads:
            kv = kv.repeat_interleave(self.n_heads // self.n_kv, dim=2)
        op = kernels.window_attention_op() if kernels.takes(q) and self.head_dim % 16 == 0 else None
        if op is not None:  # leapvox's compiled kernel: the same per-query arithmetic without [n, W, D] temporaries
            out = op(q, kv[0], kv[1], mask, self.head_dim**-0.5)
        else:
            span = 127 + self.window  # blocks of 128 queries bound the size of the window copies
            blocks = range(0, n, 128)
            out = torch.cat([self._attend(q[:, :, s : s + 128], kv[..., s : s + span, :], mask[s : s + 128])
                             for s in blocks], dim=2)  # [B, H, n, D]
        return _linear(out.transpose(1, 2).reshape(B, n, -1), self.o_proj.weight, self.o_proj.bias)

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Broadcast products and sums, not matmul: BLAS rounds a single-query block differently.
        k, v = kv.unfold(3, self.window, 1).transpose(-1, -2)  # each [B, H, n, W, D]: query i's keys
        scores = (q.unsqueeze(-2) * k).sum(-1) * self.head_dim**-0.5  # [B, H, n, W]
        probs = scores.float().masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
        return (probs.unsqueeze(-1) * v).sum(-2)  # [B, H, n, D]


class TransformerLayer(nn.Module):
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
        return x + self.mlp_layer_scale.scale * _swiglu(self.mlp, self.post_attention_layernorm(x))


class PreTransformer(nn.Module):
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
        h = _linear(x, self.input_proj.weight, self.input_proj.bias)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, cache)
        return _linear(self.norm(h), self.output_proj.weight, self.output_proj.bias)  # [B, n, latent]


class CodecDecoder(nn.Module):
    """The decoder half of the 12 Hz speech tokenizer. Keys match the official `decoder.*` tensors."""

    # a stream's samples do not depend on how the frames are chunked (bit for bit; tests/test_codec.py), so callers
    # may pick chunk sizes for speed alone (app/speak.py does, writing a file)
    streams_exactly = True

    def __init__(self, cfg: CodecConfig):
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
        Those weights are 64% of the codec's; on AVX512-BF16 the products run ~2-3x faster (on AMX ~2.4x here).
        Streaming equals one-shot decoding bit for bit where oneDNN's bf16 kernels round independently of the
        length (AVX512-BF16 without AMX); with AMX about one sample in 10^4 of the wide layers moves by about one bf16
        step between chunkings (tests/test_codec.py). The waveform moves by bf16 rounding, measured in
        engine/README.md. Returns self."""
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
