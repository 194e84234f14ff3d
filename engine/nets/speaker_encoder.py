"""The Base models' speaker encoder: ECAPA-TDNN over a 128-bin log-mel of 24 kHz audio -> one x-vector.

The x-vector (talker width: 1024 for 0.6B, 2048 for 1.7B) takes the place of a speaker's codec embedding in the
prompt. Parameter names equal the checkpoint's `speaker_encoder.*` keys with that prefix removed. The mel front end
(Slaney mel filterbank, Hann-windowed STFT without centring, magnitude, log) is written here, numpy and torch only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# The mel front end is fixed in the reference code, whatever the config says.
N_FFT, HOP, WIN, N_MELS, FMIN, FMAX = 1024, 256, 1024, 128, 0.0, 12000.0


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """`speaker_encoder_config` of a Base checkpoint's config.json (unknown keys are ignored)."""

    enc_dim: int = 1024
    mel_dim: int = 128
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: dict) -> SpeakerEncoderConfig:
        names = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        cfg = cls(**kw)
        if not len(cfg.enc_channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")
        return cfg


# ---- mel front end ----------------------------------------------------------------------------------------------


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), (200.0 / 3) * m)


@lru_cache(maxsize=4)
def mel_filterbank(sr: int = 24000, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = FMIN,
                   fmax: float = FMAX) -> np.ndarray:
    """Triangular Slaney-normalised mel filters [n_mels, n_fft // 2 + 1], float32."""
    freqs = np.fft.rfftfreq(n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - freqs[None, :]
    weights = np.zeros((n_mels, len(freqs)), dtype=np.float32)
    for i in range(n_mels):
        rising, falling = -ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights


def log_mel(wav: torch.Tensor, sr: int = 24000) -> torch.Tensor:
    """Waveform [N] (24 kHz, in [-1, 1]) -> log-mel [frames, 128]: reflect-padded by (n_fft - hop) / 2 each side,
    Hann STFT without centring, magnitude sqrt(re² + im² + 1e-9), mel, log(max(x, 1e-5))."""
    basis = torch.from_numpy(mel_filterbank(sr)).to(wav.device)
    pad = (N_FFT - HOP) // 2
    y = F.pad(wav.float()[None, None], (pad, pad), mode="reflect")[0]  # [1, N + 2 pad]
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WIN, window=torch.hann_window(WIN, device=wav.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [1, n_fft/2+1, frames]
    return torch.log(torch.clamp(basis @ mag, min=1e-5))[0].T  # [frames, n_mels]


# ---- ECAPA-TDNN ------------------------------------------------------------------------------------------------


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Conv ('same' length, reflect padding) then ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channels split into `scale` groups; group i > 0 is convolved after adding the previous group's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs, prev = [], None
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            prev = part if i == 0 else self.blocks[i - 1](part if i == 1 else part + prev)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))  # [B, C, 1]
        return x * s


class SERes2NetBlock(nn.Module):
    """TDNN (k=1) -> Res2Net -> TDNN (k=1) -> squeeze-excitation, plus the input."""

    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1, 1)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _stats(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time of x [B, C, T] with weights w (summing to 1 over T)."""
    mean = (w * x).sum(2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(eps))
    return mean, std


class AttentiveStatsPooling(nn.Module):
    """Attention over time, conditioned on the utterance's global mean and std -> [mean, std] per channel."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(3 * channels, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, 2C, 1]
        T = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, T), 1.0 / T, dtype=x.dtype, device=x.device)
        mean, std = _stats(x, uniform)
        ctx = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, T), std.unsqueeze(2).expand(-1, -1, T)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = _stats(x, attention)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """log-mel [B, T, mel_dim] -> x-vector [B, enc_dim]."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks = [TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])]
        blocks += [SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
                   for i in range(1, len(ch) - 1)]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(2 * ch[-1], cfg.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        h, outs = mels.transpose(1, 2), []  # [B, mel, T]
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))  # multi-layer feature aggregation
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, wav: torch.Tensor) -> torch.Tensor:
        """24 kHz waveform [N] -> x-vector [enc_dim] (computed in this module's dtype)."""
        dtype = self.fc.weight.dtype
        mels = log_mel(wav.to(self.fc.weight.device), self.cfg.sample_rate)[None].to(dtype)
        return self(mels)[0]
