"""Messages the synthesis and model-loading workers post to the app (messages up)."""

from __future__ import annotations

from textual.message import Message

from leapvox.app.playback import PlaybackStats
from leapvox.engine.streaming import StreamStats

from .utterance import Utterance


class ModelReady(Message):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model  # leapvox.models.checkpoint.LoadedModel


class ModelFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class SpeechProgress(Message):
    """A chunk was synthesised (and queued for playback)."""

    def __init__(self, stats: StreamStats, playback: PlaybackStats | None) -> None:
        super().__init__()
        self.stats, self.playback = stats, playback


class SpeechFinished(Message):
    """The utterance ended: spoken to the end, stopped, or failed (`error`)."""

    def __init__(self, utterance: Utterance | None, cancelled: bool = False, error: str | None = None) -> None:
        super().__init__()
        self.utterance, self.cancelled, self.error = utterance, cancelled, error
