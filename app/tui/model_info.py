"""The model in use (its folder) and how to change it."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


class ModelInfo(Static):
    path: reactive[str] = reactive("")
    state: reactive[str] = reactive("loading…")
    audio: reactive[str] = reactive("")

    def render(self) -> Text:
        return Text(
            f"model: {self.path or '(none)'}  [{self.state}]  ·  {self.audio}\n"
            "change the model with: leapvox tui --model PATH"
        )
