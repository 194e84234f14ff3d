"""The command palette (Ctrl+P), safe against keys that arrive faster than it closes.

Textual's palette pops itself off the screen stack as soon as a command is chosen, but the screen lives on until
it is removed, and keys already handed to its input are still handled: a second Enter right after the one that
chose Quit submits again, and the palette dismisses itself a second time, off a stack that holds only the main
screen (ScreenStackError, a traceback on exit); a late letter starts a search whose results land in a palette
whose widgets are gone (NoMatches). Here, once dismissed, the palette stops its searches and ignores further
typing, choices and dismissals.
"""

from __future__ import annotations

from textual.await_complete import AwaitComplete
from textual.command import CommandPalette
from textual.message import Message
from textual.widgets import Button, Input, OptionList


async def _nothing() -> None:
    pass


class Palette(CommandPalette):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dismissed = False

    def dismiss(self, result=None) -> AwaitComplete:
        if self.dismissed or self.app.screen is not self:  # closing already, or not on top: nothing to pop
            return AwaitComplete(_nothing())
        self.dismissed = True
        self.workers.cancel_node(self)  # a search still gathering commands would fill in a list about to go
        return super().dismiss(result)

    def _late(self, event: Message) -> None:
        """Typing or a choice that arrived after the palette was dismissed: drop it, base class handlers included."""
        if self.dismissed:
            event.stop()
            event.prevent_default()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._late(event)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._late(event)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self._late(event)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._late(event)
