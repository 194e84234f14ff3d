"""What a synthesis stream hands out: `SpeechChunk`s, each with one `StreamStats` record for every mode, the codec
interface the stream decodes through (`StreamingCodec`), and the joins where sentences meet. The stream itself is
`Synthesizer.stream` (synthesis.py)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Protocol

import numpy as np
import torch

from leapvox.engine.decode import DecodeStats
from leapvox.engine.text import estimate_audio_s

CROSSFADE_S = 0.015  # equal-power crossfade where two sentences join
FIRST_CHUNK_FRAMES = 1  # 80 ms: the first audio leaves after one frame (sooner than after 2, at the same xRT) ...
MAX_CHUNK_FRAMES = 16  # ... later chunks double up to 1.28 s, fewer codec calls


# ---- the codec interface -------------------------------------------------------------------------------------


class DecoderStream(Protocol):
    """An incremental decode (codec.CodecStream, demo_codec.DemoCodecStream)."""

    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next n frames: codes [B, 16, n] -> wav [B, 1, samples_per_frame * n]."""

    def reset(self) -> None:
        """Forget everything; the next push starts a new utterance."""

    def state(self) -> object:
        """Where the stream stands (opaque), to `restore` any number of times: e.g. primed with a reference."""

    def restore(self, state: object) -> None: ...


class StreamingCodec(Protocol):
    """What synthesis needs of a codec decoder (codec.CodecDecoder, demo_codec.DemoCodec)."""

    samples_per_frame: int
    sample_rate: int
    streams_exactly: bool  # a stream's samples do not depend on how its frames are chunked into pushes

    def chunked_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] -> wav [B, 1, samples_per_frame * T] by the official chunking rule."""

    def stream(self, official_chunking: bool = False) -> DecoderStream: ...


# ---- stats ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamStats:
    """One record for every mode: counters and timings of a stream so far (totals over its sentences)."""

    mode: str
    frames: int = 0
    sentence: int = 0  # sentences started so far (1-based index of the current one)
    sentences: int = 0  # sentences in the text
    audio_s: float = 0.0  # audio handed out so far
    elapsed_s: float = 0.0  # wall time since the stream started
    first_audio_s: float | None = None  # wall time to the first audio chunk
    talker_calls: int = 0
    predictor_calls: int = 0
    predicted_codes: int = 0  # codes 1..15 the code predictor produced (accepted ones, for spec)
    kv_bytes: int = 0  # talker KV cache bytes in use (the ring's, for windowed)
    prefill_s: float = 0.0
    talker_s: float = 0.0  # decode steps, prefill excluded
    predictor_s: float = 0.0
    codec_s: float = 0.0
    est_remaining_s: float = 0.0  # audio still to come, estimated from the text and the speech so far
    stop_reasons: tuple[str, ...] = ()  # per finished sentence: eos, max_frames, guard, cancelled
    warnings: tuple[str, ...] = ()

    @property
    def stop_reason(self) -> str:
        """One word for the whole stream: the first sentence's reason that is not "eos", else "eos"."""
        return next((r for r in self.stop_reasons if r != "eos"), "eos" if self.stop_reasons else "")

    @property
    def xrt(self) -> float:
        """xRT: audio seconds per wall second (bigger is faster)."""
        return self.audio_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        """Talker steps (calls) per wall second."""
        return self.talker_calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def predictor_calls_per_s(self) -> float:
        return self.predictor_calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tok_per_call(self) -> float:
        """Codes accepted per code-predictor call: 1.0 for ar, more for spec."""
        return self.predicted_codes / self.predictor_calls if self.predictor_calls else 0.0

    @property
    def kv_mb(self) -> float:
        return self.kv_bytes / 2**20

    def stage_ms(self) -> dict[str, float]:
        """Mean milliseconds per frame for each stage (prefill spread over the frames is left out)."""
        n = max(self.frames, 1)
        return {"talker": 1e3 * self.talker_s / n, "predictor": 1e3 * self.predictor_s / n,
                "codec": 1e3 * self.codec_s / n}

    def as_dict(self) -> dict:
        """Raw numbers, derived ones included, for JSON."""
        d = asdict(self)
        d.update(xrt=self.xrt, steps_per_s=self.steps_per_s, predictor_calls_per_s=self.predictor_calls_per_s,
                 tok_per_call=self.tok_per_call, kv_mb=self.kv_mb,
                 **{f"{k}_ms_per_frame": v for k, v in self.stage_ms().items()})
        d["stop_reasons"], d["warnings"] = list(self.stop_reasons), list(self.warnings)
        return d


    def plus(self, u: DecodeStats, codec_s: float, codes_per_frame: int, **fields) -> StreamStats:
        """These totals plus one utterance's counters `u` so far and its codec time (and `fields` as given)."""
        frames = self.frames + u.frames
        return replace(
            self, frames=frames, predicted_codes=frames * codes_per_frame, kv_bytes=u.kv_bytes,
            talker_calls=self.talker_calls + u.talker_calls, predictor_calls=self.predictor_calls + u.predictor_calls,
            prefill_s=self.prefill_s + u.prefill_s, talker_s=self.talker_s + u.talker_s,
            predictor_s=self.predictor_s + u.predictor_s, codec_s=self.codec_s + codec_s, **fields,
        )

    def handed_out(self, before: StreamStats, samples: int, sample_rate: int, elapsed_s: float,
                   total_s: float) -> StreamStats:
        """These counters once `samples` more than `before` were handed out, `elapsed_s` into a stream whose audio is
        estimated at `total_s` seconds."""
        first = before.first_audio_s if before.first_audio_s is not None or not samples else elapsed_s
        audio_s = (round(before.audio_s * sample_rate) + samples) / sample_rate
        return replace(self, audio_s=audio_s, elapsed_s=elapsed_s, first_audio_s=first,
                       est_remaining_s=max(0.0, total_s - audio_s))


