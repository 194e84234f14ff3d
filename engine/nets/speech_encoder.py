"""The 12 Hz speech tokenizer's encoder (Mimi-style): 24 kHz audio -> codes [T, 16], used to turn a reference clip
into the codes of a cloned voice's prompt.

SEANet convolutions (causal, 24 kHz -> 25 Hz), a causal transformer with layer scale, a stride-2 downsample to
12.5 Hz, then residual vector quantization by nearest code (one semantic codebook, then the acoustic ones).
Parameter names equal the speech tokenizer's `encoder.*` keys with that prefix removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.nets.layers import apply_rope, rope_cos_sin, rope_inv_freq


@dataclass(frozen=True)
class SpeechEncoderConfig:
    """`encoder_config` of speech_tokenizer/config.json plus the top-level rates (unknown keys are ignored)."""

    audio_channels: int = 1
    num_filters: int = 64
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    num_residual_layers: int = 1
    compress: int = 2
    dilation_growth_rate: int = 2
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    use_conv_shortcut: bool = False
    pad_mode: str = "constant"
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    sampling_rate: int = 24000
    frame_rate: float = 12.5
    valid_quantizers: int = 16  # encoder_valid_num_quantizers: the codes kept
    downsample_rate: int = 1920  # encode_downsample_rate: samples per code frame

    @classmethod
    def from_dict(cls, top: dict) -> SpeechEncoderConfig:
        d = dict(top.get("encoder_config") or {})
        if "frame_rate" not in d and "_frame_rate" in d:
            d["frame_rate"] = d["_frame_rate"]
        names = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names and v is not None}
        kw["valid_quantizers"] = top.get("encoder_valid_num_quantizers", 16)
        kw["downsample_rate"] = top.get("encode_downsample_rate", 1920)
        cfg = cls(**kw)
        if cfg.pad_mode not in ("constant", "replicate", "reflect") or not cfg.valid_quantizers <= cfg.num_quantizers:
            raise ValueError(f"unsupported encoder_config (pad_mode {cfg.pad_mode!r}, "
                             f"{cfg.valid_quantizers} of {cfg.num_quantizers} quantizers)")
        return cfg

    @property
    def heads_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def downsample_kernel(self) -> int:
        encoder_rate = math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))  # 25 Hz
        return 2 * int(encoder_rate / self.frame_rate)


class CausalConv(nn.Module):
    """Conv1d padded on the left by (effective kernel - stride), and on the right just enough that the last
    window is complete."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.kernel = stride, (kernel - 1) * dilation + 1
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, L]
        total = self.kernel - self.stride
        length = x.shape[-1]
        frames = -(-(length - self.kernel + total) // self.stride)  # ceil((L - k + total) / s) + 1 - 1
        extra = frames * self.stride + self.kernel - total - length
        mode = "constant" if self.pad_mode == "constant" else self.pad_mode
        return self.conv(F.pad(x, (total, extra), mode=mode))


class ResnetBlock(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([
            nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
            nn.ELU(), CausalConv(hidden, dim, 1, pad_mode=cfg.pad_mode),
        ])
        self.shortcut = CausalConv(dim, dim, 1, pad_mode=cfg.pad_mode) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return self.shortcut(x) + h


class SEANetEncoder(nn.Module):
    """Waveform [B, 1, N] -> features [B, hidden, ~N / prod(ratios)]."""

    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [CausalConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size,
                                              pad_mode=cfg.pad_mode)]
        dim = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv(dim, 2 * dim, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode)]
            dim *= 2
        layers += [nn.ELU(), CausalConv(dim, cfg.hidden_size, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Attention(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        d, bias = cfg.heads_dim, cfg.attention_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, T, C]
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)  # causal over the whole clip
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x, cos, sin):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C]
        inv_freq = rope_inv_freq(self.cfg.heads_dim, self.cfg.rope_theta).to(x.device)
        cos, sin = rope_cos_sin(inv_freq, torch.arange(x.shape[1], device=x.device), x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """EMA codebook as stored: the code vectors are embed_sum / usage."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class CodebookLayer(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    """input_proj, then for each codebook: nearest code (Euclidean) of the residual, minus its vector."""

    def __init__(self, cfg: SpeechEncoderConfig, n: int):
        super().__init__()
        vq, hidden = cfg.vector_quantization_hidden_dimension, cfg.hidden_size
        self.input_proj = nn.Conv1d(hidden, vq, 1, bias=False) if vq != hidden else None
        self.output_proj = nn.Conv1d(vq, hidden, 1, bias=False) if vq != hidden else None  # decoding only
        self.layers = nn.ModuleList(CodebookLayer(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [B, C, T] -> [n, B, T]
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual, codes = x.transpose(1, 2), []  # [B, T, D]
        for layer in self.layers[:n]:
            table = layer.codebook.vectors()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(residual.shape[:-1])  # [B, T]
            residual = residual - F.embedding(idx, table)
            codes.append(idx)
        return torch.stack(codes)


class SplitRVQ(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        self.n_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = ResidualVQ(cfg, cfg.num_quantizers - cfg.num_semantic_quantizers)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [B, C, T] -> [n, B, T]
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            codes = torch.cat([codes, self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)])
        return codes


class SpeechEncoder(nn.Module):
    """24 kHz waveform -> codes [T, valid_quantizers], T = ceil(samples / downsample_rate)."""

    def __init__(self, cfg: SpeechEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = Transformer(cfg)
        self.downsample = CausalConv(cfg.hidden_size, cfg.hidden_size, cfg.downsample_kernel, stride=2, bias=False,
                                     pad_mode="replicate")
        self.quantizer = SplitRVQ(cfg)

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Waveform [N] float in [-1, 1] -> codes [T, valid] int64."""
        weight = self.downsample.conv.weight
        x = wav.to(weight.device, weight.dtype)[None, None]  # [1, 1, N]
        h = self.encoder(x)  # [1, C, N / 960]
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        h = self.downsample(h)  # [1, C, T]
        codes = self.quantizer.encode(h, self.cfg.valid_quantizers)[:, 0]  # [Q, T]
        frames = -(-wav.shape[-1] // self.cfg.downsample_rate)
        return codes[:, :frames].T.contiguous()
