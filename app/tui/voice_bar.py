"""Speaker, language, mode and backend selectors; posts VoiceBar.Changed with all four."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Label, Select


@dataclass(frozen=True)
class Voice:
    speaker: str
    language: str
    mode: str
    backend: str


class VoiceBar(Horizontal):
    """Choices come down as constructor arguments (or `set_choices`); the current Voice goes up in Changed."""

    class Changed(Message):
        def __init__(self, voice: Voice) -> None:
            super().__init__()
            self.voice = voice

    def __init__(self, modes: tuple[str, ...], backends: tuple[str, ...], **kw) -> None:
        super().__init__(**kw)
        self.modes, self.backends = modes, backends

    def compose(self) -> ComposeResult:
        yield Label("speaker")
        yield Select([], id="speaker", allow_blank=True, prompt="(model loading)")
        yield Label("language")
        yield Select([], id="language", allow_blank=True, prompt="(model loading)")
        yield Label("mode")
        yield Select([(m, m) for m in self.modes], id="mode", allow_blank=False, value=self.modes[0])
        yield Label("backend")
        yield Select([(b, b) for b in self.backends], id="backend", allow_blank=False, value=self.backends[0])

    async def set_choices(self, speakers: list[str], languages: list[str]) -> None:
        """The model's choices in place of the "(model loading)" selectors: a list with entries has no blank one (a
        blank choice would speak as the default speaker), so its first entry is selected; an empty one says none."""
        for sel_id, items in (("speaker", speakers), ("language", languages)):
            old = self.query_one(f"#{sel_id}", Select)
            at = self.children.index(old)
            await old.remove()  # Select's blank entry is fixed when it is made
            await self.mount(Select([(x, x) for x in items], id=sel_id, allow_blank=not items, prompt="(none)"),
                             before=at)

    @property
    def voice(self) -> Voice:
        def get(name: str) -> str:
            v = self.query_one(f"#{name}", Select).value
            return "" if v is Select.NULL else str(v)

        return Voice(get("speaker"), get("language") or "auto", get("mode"), get("backend"))

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self.voice))