@dataclass(frozen=True)
class SpeechChunk:
    """One piece of a stream (mlx-lm's GenerationResponse): audio, the frames it came from, the stats so far and, on
    the last chunk of the stream, why it finished."""

    audio: np.ndarray  # [n] float32 in [-1, 1]; may be empty (the final record, a cancelled stream)
    sample_rate: int
    codes: torch.Tensor  # [f, 16] the frames whose audio this chunk carries (crossfade tails aside)
    sentence: int  # 0-based index of the sentence being spoken
    stats: StreamStats
    finish_reason: str | None = None  # the last chunk only: stats.stop_reason (eos, max_frames, guard, cancelled)

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


def audio_estimate(sentences: list[str]) -> list[float]:
    """Guessed audio seconds of the sentences before each one (and of all, last): est[i] = sentences 0..i-1."""
    est = [0.0]
    for s in sentences:
        est.append(est[-1] + estimate_audio_s(s))
    return est


def total_estimate(est: list[float], finished: int, spoken_s: float) -> float:
    """Audio seconds the whole stream will make: the finished sentences' `spoken_s`, and the rest as guessed, scaled
    by how the finished ones came out against their guess."""
    scale = spoken_s / max(est[finished], 1e-6) if finished else 1.0
    return spoken_s + scale * (est[-1] - est[finished])


# ---- joining sentences ------------------------------------------------------------------------------------


class Joiner:
    """Holds back the last `n` samples of the audio so far, so that where a sentence ends they can be
    crossfaded (equal power) into the start of the next one. Within a sentence nothing is changed."""

    def __init__(self, n: int):
        t = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
        self.fade_in = np.sin(0.5 * math.pi * t).astype(np.float32)
        self.fade_out = np.cos(0.5 * math.pi * t).astype(np.float32)
        self.n, self.held, self.tail = n, np.zeros(0, np.float32), None

    def add(self, audio: np.ndarray) -> np.ndarray:
        if self.tail is not None and len(audio):
            m = min(len(self.tail), len(audio))
            mixed = self.tail[:m] * self.fade_out[:m] + audio[:m] * self.fade_in[:m]
            audio = np.concatenate([mixed, self.tail[m:] * self.fade_out[m : len(self.tail)], audio[m:]])
            self.tail = None
        run = np.concatenate([self.held, audio])
        cut = max(len(run) - self.n, 0)
        self.held = run[cut:]
        return run[:cut]

    def end_sentence(self) -> None:
        if len(self.held):
            self.tail, self.held = self.held, np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        rest = [x for x in (self.tail, self.held) if x is not None]
        self.tail, self.held = None, np.zeros(0, np.float32)
        return np.concatenate(rest) if rest else np.zeros(0, np.float32)
