"""`leapvox serve`'s speech stream: `WS /v1/audio/speech/stream`, text in as it is written, audio out as it is made.

The protocol, one WebSocket per stream of speech (every JSON message an object with a "type"):
  client -> server  first the settings: the fields of `POST /v1/audio/speech` less `input` (`model`, `voice`,
                    `response_format` pcm or wav (the default), `instructions`, `seed`, `mode`, `language`; "type":
                    "settings" may be given), checked by the same code; then {"type": "text", "text": "..."} (pieces
                    cut anywhere), {"type": "flush"} (speak the open sentence now), {"type": "cancel"} (drop what is
                    buffered, stop the audio at the next frame; the stream stays open) and {"type": "close"} (speak
                    what is left, then end).
  server -> client  {"type": "session.started", ...}, then binary frames of audio (16-bit 24 kHz mono PCM; with wav
                    the first one starts with a streaming WAV header) among JSON events, in order: "sentence.started"
                    (index, text), its audio, "sentence.finished" (index, text, finish_reason) and "stats" (the turn's
                    numbers so far) once the speech has gone past it (the next sentence starts, or the turn ends),
                    "cancelled" once a cancel has taken effect, "done" (finish_reason, sentences) before the server
                    closes (1000), and "error" ({"type": "error", "error": OpenAI's {message, type, param, code}})
                    before it closes on an error (1008 for a client's mistake, 1013 busy, 1011 the server's fault).

Why it looks like this. Settings once, then bare text: an LLM's deltas go in as they come, without repeating
anything. A sentence is spoken as soon as it is sure (engine.textfeed: its end and the start of the next, or a
flush), with one random stream and crossfades across the stream, so the audio equals `POST`'s for the same text and
seed; `flush` is for a caller who knows that the text has paused (a chat line, a game's cue), `close` for the end of
a reply. Cancel keeps the connection: a voice assistant that is interrupted goes on with its next reply.

The rules of `POST /v1/audio/speech`: the API key (the header; a browser, which cannot set headers, offers the
subprotocols "leapvox.v1" and "bearer.KEY" (only "leapvox.v1" is echoed): a query parameter would put the key in
logs), and without a key a handshake from a web page (an Origin header) is refused unless the page is on this
machine, so that a site visited in a browser cannot drive a keyless local server. --max-input caps the characters of
a whole stream; at most --queue + 1 streams are open (one speaking, each other with at most one turn waiting, so
streams alone never fill the queue; more get 429 before the upgrade). The one worker: a stream takes a turn in the
queue when it has sure text and keeps the worker while text keeps coming; once it has said all it was given it gives
the worker up as soon as another request waits (after HOLD_S, so that a producer pausing between two tokens is not
sent to the back), and its next text takes a new turn (one random stream per turn). A stream with nothing to say that
sends nothing for IDLE_S is closed. A disconnect or a cancel stops the synthesis between two frames; a server
stopping closes streams at once (1012).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from urllib.parse import urlparse

from leapvox.engine.errors import InputError
from leapvox.engine.textfeed import FLUSH, TextFeed

from .common import PieceCleaner
from .serve_queue import Job, QueueFull, ShuttingDown
from .serve_request import ApiError, api_error_of, check_key, is_loopback, parse_stream_settings

PROTOCOL = "leapvox.v1"
STREAM_FORMATS = ["pcm", "wav"]
SETTINGS_S = 10.0  # the settings message must come this soon after the handshake
IDLE_S = 60.0  # a stream with nothing to say that sends nothing for this long is closed
HOLD_S = 1.0  # a stream that has said everything keeps the worker this long at most while another request waits
# a fatal error's close code: the client's mistake (policy), busy (try again later), the server's fault or its stop
CLOSE_CODES = {"invalid_request_error": 1008, "rate_limit_error": 1013, "server_error": 1011, "shutting_down": 1001}


class Turn:
    """What one turn of a stream gives the worker, fed from the event loop: sure sentences (and pause tags) with a
    FLUSH after each batch, so the synthesis speaks each at once. Iterated (blocking) by the worker; once everything
    given has been spoken and `contended()` has held for HOLD_S, or on `close()`, the iteration ends and so does the
    turn (a later `put` returns False: the stream takes a new turn)."""

    def __init__(self, contended, hold_s: float = HOLD_S):
        self._cv, self._items, self.contended, self.hold_s = threading.Condition(), deque(), contended, hold_s
        self.closed = self.ended = self.started = self.waiting = False
        self.sentences: list[str] = []  # what it was given to say, pauses aside (the synthesis numbers them so)

    def put(self, texts: list[str], sentences: list[str]) -> bool:
        with self._cv:
            if self.ended:
                return False
            self._items.extend([*texts, FLUSH])
            self.sentences += sentences
            self._cv.notify()
            return True

    def said(self, index: int) -> str:
        return self.sentences[index] if index < len(self.sentences) else ""

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify()

    def __iter__(self):
        self.started = True
        while True:
            with self._cv:
                since = None
                while not self._items and not self.closed:
                    self.waiting = True
                    since = None if not self.contended() else since or time.monotonic()
                    if since is not None and time.monotonic() - since >= self.hold_s:
                        break
                    self._cv.wait(0.05)
                self.waiting = False
                if not self._items:
                    self.ended = True
                    return
                item = self._items.popleft()
            yield item


def origin_allowed(origin: str | None) -> bool:
    """Whether a handshake may go on without an API key: no Origin (not a browser), or a page on this machine."""
    if origin is None:
        return True
    host = urlparse(origin).hostname
    return bool(host) and is_loopback(host)


def error_event(e: ApiError) -> dict:
    return {"type": "error", "error": {"message": str(e), "type": e.type, "param": e.param, "code": e.code}}


async def open_stream(ws, state, model, settings, log: logging.Logger) -> None:
    """`WS /v1/audio/speech/stream`: the handshake refused as `POST /v1/audio/speech` refuses (an HTTP error in
    OpenAI's shape), or accepted and the stream run to its end."""
    try:
        check_key(settings, ws)
        if settings.api_key is None and not origin_allowed(ws.headers.get("origin")):
            raise ApiError(403, "a web page may use this server only with an API key (set LEAPVOX_API_KEY)",
                           code="origin_not_allowed")
        if state.queue is None or state.queue.closing:
            raise api_error_of(ShuttingDown())
        if len(state.streams) > settings.queue:
            raise ApiError(429, f"the server is busy: {len(state.streams)} speech streams are open, the limit",
                           type="rate_limit_error", code="too_many_streams", headers={"Retry-After": "5"})
    except ApiError as e:
        try:
            await ws.send_denial_response(e.response())
        except RuntimeError:  # a server without denial responses: the handshake fails without a body
            await ws.close(1008)
        return
    await ws.accept(subprotocol=PROTOCOL if PROTOCOL in ws.scope.get("subprotocols", ()) else None)
    stream = SpeechStream(ws, state, model, settings, log)
    state.streams.add(stream)
    try:
        await stream.run()
    finally:
        state.streams.discard(stream)


class SpeechStream:
    """One WebSocket's session: `_read` takes the client's messages and hands sure sentences to the worker, turn by
    turn; `_write` sends the worker's audio and the events, in order, from one queue (`out`)."""

    def __init__(self, ws, state, model, settings, log: logging.Logger):
        self.ws, self.state, self.model, self.settings, self.log = ws, state, model, settings, log
        self.out: asyncio.Queue = asyncio.Queue()  # (job or None, kind, value)
        self.feed, self.clean = TextFeed(), PieceCleaner()  # the text so far; escape sequences out, as read_text does
        self.job = self.turn = self.cancelling = None  # the current turn and its job; a cancelled job not yet ended
        self.chars = self.said = 0  # characters received; sentences finished (the next one's index)
        self.closing, self.reason, self.heard = False, "", time.monotonic()

    async def run(self) -> None:
        from starlette.websockets import WebSocketDisconnect

        writer = asyncio.ensure_future(self._write())
        try:
            await self._read()
        except WebSocketDisconnect:
            writer.cancel()
        except ApiError as e:
            self.out.put_nowait((None, "fatal", e))
        except Exception as e:  # a fault of ours: said in the log, and to the client without a traceback
            self.log.error("speech stream failed: %s: %s: %s", getattr(self, "summary", "stream"), type(e).__name__, e)
            self.out.put_nowait((None, "fatal", ApiError(500, "internal error (see the server's log)",
                                                         type="server_error")))
        finally:
            if self.job is not None:
                self.job.cancel()  # a disconnect or an error: stop between two frames (no effect once it ended)
                self.turn.close()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await writer

    # ---- the client's messages ----------------------------------------------------------------------------

    async def _message(self, timeout: float | None = None) -> dict | None:
        """The next message (None for any once the stream is closing); WebSocketDisconnect when the client has gone;
        ApiError for a message that is not one, or after `timeout` (IDLE_S while there is nothing to say)."""
        from starlette.websockets import WebSocketDisconnect

        receiving = asyncio.ensure_future(self.ws.receive())
        try:
            while not (await asyncio.wait({receiving}, timeout=1.0))[0]:
                waited = time.monotonic() - self.heard
                if timeout is not None and waited > timeout:
                    raise ApiError(408, f"no settings came within {timeout:.0f} s", code="timeout")
                if waited > IDLE_S and self._idle():
                    raise ApiError(408, f"nothing to say and nothing came for {IDLE_S:.0f} s", code="idle_timeout")
        finally:
            receiving.cancel()
        message, self.heard = receiving.result(), time.monotonic()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if self.closing:
            return None
        if message.get("text") is None:
            raise ApiError(400, "send JSON text messages; audio only goes the other way", code="invalid_message")
        try:
            value = json.loads(message["text"])
        except ValueError as e:
            raise ApiError(400, f"a message is not valid JSON ({e})", code="invalid_json") from None
        if not isinstance(value, dict):
            raise ApiError(400, "a message must be a JSON object with a 'type'", "type", "invalid_message")
        return value

    def _idle(self) -> bool:
        """Nothing to say: no turn, or one that has said everything it was given (not one waiting in the queue)."""
        return self.turn is None or self.turn.ended or (self.turn.started and self.turn.waiting)

    async def _read(self) -> None:
        from .audio import Encoder

        first = await self._message(SETTINGS_S)
        _, self.opts, fmt, self.voice = parse_stream_settings(first, self.model, self.settings, STREAM_FORMATS)
        self.encoder = Encoder(fmt, self.model.sample_rate)
        who = self.opts.speaker if self.voice is None else "(saved)"
        self.summary = f"stream, voice {who}, {fmt}"
        self._event({"type": "session.started", "model": self.settings.model_id, "voice": who,
                     "response_format": fmt, "sample_rate": self.model.sample_rate,
                     "max_input": self.settings.max_input})
        while True:
            message = await self._message()
            kind = None if message is None else message.get("type")
            try:
                if kind == "text":
                    self._speak(self.feed.feed(self.clean(self._text(message))))
                elif kind == "flush":
                    self._speak(self.feed.feed(self.clean("", final=True)) + self.feed.flush())
                elif kind == "close":
                    self._speak(self.feed.feed(self.clean("", final=True)) + self.feed.close())
                    self._close()
            except InputError as e:  # a malformed pause tag
                raise ApiError(400, str(e), "text", "invalid_markup") from None
            if kind == "cancel":
                self._cancel()
            elif message is not None and kind not in ("text", "flush", "close"):
                raise ApiError(400, f"unknown message type {str(kind)[:40]!r}; send text, flush, cancel or close",
                               "type", "invalid_message")

    def _text(self, message: dict) -> str:
        text = message.get("text")
        if not isinstance(text, str):
            raise ApiError(400, "'text' must be a string", "text")
        if "\0" in text:
            raise ApiError(400, "'text' contains a NUL character", "text")
        self.chars += len(text)
        if self.chars > self.settings.max_input:
            raise ApiError(413, f"the stream's text is over {self.settings.max_input} characters, the limit "
                           "(--max-input)", "text", "input_too_long")
        return text

    def _speak(self, segments) -> None:
        """Hand sure sentences (and pauses) to the worker: to the running turn, else to a new one in the queue."""
        sentences = [s for s in segments if isinstance(s, str)]
        texts = [s if isinstance(s, str) else f"[pause {round(s.seconds * 1000)}ms]" for s in segments]
        if not sentences:  # pauses alone wait for the sentence they come before
            return
        if self.turn is not None and self.turn.put(texts, sentences):
            return
        queue, loop = self.state.queue, asyncio.get_running_loop()
        self.turn = Turn(lambda: queue.waiting > 0)
        self.turn.put(texts, sentences)
        job = Job(self.turn, self.opts, self.encoder, None, self.summary, self.voice, events=True)
        job.deliver = lambda item: loop.call_soon_threadsafe(self.out.put_nowait, (job, *item))
        try:
            queue.submit(job)
        except ShuttingDown as e:
            raise api_error_of(e) from None
        except QueueFull as e:
            raise ApiError(429, str(e), type="rate_limit_error", code="queue_full") from None
        self.job = job

    def _cancel(self) -> None:
        """Drop what is buffered and stop the audio at the next frame; "cancelled" goes out after the last of it."""
        self.feed, self.clean = TextFeed(), PieceCleaner()
        if self.job is None:
            self._event({"type": "cancelled"})
            return
        self.cancelling, self.job = self.job, None
        self.cancelling.cancel()
        self.turn.close()
        self.turn = None

    def _close(self) -> None:
        """Speak what is left, then "done"."""
        self.closing = True
        if self.job is not None:
            self.turn.close()
        elif self.cancelling is None:
            self._event(self._done())

    def _event(self, event: dict) -> None:
        self.out.put_nowait((None, "event", event))

    def _done(self) -> dict:
        return {"type": "done", "finish_reason": self.reason or "empty", "sentences": self.said}

    # ---- what goes out ------------------------------------------------------------------------------------

    async def _write(self) -> None:
        index = spoken = None  # the turn's sentence started last (the synthesis's numbering); its sentences finished
        while True:
            job, kind, value = await self.out.get()
            if kind == "event":
                await self.ws.send_json(value)
                if value["type"] == "done":
                    return await self.ws.close(1000)
            elif kind in ("fatal", "error"):
                e = value if kind == "fatal" else api_error_of(value)
                if kind == "error":
                    self.log.error("speech failed: %s: %s: %s", self.summary, type(value).__name__, value)
                await self.ws.send_json(error_event(e))
                return await self.ws.close(CLOSE_CODES.get(e.code, CLOSE_CODES.get(e.type, 1011)))
            elif kind == "chunk":
                chunk, data = value
                if chunk.sentence != index:  # a new sentence: the ones before it have ended (their audio is out)
                    spoken = await self._finished(job.text, chunk.stats, spoken or 0)
                    index = chunk.sentence
                    await self.ws.send_json({"type": "sentence.started", "index": self.said,
                                             "text": job.text.said(index)})
                if data:
                    await self.ws.send_bytes(data)
                spoken = await self._finished(job.text, chunk.stats, spoken)
            elif kind == "data":  # a WAV's header, when a turn ends before any audio
                await self.ws.send_bytes(value)
            elif kind == "end":  # the turn is over: spoken, given up to another request, or cancelled
                spoken = await self._finished(job.text, value, spoken or 0)
                if index is not None and spoken <= index:  # cut short by a cancel before its end was handed out
                    await self._finished(job.text, None, spoken, "cancelled")
                index = spoken = None
                if job is self.cancelling:
                    self.cancelling, self.reason = None, "cancelled"
                    await self.ws.send_json({"type": "cancelled"})
                elif job is self.job:
                    self.job = self.turn = None
                if self.closing and self.job is None and self.cancelling is None:
                    await self.ws.send_json(self._done())
                    return await self.ws.close(1000)

    async def _finished(self, turn: Turn, stats, spoken: int, reason: str | None = None) -> int:
        """sentence.finished and stats for each sentence of `turn` after the first `spoken` that `stats` says has
        ended (or the next one, ended for `reason`); how many have ended now."""
        for why in (stats.stop_reasons[spoken:] if stats is not None else ()) or ((reason,) if reason else ()):
            self.reason = why
            await self.ws.send_json({"type": "sentence.finished", "index": self.said,
                                     "text": turn.said(spoken), "finish_reason": why})
            if stats is not None:
                await self.ws.send_json({"type": "stats", "index": self.said, "frames": stats.frames,
                                         "audio_s": round(stats.audio_s, 3), "elapsed_s": round(stats.elapsed_s, 3),
                                         "xrt": round(stats.xrt, 3), "first_audio_s": stats.first_audio_s})
            spoken, self.said = spoken + 1, self.said + 1
        return spoken
