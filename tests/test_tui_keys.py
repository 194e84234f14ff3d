"""The TUI under fast input: keys sent the way a terminal sends them (straight to the driver, without waiting for
the app to handle the previous one), the command palette's Quit racing other keys, a resize mid-run."""

from __future__ import annotations

import asyncio
import random

from textual import events
from textual.command import CommandPalette
from textual.widgets import Button

from .test_tui import SIZE, make_app, until

KEYS = [*"abcdefghijklmnopqrstuvwxyz", "tab", "enter", "up", "down", "left", "right", "f5", "f8", "f2", "escape",
        "ctrl+p"]
CHARS = {"tab": "\t", "enter": "\r", "escape": "\x1b", "ctrl+p": "\x10"}


def send(app, key: str) -> None:
    """One key, as the terminal driver posts it: queued for the app, not waited for."""
    event = events.Key(key, key if len(key) == 1 else CHARS.get(key))
    event.set_sender(app)
    app._driver.send_message(event)


def watch_errors(app) -> list[BaseException]:
    """Every unhandled exception the app meets (Textual keeps only the first for run_test to re-raise)."""
    errors, handle = [], app._handle_exception
    app._handle_exception = lambda e: (errors.append(e), handle(e))
    return errors


def assert_clean(app, errors) -> None:
    assert errors == [] and app._exception is None, errors
    assert app.return_code in (None, 0) and not app._exit_renderables  # nothing printed as "N errors shown"


async def _enter_twice_on_quit_in_the_palette(tmp_path):
    app = make_app(tmp_path, max_frames=4)
    errors = watch_errors(app)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"quit")
        await pilot.pause(0.3)
        send(app, "enter")  # picks Quit...
        send(app, "enter")  # ...and this one reaches the palette after it has popped itself
        await pilot.pause(0.5)
    assert_clean(app, errors)
    assert app.return_code == 0  # it did quit


async def _random_keys(tmp_path, seed: int, count: int, pause_s: float):
    """`count` seeded random keys, `pause_s` or nothing apart; each time the palette's Quit ends the app, a fresh
    one takes the remaining keys; each app is resized to 60x20 partway through."""
    rng, sent, apps = random.Random(seed), 0, 0
    while sent < count:
        app = make_app(tmp_path, max_frames=4)
        errors = watch_errors(app)
        apps += 1
        async with app.run_test(size=SIZE) as pilot:
            speak = app.query_one("#speak", Button)
            await until(pilot, lambda: not speak.disabled)  # noqa: B023 (awaited here)
            resize_at = sent + rng.randrange(10, 60)
            while sent < count and app.return_code is None:
                if sent == resize_at:
                    await pilot.resize_terminal(60, 20)
                send(app, rng.choice(KEYS))
                sent += 1
                await asyncio.sleep(rng.choice((0.0, pause_s)))  # some keys back to back, as in a burst
            await pilot.pause(0.2)  # let the last keys land, then close (maybe while it speaks)
        assert_clean(app, errors)
    return apps


def test_enter_twice_on_quit_in_the_palette(tmp_path):
    asyncio.run(_enter_twice_on_quit_in_the_palette(tmp_path))


def test_random_keys_never_crash(tmp_path):
    asyncio.run(_random_keys(tmp_path, seed=6, count=300, pause_s=0.02))
