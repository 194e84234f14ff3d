"""Demo codec: a training-free speech tokenizer for the bundled demo model (16 codes per 80 ms frame, 24 kHz).

Encode: log-mel (100 bins, 10 ms hop) -> stack 8 mel frames into one 800-dim vector per 80 ms (12.5 Hz)
-> PCA -> residual k-means with 16 stages (code 0 from a large book, codes 1..15 from smaller ones).
Decode: sum the codewords -> inverse PCA -> log-mel -> exp -> non-negative mel inversion (multiplicative
updates) -> fast Griffin-Lim -> waveform, exactly 1920 samples per frame.

Same conventions as engine/nets/codec.py: codes LongTensor [B, 16, T]; waveforms [B, 1, 1920*T] in [-1, 1].
Everything up to the magnitude spectrogram is frame-local, so only Griffin-Lim needs streaming state: the
stream re-runs it over a few frames of left context whose samples are held at what was already emitted,
and cross-fades the first samples of each push from the tail the previous push predicted.
Compute only: no files, no espeak, no scipy.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "leapvox_demo_codec"


@dataclass(frozen=True)
class DemoCodecConfig:
    """speech_tokenizer/config.json of a demo codec (model_type "leapvox_demo_codec")."""

    sample_rate: int = 24000
    n_fft: int = 1024
    hop_length: int = 240  # 10 ms
    n_mels: int = 100
    f_min: float = 0.0
    f_max: float = 12000.0
    log_floor: float = 1e-3  # log-mel = ln(max(mel magnitude, log_floor))
    stack: int = 8  # mel frames per codec frame: 8 x 10 ms = 80 ms, 12.5 Hz
    pca_dim: int = 256
    codebook_sizes: tuple[int, ...] = (1024,) + (256,) * 15  # one entry per code group
    nnls_iters: int = 60  # multiplicative updates of the mel inversion
    gl_iters: int = 32  # Griffin-Lim iterations
    gl_momentum: float = 0.99
    stream_context: int = 2  # codec frames of left context the stream re-runs Griffin-Lim on
    stream_crossfade: int = 120  # samples cross-faded at each push boundary

    @classmethod
    def from_dict(cls, d: dict) -> DemoCodecConfig:
        """Build from config.json; unknown keys (model_type, provenance, ...) are ignored."""
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"not a demo codec config: model_type {d.get('model_type')!r}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"model_type": MODEL_TYPE, **{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}}

    def __post_init__(self):
        if self.f_max > self.sample_rate / 2 or self.stream_crossfade > self.n_fft // 4:
            raise ValueError(f"f_max {self.f_max} above Nyquist or crossfade {self.stream_crossfade} > n_fft/4")
        if not 0 < self.hop_length <= self.n_fft // 2:  # the Hann windows must overlap for the inverse STFT
            raise ValueError(f"hop_length {self.hop_length} must lie in 1..n_fft/2 ({self.n_fft // 2})")

    @property
    def num_quantizers(self) -> int:
        return len(self.codebook_sizes)

    @property
    def samples_per_frame(self) -> int:
        return self.hop_length * self.stack

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame

    @property
    def feature_dim(self) -> int:
        return self.n_mels * self.stack


def mel_filterbank(cfg: DemoCodecConfig) -> torch.Tensor:
    """Slaney-scale, area-normalised triangular filters: [n_mels, n_fft // 2 + 1]."""

    def to_mel(f):
        return torch.where(f < 1000.0, 3.0 * f / 200.0, 15.0 + 27.0 * torch.log(f / 1000.0) / math.log(6.4))

    def to_hz(m):
        return torch.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * torch.exp((m - 15.0) * math.log(6.4) / 27.0))

    lo, hi = to_mel(torch.tensor([cfg.f_min, cfg.f_max], dtype=torch.float64))
    edges = to_hz(torch.linspace(lo.item(), hi.item(), cfg.n_mels + 2, dtype=torch.float64))  # [n_mels + 2]
    freqs = torch.linspace(0, cfg.sample_rate / 2, cfg.n_fft // 2 + 1, dtype=torch.float64)
    rising = (freqs[None] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - freqs[None]) / (edges[2:] - edges[1:-1])[:, None]
    fb = torch.clamp(torch.minimum(rising, falling), min=0.0) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return fb.float()


def initial_phase(start: int, frames: int, bins: int) -> torch.Tensor:
    """Deterministic pseudo-random unit phasors for absolute STFT frames start.. : [bins, frames] complex.
    A function of the absolute frame index, so one-shot and streamed decodes start from the same phases."""
    f = torch.arange(start, start + frames, dtype=torch.float64)[None]
    k = torch.arange(bins, dtype=torch.float64)[:, None]
    u = torch.frac(torch.sin(f * 12.9898 + k * 78.233) * 43758.5453).abs()
    return torch.polar(torch.ones_like(u), 2 * math.pi * u).to(torch.complex64)


class DemoCodec(nn.Module):
    """PCA + residual k-means over stacked log-mel frames; decode by mel inversion and Griffin-Lim. A
    streaming.StreamingCodec."""

    streams_exactly = False  # a stream's push boundaries move the samples (DemoCodecStream)

    def __init__(self, cfg: DemoCodecConfig):
        super().__init__()
        self.config = cfg
        frozen = lambda *shape: nn.Parameter(torch.zeros(*shape), requires_grad=False)  # noqa: E731
        self.pca_mean = frozen(cfg.feature_dim)
        self.pca_components = frozen(cfg.pca_dim, cfg.feature_dim)  # orthonormal rows
        self.codebooks = nn.ParameterList(frozen(k, cfg.pca_dim) for k in cfg.codebook_sizes)
        fb = mel_filterbank(cfg)
        self.register_buffer("mel_fb", fb, persistent=False)  # [n_mels, bins]
        self.register_buffer("mel_gram", fb.t() @ fb, persistent=False)  # [bins, bins]
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    # --- analysis -------------------------------------------------------------------------------------

    def stft(self, wav: torch.Tensor) -> torch.Tensor:  # [..., L] -> [..., bins, L // hop + 1]
        c = self.config
        return torch.stft(wav, c.n_fft, c.hop_length, window=self.window, center=True, pad_mode="constant",
                          return_complex=True)

    def istft(self, spec: torch.Tensor, length: int) -> torch.Tensor:  # [B, bins, F] -> [B, length]
        """torch.istft(center=True) (equal up to rounding), faster where Griffin-Lim calls it 30-odd times a push:
        the overlap-add is K shifted adds of hop-long blocks (K = ceil(n_fft / hop)) and the window's squared
        envelope is kept per frame count instead of being rebuilt and checked on every call."""
        c = self.config
        n_fft, hop, (B, _, frames) = c.n_fft, c.hop_length, spec.shape
        parts = torch.fft.irfft(spec.transpose(1, 2), n=n_fft, dim=-1) * self.window  # [B, F, n_fft]
        start = n_fft // 2
        end = min(start + length, n_fft + (frames - 1) * hop)  # past the last frame: zeros, as torch.istft pads
        out = self._overlap_add(parts).view(B, -1)[:, start:end] / self._envelope(frames)[start:end]
        return F.pad(out, (0, length - out.shape[-1])) if out.shape[-1] < length else out

    def _overlap_add(self, parts: torch.Tensor) -> torch.Tensor:
        """[B, F, n_fft] frames, hop apart -> [B, F + K - 1, hop] summed blocks: frame f's n_fft samples are K blocks
        of hop (K = ceil(n_fft / hop), the last zero-padded), block j of frame f landing in output block f + j."""
        hop, (B, frames, n_fft) = self.config.hop_length, parts.shape
        K = -(-n_fft // hop)
        blocks = F.pad(parts, (0, K * hop - n_fft)).view(B, frames, K, hop)
        out = parts.new_zeros(B, frames + K - 1, hop)
        for j in range(K):
            out[:, j : j + frames] += blocks[:, :, j]
        return out

    def _envelope(self, frames: int) -> torch.Tensor:
        """The overlap-added squared window of `frames` frames, flat, cached per frame count."""
        w = self.window
        key = (frames, w.device, w.dtype)
        cache = self.__dict__.setdefault("_envelopes", {})
        if key not in cache:
            if len(cache) >= 256:  # frame counts of a stream's pushes repeat; a long run of one-shot decodes does not
                cache.clear()
            cache[key] = self._overlap_add((w * w).expand(1, frames, -1))[0].flatten()
        return cache[key]

    def features(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [N] float 24 kHz -> stacked log-mel [T, 800] with T = ceil(N / 1920) (zero-padded at the end)."""
        c = self.config
        T = -(-wav.shape[-1] // c.samples_per_frame)
        wav = F.pad(wav.float(), (0, T * c.samples_per_frame - wav.shape[-1]))
        mel = self.mel_fb @ self.stft(wav).abs()  # [n_mels, 8T + 1]
        logmel = torch.log(torch.clamp(mel, min=c.log_floor))[:, : T * c.stack]
        return logmel.t().reshape(T, c.feature_dim)  # row t = mel frames 8t..8t+7, frame-major

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """Residual k-means: z [T, pca_dim] -> codes [T, Q]."""
        codes, r = [], z.clone()
        for book in self.codebooks:
            idx = nearest(r, book)  # [T]
            r -= book[idx]
            codes.append(idx)
        return torch.stack(codes, dim=-1)

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [N] float 24 kHz -> codes LongTensor [T, 16], T = ceil(N / 1920)."""
        z = (self.features(wav) - self.pca_mean) @ self.pca_components.t()  # [T, pca_dim]
        return self.quantize(z)

    # --- synthesis ------------------------------------------------------------------------------------

    def codes_to_logmel(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> log-mel [B, n_mels, 8T]."""
        c = self.config
        if codes.dim() != 3 or codes.shape[1] != c.num_quantizers:
            raise ValueError(f"expected codes [B, {c.num_quantizers}, T], got {tuple(codes.shape)}")
        z = sum(book[codes[:, q]] for q, book in enumerate(self.codebooks))  # [B, T, pca_dim]
        x = z @ self.pca_components + self.pca_mean  # [B, T, 800]
        B, T = codes.shape[0], codes.shape[-1]
        return x.reshape(B, T * c.stack, c.n_mels).transpose(1, 2)

    def magnitude(self, logmel: torch.Tensor) -> torch.Tensor:
        """Non-negative least-squares mel inversion: log-mel [B, n_mels, F] -> |STFT| [B, bins, F].
        Multiplicative updates from a start that is exact for flat spectra; every column is independent."""
        mel = torch.exp(logmel)
        num = self._filters(mel, transposed=True)  # [B, bins, F]
        s = num / (self.mel_gram.sum(1, keepdim=True) + 1e-8)
        for _ in range(self.config.nnls_iters):
            s = s * num / (self._filters(self._filters(s), transposed=True) + 1e-8)
        return s

    def _filters(self, x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
        """mel_fb @ x (x [B, bins, F] -> [B, n_mels, F]), or mel_fb.T @ x. On the CPU through sparse copies of the
        filter bank: each bin lies under at most two filters (~1,000 of its 51,300 entries are non-zero), and the mel
        inversion's 60 rounds of both products were the largest cost of a decode after Griffin-Lim."""
        fb = self.mel_fb
        if fb.device.type != "cpu":
            return (fb.t() if transposed else fb) @ x
        key = (fb.dtype, fb.data_ptr())
        if self.__dict__.get("_sparse_key") != key:
            with warnings.catch_warnings():  # "sparse CSR tensor support is in beta": only its product is used
                warnings.simplefilter("ignore", UserWarning)
                self._sparse = (fb.to_sparse_csr(), fb.t().contiguous().to_sparse_csr())
            self._sparse_key = key
        m = self._sparse[transposed]
        if x.shape[0] == 1:
            return (m @ x[0])[None]
        B, K, frames = x.shape
        return (m @ x.transpose(0, 1).reshape(K, B * frames)).reshape(-1, B, frames).transpose(0, 1)

    def griffin_lim(self, mag: torch.Tensor, phase: torch.Tensor, prefix: torch.Tensor | None = None,
                    tail: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Fast Griffin-Lim: mag [B, bins, F], start phase [B or 1, bins, F] -> (wav [B, hop*F], final spec).
        With `prefix` [B, P] the first P samples are held at those values (audio already played), so the
        frames that straddle sample P are made consistent with it."""
        c, frames = self.config, mag.shape[-1]
        length = c.hop_length * frames
        spec, prev = mag * phase, None
        for _ in range(c.gl_iters):
            rebuilt = self.stft(self._signal(spec, length, prefix))[..., :frames]
            accel = rebuilt if prev is None else torch.add(rebuilt, rebuilt - prev, alpha=c.gl_momentum)
            prev = rebuilt
            spec = accel * (mag / (accel.abs() + 1e-8))  # a real quotient, then one complex-by-real product
        return self._signal(spec, length + tail, prefix), spec

    def _signal(self, spec: torch.Tensor, length: int, prefix: torch.Tensor | None) -> torch.Tensor:
        wav = self.istft(spec, length)  # [B, length]
        if prefix is not None:
            wav = torch.cat([prefix, wav[:, prefix.shape[-1] :]], dim=-1)
        return wav

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> wav [B, 1, 1920*T] in [-1, 1], from scratch."""
        mag = self.magnitude(self.codes_to_logmel(codes))  # [B, bins, 8T]
        wav, _ = self.griffin_lim(mag, initial_phase(0, mag.shape[-1], mag.shape[1]))
        return wav.clamp(-1.0, 1.0).unsqueeze(1)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot decode: codes LongTensor [B, 16, T] -> wav [B, 1, 1920*T] in [-1, 1]."""
        return self.decode(codes)

    @torch.no_grad()
    def chunked_decode(self, codes: torch.Tensor, chunk_size: int = 300, left_context: int = 25) -> torch.Tensor:
        """Same signature as CodecDecoder.chunked_decode. Griffin-Lim over a whole utterance is cheap and
        memory-light (about 2 MB per 100 frames), so this is the one-shot decode; the chunk arguments are unused."""
        return self.decode(codes)

    def stream(self, official_chunking: bool = False) -> DemoCodecStream:
        """A fresh incremental decoder; see DemoCodecStream. Same signature as CodecDecoder.stream: the demo codec
        has no reference chunking to imitate, so `official_chunking` changes nothing here."""
        return DemoCodecStream(self)


def nearest(x: torch.Tensor, book: torch.Tensor, block: int = 16384) -> torch.Tensor:
    """Index of the nearest codeword (squared L2) for every row: x [N, D], book [K, D] -> [N]."""
    norms = (book * book).sum(1)  # [K]
    out = [(norms - 2 * x[s : s + block] @ book.t()).argmin(1) for s in range(0, x.shape[0], block)]
    return torch.cat(out) if out else x.new_zeros(0, dtype=torch.long)


class DemoCodecStream:
    """Incremental decode: push(codes [B, Q, n]) -> wav [B, 1, 1920*n], no look-ahead, no added latency.

    Each push runs Griffin-Lim on the last `stream_context` frames plus the new ones: the context frames start
    from their last phases and their samples are held at the emitted audio, the new frames start from the
    same deterministic phases as the one-shot decode. It emits the new frames' samples, the first
    `stream_crossfade` of them faded in from the continuation the previous push predicted. A single push is
    the one-shot decode exactly; small pushes are worse at the push boundaries, because Griffin-Lim there
    cannot see the next frames (measured in models/recipes/demo/README.md, bounded in tests/test_demo_codec.py)."""

    def __init__(self, codec: DemoCodec):
        self.codec = codec
        self.reset()

    def reset(self) -> None:
        """Forget everything; the next push starts a new utterance."""
        self.frames = 0  # STFT frames emitted so far
        self.mag: torch.Tensor | None = None  # context magnitudes [B, bins, <= 8*context]
        self.phase: torch.Tensor | None = None  # their last Griffin-Lim phases, same shape
        self.tail: torch.Tensor | None = None  # predicted continuation past the last push [B, crossfade]
        self.past: torch.Tensor | None = None  # the context frames' emitted samples [B, hop * 8*context]

    def state(self) -> tuple:
        """Where the stream stands, to `restore` later (pushes replace these tensors, never write into them)."""
        return self.frames, self.mag, self.phase, self.tail, self.past

    def restore(self, state: tuple) -> None:
        self.frames, self.mag, self.phase, self.tail, self.past = state

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next n frames: codes [B, Q, n] -> wav [B, 1, 1920*n]."""
        codec, c = self.codec, self.codec.config
        if codes.shape[-1] == 0:
            return codec.pca_mean.new_zeros(codes.shape[0], 1, 0)
        new = codec.magnitude(codec.codes_to_logmel(codes))  # [B, bins, 8n]
        start = initial_phase(self.frames, new.shape[-1], new.shape[1]).expand_as(new)
        X, P = c.stream_crossfade, 0 if self.past is None else self.past.shape[-1]
        mag = new if self.mag is None else torch.cat([self.mag, new], dim=-1)
        phase = start if self.mag is None else torch.cat([self.phase, start], dim=-1)
        wav, spec = codec.griffin_lim(mag, phase, self.past, tail=X)  # [B, hop * (ctx + 8n) + X]
        out = wav[:, P : wav.shape[-1] - X].clone()  # [B, 1920n]
        if self.tail is not None and X:
            fade = torch.linspace(0.0, 1.0, X + 2)[1:-1]
            out[:, :X] = fade * out[:, :X] + (1 - fade) * self.tail
        keep = c.stream_context * c.stack
        self.mag, self.phase = mag[..., -keep:], (spec / (spec.abs() + 1e-8))[..., -keep:]
        self.past = (out if self.past is None else torch.cat([self.past, out], -1))[:, -keep * c.hop_length :]
        self.tail = wav[:, wav.shape[-1] - X :] if X else None
        self.frames += new.shape[-1]
        return out.clamp(-1.0, 1.0).unsqueeze(1)
