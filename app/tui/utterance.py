"""One spoken utterance as the history keeps it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leapvox.app.playback import PlaybackStats
from leapvox.engine.streaming import StreamStats


@dataclass(frozen=True)
class Utterance:
    number: int
    text: str
    speaker: str
    language: str
    mode: str
    backend: str
    audio: np.ndarray  # [n] float32
    sample_rate: int
    stats: StreamStats
    playback: PlaybackStats | None = None
    cancelled: bool = False
    auto: bool = False  # `mode` is what mode auto chose (models.auto)

    @property
    def mode_shown(self) -> str:
        return f"{self.mode} (auto)" if self.auto else self.mode

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def file_name(self) -> str:
        return f"leapvox-{self.number:03d}-{self.speaker}-{self.mode}.wav"
