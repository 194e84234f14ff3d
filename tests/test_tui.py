"""The TUI through App.run_test() + Pilot: type, speak, readouts, stop mid-utterance, switch voice, save, snapshot.

Each test is a plain function running its coroutine with asyncio.run (no async pytest plugin needed)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from dataclasses import replace

import numpy as np
import soundfile as sf
from textual.widgets import Button, DataTable, Select, TextArea

from leapvox.app.playback import Player
from leapvox.app.tui.app import LeapvoxApp
from leapvox.app.tui.history import History
from leapvox.app.tui.model_info import ModelInfo
from leapvox.app.tui.readout import Readout
from leapvox.engine.backend import available_backends
from leapvox.engine.options import MODE_CHOICES, MODES
from leapvox.models.load import load_model

from .conftest import FIXTURES
from .test_playback import FakeOutputStream

SIZE = (120, 40)


@functools.cache
def model():
    return load_model(FIXTURES / "tiny-0b6")


def fake_players(made: list):
    """A player factory whose output stream pulls 20 ms blocks from a thread, ten times faster than real time."""

    def stream(**kw):
        s = FakeOutputStream(**kw)
        made.append(s)

        def run():
            while not s.closed:
                s.pump()
                time.sleep(0.002)

        threading.Thread(target=run, daemon=True).start()
        return s

    return lambda sr: Player(sr, stream_factory=stream, blocksize=480)


def make_app(tmp_path, made=None, **opts):
    options = replace(model().defaults, seed=1, **opts)
    return LeapvoxApp(model=model(), options=options, player_factory=fake_players([] if made is None else made),
                      save_dir=tmp_path)


async def until(pilot, cond, timeout=30.0):
    t = time.perf_counter()
    while not cond():
        assert time.perf_counter() - t < timeout, "timed out waiting for the TUI"
        await pilot.pause(0.05)


def keys(text: str) -> list[str]:
    return ["space" if c == " " else c for c in text]


async def _type_speak_readouts_save_and_snapshot(tmp_path):
    made = []
    app = make_app(tmp_path, made, max_frames=8)
    async with app.run_test(size=SIZE) as pilot:
        history, readout = app.query_one(History), app.query_one(Readout)
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        assert str(FIXTURES / "tiny-0b6") in app.query_one(ModelInfo).render()
        await pilot.press(*keys("Hello there."))
        assert app.query_one("#text", TextArea).text == "Hello there."
        seen = []
        app.query_one(Readout).watch(readout, "stats", lambda s: seen.append(s), init=False)
        await pilot.click("#speak")
        await until(pilot, lambda: len(history.utterances) == 1)
        u = history.utterances[0]
        # the selector starts on auto; without a tune profile auto runs ar, and the readouts say it was auto's choice
        assert u.text == "Hello there." and u.mode == "ar" and u.auto and u.stats.frames == 8 and not u.cancelled
        assert readout.auto and app.query_one(ModelInfo).auto.startswith("mode auto -> ar (no tune profile here")
        assert len(u.audio) == 8 * 1920 and u.playback.underruns >= 0
        assert len(seen) >= 3  # the readout moved while it spoke, not only at the end
        assert readout.stats.frames == 8 and readout.stats.xrt > 0
        assert made and np.flatnonzero(made[0].output).size  # audio went to the (fake) device
        assert app.query_one(DataTable).row_count == 1
        await pilot.press("f2")
        await until(pilot, lambda: any(tmp_path.glob("*.wav")))
        wav = next(tmp_path.glob("*.wav"))
        assert wav.name == "leapvox-001-aiden-ar.wav" and len(sf.read(wav)[0]) == 8 * 1920
        svg = app.export_screenshot()
        (tmp_path / "main.svg").write_text(svg)
    text = svg.replace("&#160;", " ")
    assert "ar (auto)" in text and "auto: mode auto -&gt; ar" in text  # the readout and the model line
    for label in ("Speak", "Stop", "×RT", "steps/s", "tok/call", "first", "KV", "talker", "predictor", "codec",
                  "history", "model:", "tiny-0b6", "speaker", "language", "mode", "backend", "Save", "WAV"):
        assert label in text, label


async def _stop_mid_utterance_then_switch_voice(tmp_path):
    app = make_app(tmp_path)  # no frame cap: the random-weight model would talk for a long time
    async with app.run_test(size=SIZE) as pilot:
        history, readout = app.query_one(History), app.query_one(Readout)
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        app.query_one("#text", TextArea).text = "This is a long text. It has sentences. Many of them, too."
        await pilot.click("#speak")
        await until(pilot, lambda: readout.stats is not None and readout.stats.frames >= 2)
        assert not app.query_one("#stop", Button).disabled and app.query_one("#speak", Button).disabled
        stopped = []
        real_stop = app.action_stop
        app.action_stop = lambda: (stopped.append(time.perf_counter()), real_stop())
        # Button.press() rather than pilot.click: the pilot waits for an idle CPU before each mouse event,
        # which never comes while the worker synthesises.
        app.query_one("#stop", Button).press()
        await until(pilot, lambda: len(history.utterances) == 1, timeout=10)
        assert time.perf_counter() - stopped[0] < 2.0  # the worker checks for cancellation every frame
        u = history.utterances[0]
        # the sentence in progress was cut (which one depends on how fast the random model runs: the UI sees "2
        # frames" a moment after they were made, and the fused fp32 layers make ~300 frames a second here)
        assert u.cancelled and u.stats.stop_reasons[-1] == "cancelled"
        assert len(u.stats.stop_reasons) == u.stats.sentence <= u.stats.sentences
        assert not app.query_one("#speak", Button).disabled

        # switch speaker and mode between utterances; the mode selector lists auto and exactly the available modes
        mode_select = app.query_one("#mode", Select)
        assert [v for _, v in mode_select._options if v is not Select.NULL] == ["auto", *MODES]
        assert [v for _, v in app.query_one("#backend", Select)._options] == list(available_backends())
        app.query_one("#speaker", Select).value = "ryan"
        mode_select.value = MODES[-1]
        await pilot.pause()
        app.options = replace(app.options, max_frames=3)
        app.query_one("#text", TextArea).text = "Short."
        await pilot.press("f5")
        await until(pilot, lambda: len(history.utterances) == 2)
        v = history.utterances[1]
        assert v.speaker == "ryan" and v.mode == MODES[-1] and not v.auto and v.stats.frames == 3 and not v.cancelled
        await pilot.pause()
        assert history.selected is v  # the newest row is selected, so Save WAV saves it


async def _without_audio_device_shows_a_notice(tmp_path, monkeypatch):
    from leapvox.app import playback

    monkeypatch.setattr(playback, "output_devices", lambda: [])
    app = LeapvoxApp(model=model(), options=replace(model().defaults, max_frames=2), save_dir=tmp_path)
    monkeypatch.setattr("leapvox.app.tui.app.output_devices", lambda: [])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        assert "audio: off" in app.query_one(ModelInfo).render()
        app.query_one("#text", TextArea).text = "Hi."
        await pilot.press("f5")
        await until(pilot, lambda: len(app.query_one(History).utterances) == 1)
        assert app.query_one(History).utterances[0].playback is None


def test_type_speak_readouts_save_and_snapshot(tmp_path):
    asyncio.run(_type_speak_readouts_save_and_snapshot(tmp_path))


def test_stop_mid_utterance_then_switch_voice(tmp_path):
    asyncio.run(_stop_mid_utterance_then_switch_voice(tmp_path))


def test_without_audio_device_shows_a_notice(tmp_path, monkeypatch):
    asyncio.run(_without_audio_device_shows_a_notice(tmp_path, monkeypatch))


async def _every_mode_fits_its_select(tmp_path):
    app = make_app(tmp_path, max_frames=2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        select, bar = app.query_one("#mode", Select), app.query_one("#voice")
        for mode in MODE_CHOICES:
            select.value = mode
            await pilot.pause()
            label = select.query_one("SelectCurrent #label")
            assert str(label.render()) == mode
            assert label.size.height == 1 and label.content_region.width >= len(mode), (mode, label.size)
        assert select.size.height == 3  # no second line of label inside the border
        assert bar.region.contains_region(app.query_one("#backend", Select).region)  # the row still fits
        lines = app.export_screenshot().replace("&#160;", " ")
    assert "windowed" in lines


def test_every_mode_fits_its_select(tmp_path):
    asyncio.run(_every_mode_fits_its_select(tmp_path))


async def _no_loading_entry_once_the_model_is_ready(tmp_path):
    """Once the model is ready the speaker and language lists hold only its choices: no "(model loading)" entry is
    left to choose (it used to stay, and choosing it spoke as the default speaker)."""
    app = make_app(tmp_path, max_frames=2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not app.query_one("#speak", Button).disabled)
        for name, items in (("speaker", model().config.speakers), ("language", list(model().config.languages))):
            select = app.query_one(f"#{name}", Select)
            assert [v for _, v in select._options] == items and select.value == items[0]
            select.focus()
            await pilot.press("enter", "home", "enter")  # open the list, choose its first entry
            assert select.value == items[0]
        assert "model loading" not in app.export_screenshot()


def test_no_loading_entry_once_the_model_is_ready(tmp_path):
    asyncio.run(_no_loading_entry_once_the_model_is_ready(tmp_path))
