"""The leapvox TUI: type text, pick a voice, mode and backend, speak with live readouts, keep a history; or speak as
you type (F9), each sentence once it is sure (the next one has begun), while you go on typing.

Synthesis runs in a thread worker that checks cancellation every frame and posts messages; the UI thread only
updates widgets (attributes down, messages up). Speaking as you type, the UI thread hands the worker each stretch of
text that has become sure (engine.textfeed) through a queue the worker's stream pulls from.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Button, Footer, Header, TextArea
from textual.worker import get_current_worker

from leapvox.app.common import PieceCleaner, clean_text
from leapvox.app.playback import AudioUnavailable, Player, output_devices
from leapvox.engine.backend import available_backends
from leapvox.engine.errors import LeapvoxError
from leapvox.engine.options import AUTO, MODE_CHOICES, build_options, check_text, validate
from leapvox.engine.textfeed import FLUSH, TextFeed

from .history import History
from .messages import ModelFailed, ModelReady, SpeechFinished, SpeechProgress
from .model_info import ModelInfo
from .palette import Palette
from .readout import Readout
from .utterance import Utterance
from .voice_bar import VoiceBar

PROGRESS_EVERY_S = 0.25  # readout refresh while the last audio plays out


class LeapvoxApp(App):
    CSS_PATH = "leapvox.tcss"
    TITLE = "leapvox"
    BINDINGS = [  # function keys, so that typing in the text area never triggers them (F6/F7 are the text area's)
        Binding("f5", "speak", "Speak", priority=True),
        Binding("f8", "stop", "Stop", priority=True),
        Binding("f2", "save", "Save WAV", priority=True),
        Binding("f9", "toggle_live", "Speak as I type", priority=True),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(
        self,
        model_path: str | None = None,
        *,
        model=None,
        weights: str = "fp32",
        options=None,
        device: int | None = None,
        player_factory: Callable[[int], Player] | None = None,
        save_dir: Path | str = ".",
        backend: str = "cpu",
        compute_units: str = "cpu_and_ne",
        auto=None,
    ):
        """`model` (a LoadedModel) skips loading `model_path`; `options` are the SynthesisOptions to start from
        (the model's defaults otherwise); `player_factory(sample_rate)` replaces the sound-card player; `backend`
        is the one selected at the start (cpu, cuda or ane; ane runs with `compute_units`); `auto` is what
        --mode auto and --weights auto chose for `backend` (a models.auto.Choice; chosen once the model is ready
        where not given)."""
        super().__init__()
        self.model_path, self.model, self.weights, self.options = model_path, model, weights, options
        self.device, self.player_factory, self.save_dir = device, player_factory, Path(save_dir)
        self.audio_off: str | None = None  # why there is no sound, once known
        self.backend = "cpu"  # what runs the model now; the selector's choice is applied before each utterance
        self.first_backend, self.compute_units = backend, compute_units
        self.busy = False
        self.spoken = 0
        self.live: LiveText | None = None  # speaking as the user types: what the worker is handed
        self.auto = {backend: auto} if auto is not None else {}  # backend -> models.auto.Choice, chosen once each

    def compose(self) -> ComposeResult:
        yield Header()
        yield ModelInfo(id="model-info")
        yield TextArea(id="text", placeholder="Type something to say, then press Speak (F5); Stop is F8.")
        with Horizontal(id="controls"):
            offered = available_backends()
            first = (self.first_backend,) if self.first_backend in offered else ()
            yield VoiceBar(MODE_CHOICES, first + tuple(b for b in offered if b not in first), id="voice")
            yield Button("Speak", id="speak", variant="success", disabled=True)
            yield Button("Stop", id="stop", variant="error", disabled=True)
        with Horizontal(id="panels"):
            yield Readout(id="readout")
            yield History(id="history")
        yield Footer()

    def action_command_palette(self) -> None:
        """Ctrl+P: Textual's palette, made safe against keys that arrive while it closes (see palette.py)."""
        if self.use_command_palette and not Palette.is_open(self):
            self.push_screen(Palette(id="--command-palette"))

    def on_mount(self) -> None:
        info = self.query_one(ModelInfo)
        info.path = str(self.model_path or getattr(self.model, "path", "") or "")
        info.audio = self._probe_audio()
        if self.audio_off:
            self.notify(f"{self.audio_off}; utterances go to the history, save them as WAV", severity="warning")
        self.query_one(Readout).border_title = "speed (live)"
        self.query_one(History).border_title = "history"
        self.query_one("#text", TextArea).focus()
        if self.model is not None:
            self.post_message(ModelReady(self.model))
        elif self.model_path:
            self.load_model()
        else:
            info.state = "no model: start with leapvox tui --model PATH"

    def _probe_audio(self) -> str:
        if self.player_factory is not None:
            return "audio: on"
        try:
            if not output_devices():
                raise AudioUnavailable("no audio output device")
        except AudioUnavailable as e:
            self.audio_off = str(e)
            return "audio: off (save utterances as WAV)"
        return "audio: on"

    # ---- model -----------------------------------------------------------------------------------------

    @work(thread=True, group="model", exit_on_error=False)
    def load_model(self) -> None:
        try:
            from leapvox.models.load import load_model

            model = load_model(self.model_path, self.weights)
            self._warm_up(model)
            self.post_message(ModelReady(model))
        except LeapvoxError as e:
            self.post_message(ModelFailed(str(e) + (f" ({e.hint})" if e.hint else "")))
        except Exception as e:  # never stay on "loading..." without a word
            self.post_message(ModelFailed(f"internal error: {type(e).__name__}: {e}"))

    @staticmethod
    def _warm_up(model) -> None:
        """Two frames, unmeasured: the first calls into torch pay one-time costs that would skew first audio."""

        for _ in model.synthesizer().stream("Hello.", replace(model.defaults, max_frames=2)):
            pass

    async def on_model_ready(self, msg: ModelReady) -> None:
        if not self.is_running:  # quitting: the worker's late messages find the widgets gone
            return
        self.model = msg.model
        self.options = self.options or self.model.defaults
        info = self.query_one(ModelInfo)
        info.path, info.state = str(self.model.path), "ready"
        info.auto = self._auto(self.first_backend).line()
        await self.query_one(VoiceBar).set_choices(self._speakers(), list(self.model.config.languages))
        self.query_one("#speak", Button).disabled = False

    def _speakers(self) -> list[str]:
        """The speaker choices: a CustomVoice model's speakers, a Base model's saved voices (leapvox voices add)."""
        if self.model.model_type != "base":
            return list(self.model.config.speakers)
        from leapvox.models.voices import list_voices, model_key

        return [v.name for v in list_voices(model_key(self.model.path)) if v.mode != "damaged"]

    def on_model_failed(self, msg: ModelFailed) -> None:
        if not self.is_running:  # quitting: the worker's late messages find the widgets gone
            return
        self.query_one(ModelInfo).state = "failed"
        self.notify(msg.error, title="cannot load the model", severity="error", timeout=30)

    # ---- speaking ----------------------------------------------------------------------------------------

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "speak":
            self.action_speak()
        elif event.button.id == "stop":
            self.action_stop()

    def action_speak(self) -> None:
        if self.busy or self.model is None:
            return
        text = clean_text(self.query_one("#text", TextArea).text)  # as `leapvox speak` and the server read text
        try:
            check_text(text)  # empty, or nothing to say ("!!! ???"): said here, before the worker starts
        except LeapvoxError as e:
            self.notify(f"{e}: type some words first", severity="warning")
            return
        chosen = self._chosen()
        if chosen is not None:
            self._set_busy(True)
            self.speak(text, *chosen)

    def _chosen(self):
        """(options, backend, saved voice, whether the mode is auto) as the voice bar sets them, checked by the one
        set of option rules; None (and a notice) when they do not hold: a Base model without a saved voice is told
        now. Mode auto is what it chose (`_auto`)."""
        voice = self.query_one(VoiceBar).voice
        base = self.model.model_type == "base"
        mode = self._auto(voice.backend).mode if voice.mode == AUTO else voice.mode
        state = {"speaker": None if base else voice.speaker or None, "language": voice.language, "mode": mode}
        try:
            opts = validate(build_options(state, self.options), self.model.config,
                            (voice.speaker or None) if base else None)
        except LeapvoxError as e:
            self.notify(str(e) + (f" ({e.hint})" if e.hint else ""), severity="warning")
            return None
        self.query_one(Readout).auto = voice.mode == AUTO
        if voice.mode == AUTO:
            self.query_one(ModelInfo).auto = self._auto(voice.backend).line()
        return opts, voice.backend, voice.speaker if base else None, voice.mode == AUTO

    def _auto(self, backend: str):
        """What mode auto runs on `backend` for the model loaded (models.auto.Choice; its weights are the loaded
        ones): the tune profile's mode on cpu, else ar; chosen once per backend."""
        if backend not in self.auto:
            from leapvox.models.auto import choose

            self.auto[backend] = choose(self.model.path, AUTO, self.model.weights, backend)
        return self.auto[backend]

    def action_toggle_live(self) -> None:
        """Speak as I type: on, what is typed from now on is spoken sentence by sentence; off, the rest is spoken."""
        if self.live is not None:
            self._hand_over(final=True)
            return
        if self.busy or self.model is None:
            self.notify("wait for the model and for the utterance in progress", severity="warning")
            return
        chosen = self._chosen()
        if chosen is None:
            return
        area = self.query_one("#text", TextArea)
        self.live = LiveText(len(area.text))
        area.border_title = "speaking as you type: each sentence once the next begins (F9: off, speak the rest)"
        self._set_busy(True)
        self.speak(self.live, *chosen)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if self.live is not None:
            self._hand_over()

    def _hand_over(self, final: bool = False) -> None:
        """Give the worker the typed text that has become sure (all of it when `final`, which ends the input)."""
        live, text = self.live, self.query_one("#text", TextArea).text
        live.start = min(live.start, len(text))  # deleted back into what was handed over: go on from there
        rest = text[live.start :]
        feed = TextFeed()
        feed.feed(rest)
        sure = len(rest) if final else feed.offset
        piece = PieceCleaner()(rest[:sure], final=True)  # as clean_text cleans (a sure stretch ends at a word's end)
        if piece.strip():
            live.put(piece)
        live.start += sure
        if final:
            live.close()
            self.live = None
            self.query_one("#text", TextArea).border_title = None

    def action_stop(self) -> None:
        self.workers.cancel_group(self, "speak")
        if self.live is not None:  # the worker may be waiting for text: let it see the end
            self.live.close()
            self.live = None
            self.query_one("#text", TextArea).border_title = None

    def on_unmount(self) -> None:
        if self.live is not None:
            self.live.close()

    def action_save(self) -> None:
        selected = self.query_one(History).selected
        if selected is not None:
            self.post_message(History.SaveRequested(selected))

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.query_one("#speak", Button).disabled = busy
        self.query_one("#stop", Button).disabled = not busy

    @work(thread=True, exclusive=True, group="speak", exit_on_error=False)
    def speak(self, text: str | LiveText, opts, backend: str, saved_voice: str | None = None,
              auto: bool = False) -> None:
        """Speak `text`, or, a LiveText, what the user types as it is handed over (one utterance in the history;
        the player is ended while the worker waits for text, so a pause in the typing is no underrun)."""
        worker = get_current_worker()
        player, audio, stats = None, [], None
        live = text if isinstance(text, LiveText) else None
        try:
            self._use_backend(backend)
            player = self._open_player()
            cloned = self._cloned_voice(saved_voice)
            synth = self.model.synthesizer()
            if live is not None:
                live.waiting = lambda: player.end() if player is not None else None
            chunks = synth.stream(text, opts, cancelled=lambda: worker.is_cancelled, voice=cloned) if live is None \
                else synth.stream_text(live, opts, cancelled=lambda: worker.is_cancelled, voice=cloned)
            for chunk in chunks:
                audio.append(chunk.audio)
                stats = chunk.stats
                if live is not None and live.paused and len(chunk.audio):  # after a pause in the typing
                    live.paused = False
                    if player is not None:  # a new player, once the old one has played out
                        self._play_out(player, worker, stats)
                        player.close()
                        player = self._open_player()
                if player is not None:
                    player.feed(chunk.audio, stats.xrt, stats.est_remaining_s)
                self.post_message(SpeechProgress(stats, player.stats if player else None))
            if player is not None:
                self._play_out(player, worker, stats)
        except LeapvoxError as e:  # (none when speaking as you type ended before a word was typed)
            error = None if live is not None and not live.said else str(e) + (f" ({e.hint})" if e.hint else "")
            self.post_message(SpeechFinished(None, error=error))
            return
        except Exception as e:  # keep the UI alive; say what happened
            self.post_message(SpeechFinished(None, error=f"internal error: {type(e).__name__}: {e}"))
            return
        finally:
            if player is not None:
                player.close()
        self.spoken += 1
        wav = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        speaker = opts.speaker or saved_voice or (self.model.config.speakers or ["-"])[0]
        said = text if live is None else " ".join(live.said.split())
        utterance = Utterance(self.spoken, said, speaker, opts.language, opts.mode, backend, wav,
                              self.model.sample_rate, stats, player.stats if player else None, worker.is_cancelled,
                              auto)
        self.post_message(SpeechFinished(utterance, cancelled=worker.is_cancelled))

    def _cloned_voice(self, name: str | None):
        """The saved voice `name` of a Base model (None: not a Base model)."""
        if name is None:
            return None
        from leapvox.models.voices import load_voice, model_key

        return load_voice(model_key(self.model.path), name, self.model.config.talker.hidden_size)

    def _play_out(self, player: Player, worker, stats) -> None:
        """Let the buffered audio play to the end, still answering Stop and refreshing the readout."""
        player.end()
        while not player.wait(PROGRESS_EVERY_S):
            if worker.is_cancelled:
                player.stop()
                return
            self.post_message(SpeechProgress(stats, player.stats))

    def _open_player(self) -> Player | None:
        if self.audio_off is not None and self.player_factory is None:
            return None
        try:
            factory = self.player_factory or (lambda sr: Player(sr, self.device))
            return factory(self.model.sample_rate).start()
        except AudioUnavailable as e:
            self.audio_off = str(e)
            self.call_from_thread(self.notify, f"{e}; utterances go to the history only", severity="warning")
            return None

    def _use_backend(self, backend: str) -> None:
        if backend != self.backend:
            import torch

            device = torch.device("cpu" if backend == "ane" else backend)  # ane: host lookups on the CPU
            self.model.tts.to(device)
            self.model.codec.to(device)
            ane = None
            if backend == "ane":  # the Core ML functions of the model's export (an error names the command)
                from leapvox.models.coreml_assets import load_ane_backend

                ane = load_ane_backend(self.model.path, self.model.tts.talker, self.compute_units)
            self.model, self.backend = replace(self.model, backend=ane), backend

    def on_speech_progress(self, msg: SpeechProgress) -> None:
        if not self.is_running:  # quitting: the worker's late messages find the widgets gone
            return
        readout = self.query_one(Readout)
        readout.stats, readout.playback = msg.stats, msg.playback

    def on_speech_finished(self, msg: SpeechFinished) -> None:
        if not self.is_running:  # quitting: the worker's late messages find the widgets gone
            return
        self._set_busy(False)
        if msg.error:
            self.notify(msg.error, title="synthesis failed", severity="error", timeout=15)
            return
        if msg.utterance is None:  # speaking as you type, switched off with nothing typed
            return
        u = msg.utterance
        self.query_one(History).add(u)
        readout = self.query_one(Readout)
        readout.stats, readout.playback, readout.auto = u.stats, u.playback, u.auto
        if msg.cancelled:
            self.notify(f"stopped after {u.duration_s:.2f} s of audio")
        for w in u.stats.warnings:
            self.notify(w, severity="warning")

    def on_history_save_requested(self, msg: History.SaveRequested) -> None:
        if not self.is_running:  # quitting: the worker's late messages find the widgets gone
            return
        from leapvox.app.audio import write_wav

        u = msg.utterance
        try:
            path = write_wav(self.save_dir / u.file_name, u.audio, u.sample_rate)
        except OSError as e:
            self.notify(f"cannot save {u.file_name}: {e.strerror or e}", severity="error")
            return
        self.notify(f"saved {path}")


class LiveText:
    """What the user types while speaking as they type, for the worker's stream (Synthesizer.stream_text): the UI
    thread `put`s each stretch that has become sure, with a FLUSH after it, and `close`s it; the worker iterates it
    (blocking) and calls `waiting()` (and sets `paused`) each time it has said everything handed over so far.
    `start`: where in the text area the text not handed over yet begins."""

    def __init__(self, start: int):
        self.start, self.said, self.waiting, self.paused = start, "", lambda: None, False
        self._q: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, text: str) -> None:
        self.said += text
        self._q.put(text)
        self._q.put(FLUSH)

    def close(self) -> None:
        self._q.put(None)

    def __iter__(self):
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                self.paused = True
                self.waiting()
                item = self._q.get()
            if item is None:
                return
            yield item
