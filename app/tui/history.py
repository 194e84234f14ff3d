"""The utterances spoken so far, with their stats; Save WAV posts History.SaveRequested for the selected one."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable

from .utterance import Utterance


class History(Vertical):
    class SaveRequested(Message):
        def __init__(self, utterance: Utterance) -> None:
            super().__init__()
            self.utterance = utterance

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.utterances: list[Utterance] = []

    def compose(self) -> ComposeResult:
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="history-buttons"):
            yield Button("Save WAV", id="save", disabled=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "text", "speaker", "mode", "audio", "×RT", "first", "end")

    def add(self, u: Utterance) -> None:
        self.utterances.append(u)
        s = u.stats
        text = u.text if len(u.text) <= 22 else u.text[:21] + "…"
        end = "stopped" if u.cancelled else ",".join(sorted(set(s.stop_reasons))) or "-"
        first = f"{s.first_audio_s:.2f} s" if s.first_audio_s is not None else "-"
        table = self.query_one(DataTable)
        table.add_row(str(u.number), text, u.speaker, u.mode_shown, f"{u.duration_s:.2f} s", f"{s.xrt:.2f}", first, end)
        table.move_cursor(row=table.row_count - 1)
        self.query_one("#save", Button).disabled = False

    @property
    def selected(self) -> Utterance | None:
        table = self.query_one(DataTable)
        if not self.utterances or table.cursor_row < 0:
            return None
        return self.utterances[min(table.cursor_row, len(self.utterances) - 1)]

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save" and self.selected is not None:
            event.stop()
            self.post_message(self.SaveRequested(self.selected))
