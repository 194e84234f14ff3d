"""The TUI's "speak as I type" (F9) through App.run_test() + Pilot: each sentence is spoken once it is sure, while
the next is still being typed; F9 again speaks the rest; stopping, or quitting, while it waits for text."""

from __future__ import annotations

import asyncio

import numpy as np
from textual.widgets import Button, TextArea

from leapvox.app.tui.history import History
from leapvox.app.tui.readout import Readout

from .test_tui import SIZE, keys, make_app, until


async def _first_sentence_spoken_while_the_second_is_typed(tmp_path):
    made = []
    app = make_app(tmp_path, made, max_frames=6)
    async with app.run_test(size=SIZE) as pilot:
        history, readout, area = app.query_one(History), app.query_one(Readout), app.query_one("#text", TextArea)
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        await pilot.press("f9")
        assert "speaking as you type" in app.export_screenshot().replace("&#160;", " ")  # the state is on screen
        assert app.query_one("#speak", Button).disabled and not app.query_one("#stop", Button).disabled
        await pilot.press(*keys("Hello there. How"))
        # the first sentence is sure once the second has begun: it is spoken with the second still being typed
        await until(pilot, lambda: readout.stats is not None and readout.stats.audio_s > 0)
        assert area.text == "Hello there. How" and readout.stats.sentences == 1 and history.utterances == []
        await until(pilot, lambda: any(np.flatnonzero(s.output).size for s in made))  # it reached the device
        await pilot.press(*keys(" are you?"))
        assert readout.stats.sentences == 1  # "How are you?" is not sure: nothing says the sentence is over
        await pilot.press("f9")  # off: the rest is spoken
        await until(pilot, lambda: len(history.utterances) == 1)
        u = history.utterances[0]
        assert u.text == "Hello there. How are you?" and u.stats.sentences == 2 and len(u.stats.stop_reasons) == 2
        assert not u.cancelled and len(u.audio) > 0 and u.stats.frames == 12
        assert app.live is None and not area.border_title and not app.query_one("#speak", Button).disabled


def test_first_sentence_spoken_while_the_second_is_typed(tmp_path):
    asyncio.run(_first_sentence_spoken_while_the_second_is_typed(tmp_path))


async def _stop_and_quit_while_waiting_for_text(tmp_path):
    app = make_app(tmp_path, max_frames=4)
    notes = []
    app.notify = lambda message, **kw: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        history = app.query_one(History)
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        await pilot.press("f9", "f9")  # on and off with nothing typed: nothing to say, and nothing to complain of
        await until(pilot, lambda: not app.busy)
        assert history.utterances == [] and notes == []
        await pilot.press("f9", *keys("One. Two"))
        await until(pilot, lambda: app.query_one(Readout).stats is not None)
        await pilot.press("f8")  # stop while the worker waits for the rest of "Two"
        await until(pilot, lambda: len(history.utterances) == 1)
        assert history.utterances[0].text == "One." and app.live is None and not app.busy
        await pilot.press("f9", *keys("Left waiting."))  # and quit while it waits: the app still ends
    assert app.return_code in (None, 0)


def test_stop_and_quit_while_waiting_for_text(tmp_path):
    asyncio.run(_stop_and_quit_while_waiting_for_text(tmp_path))
