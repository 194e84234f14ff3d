"""What a synthesis stream hands out: `SpeechChunk`s, each with one `StreamStats` record for every mode, and the
bookkeeping behind them (totals over sentences, crossfades where sentences join). The stream itself is
`Synthesizer.stream` (synthesis.py)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .decode import DecodeStats
from .text import estimate_audio_s

CROSSFADE_S = 0.015  # equal-power crossfade where two sentences join
FIRST_CHUNK_FRAMES = 1  # 80 ms: the first audio leaves after one frame (0.2 s sooner than 2, same xRT: measured) ...
MAX_CHUNK_FRAMES = 16  # ... later chunks double up to 1.28 s, fewer codec calls


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


@dataclass(frozen=True)
class SpeechChunk:
    audio: np.ndarray  # [n] float32 in [-1, 1]; may be empty (the final record, a cancelled stream)
    sample_rate: int
    codes: torch.Tensor  # [f, 16] the frames whose audio this chunk carries (crossfade tails aside)
    sentence: int  # 0-based index of the sentence being spoken
    stats: StreamStats
    final: bool = False


@dataclass
class Tally:
    """Mutable totals over the sentences of one stream; `snapshot` freezes them into a StreamStats."""

    mode: str
    sentences: list[str]
    t0: float = field(default_factory=time.perf_counter)
    done: DecodeStats = field(default_factory=DecodeStats)  # sums over finished sentences
    current: DecodeStats = field(default_factory=DecodeStats)
    codes_per_frame: int = 15
    sentence: int = 0
    audio_samples: int = 0  # handed out so far
    sentence_samples: int = 0  # decoded for the current sentence
    first_audio_s: float | None = None
    stop_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def begin(self, index: int) -> DecodeStats:
        self.sentence, self.current, self.sentence_samples = index, DecodeStats(), 0
        return self.current

    def finish(self, stop_reason: str, sentence_audio_s: float) -> None:
        c, d = self.current, self.done
        for name in ("frames", "talker_calls", "predictor_calls", "talker_s", "predictor_s", "prefill_s", "codec_s"):
            setattr(d, name, getattr(d, name) + getattr(c, name))
        self.stop_reasons.append(stop_reason or c.stop_reason)
        self.spoken_total += sentence_audio_s  # audio of the finished sentences
        self.current = DecodeStats(kv_bytes=c.kv_bytes)

    def __post_init__(self) -> None:
        # guessed audio seconds of the sentences, and its running sum (guessed_before[i] = sentences 0..i-1), once:
        # a snapshot per chunk must not walk a long text's sentences again
        guess = [estimate_audio_s(s) for s in self.sentences]
        self.guessed_before = [0.0]
        for g in guess:
            self.guessed_before.append(self.guessed_before[-1] + g)
        self.spoken_total = 0.0

    def est_remaining(self, sample_rate: int) -> float:
        n, before = len(self.stop_reasons), self.guessed_before  # finished sentences
        scale = self.spoken_total / max(before[n], 1e-6) if n else 1.0
        total = self.spoken_total + scale * (before[-1] - before[n])
        return max(0.0, total - self.audio_samples / sample_rate)

    def snapshot(self, sample_rate: int) -> StreamStats:
        c, d = self.current, self.done
        frames = d.frames + c.frames
        return StreamStats(
            mode=self.mode, frames=frames, sentence=self.sentence + 1, sentences=len(self.sentences),
            audio_s=self.audio_samples / sample_rate, elapsed_s=time.perf_counter() - self.t0,
            first_audio_s=self.first_audio_s, talker_calls=d.talker_calls + c.talker_calls,
            predictor_calls=d.predictor_calls + c.predictor_calls, predicted_codes=frames * self.codes_per_frame,
            kv_bytes=c.kv_bytes, prefill_s=d.prefill_s + c.prefill_s, talker_s=d.talker_s + c.talker_s,
            predictor_s=d.predictor_s + c.predictor_s, codec_s=d.codec_s + c.codec_s,
            est_remaining_s=self.est_remaining(sample_rate), stop_reasons=tuple(self.stop_reasons),
            warnings=tuple(self.warnings),
        )


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
