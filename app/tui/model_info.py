"""The model in use (its folder) and how to change it."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


class ModelInfo(Static):
    path: reactive[str] = reactive("")
    state: reactive[str] = reactive("loading…")
    audio: reactive[str] = reactive("")
    auto: reactive[str] = reactive("")  # what mode (and weights) auto chose and why (models.auto.Choice.line)

    def render(self) -> Text:
        return Text(
            f"model: {self.path or '(none)'}  [{self.state}]  ·  {self.audio}\n"
            + (f"auto: {self.auto}\n" if self.auto else "")
            + "change the model with: leapvox tui --model PATH"
        )
