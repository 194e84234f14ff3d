"""`leapvox serve`: a local speech server speaking OpenAI's audio API (`POST /v1/audio/speech`, `GET /v1/models`,
`GET /v1/audio/voices`, `GET /health`) over the one synthesis stream, on Starlette + uvicorn; and a WebSocket that
speaks text as it arrives (`/v1/audio/speech/stream`, serve_stream.py).

One model, loaded once; one worker thread synthesises one request at a time from a bounded queue (serve_queue.py).
Audio goes out as it is produced (chunked; WAV with a streaming header). A client that disconnects stops its
synthesis between two frames. Errors use OpenAI's JSON shape. Safe by default: loopback only unless an API key is
set, the key compared in constant time, bodies and inputs capped, no request text in the log unless --log-text."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from leapvox.engine.errors import LeapvoxError

from .common import (
    EXIT_OK,
    UsageError,
    backend_args,
    choose,
    load,
    model_args,
    open_model,
    quiet_or,
    require_model,
    tell,
)
from .serve_request import (
    ApiError,
    Settings,
    api_error_of,
    check_key,
    is_loopback,
    parse_speech,
    read_body,
    saved_voices,
)

DEFAULT_PORT = 8880
KEY_ENV = "LEAPVOX_API_KEY"
CUT_S = 3.0  # after --grace, streams still running are ended; connections still open after this much more are closed


def add_commands(sub) -> None:
    s = sub.add_parser(
        "serve", help="a local speech server speaking OpenAI's audio API (POST /v1/audio/speech), streaming",
        description="Serve one model over HTTP in OpenAI's audio API shape: POST /v1/audio/speech (wav, pcm and "
        "opus stream as they are produced; flac and mp3 are sent when synthesis ends), GET /v1/models, "
        "GET /v1/audio/voices, GET /health; and WS /v1/audio/speech/stream, text in as it is written (an LLM's "
        "deltas), audio out sentence by sentence (the protocol: README, or app/serve_stream.py). One request is "
        "synthesised at a time; others wait in a bounded queue (429 with Retry-After when it is full). A request's "
        "mode (leapvox's own field: auto, ar, spec, windowed) defaults to auto: the mode leapvox tune chose for this "
        "model here, else ar; --weights auto follows the same profile. GET /health says what auto chose and why.",
        epilog="examples:\n  leapvox serve\n"
        "  LEAPVOX_API_KEY=secret leapvox serve --host 0.0.0.0 --model qwen3-tts-0.6b\n"
        "  curl localhost:8880/v1/audio/speech -d '{\"model\": \"demo\", \"input\": \"Hello.\", "
        "\"response_format\": \"wav\"}' -o hello.wav",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_args(s)
    backend_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only); any other address needs an "
                   "API key")
    s.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one and says which)")
    s.add_argument("--api-key", default=os.environ.get(KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default ${KEY_ENV}; the variable keeps the key "
                   "out of the process list)")
    s.add_argument("--queue", type=int, default=8, metavar="N",
                   help="requests that may wait while one is synthesised; more get 429 (default 8); at most N + 1 "
                   "speech streams are open")
    s.add_argument("--max-input", type=int, default=4096, metavar="CHARS",
                   help="longest input (and instructions) in characters, and the most one speech stream may send; "
                   "longer gets 413 (default 4096, as OpenAI)")
    s.add_argument("--max-frames", type=int,
                   help="stop each sentence after N frames of 80 ms (the runaway guard applies as well)")
    s.add_argument("--grace", type=float, default=10.0, metavar="S",
                   help="on SIGINT/SIGTERM, seconds to let running requests finish before cutting them (default 10)")
    s.add_argument("--log-text", action="store_true", help="write each request's text to the log (off by default)")
    s.set_defaults(func=cmd_serve)


def check_serve_args(args) -> None:
    """Everything that can be refused before the slow model load: the bind, the limits, the installed stack."""
    if not is_loopback(args.host) and not args.api_key:
        raise UsageError(f"refusing to listen on {args.host} without an API key: anyone who can reach it could use "
                         "this machine", hint=f"set {KEY_ENV}=... (or --api-key), or keep the default --host 127.0.0.1")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    for flag, value, low in (("--queue", args.queue, 1), ("--max-input", args.max_input, 1),
                             ("--max-frames", args.max_frames, 1), ("--grace", args.grace, 0)):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UsageError(f"the server needs {e.name}, which is not installed",
                         hint='pip install "leapvox[serve]"') from None


def model_id(name: str) -> str:
    """The id clients send as `model`: the --model value, or a checkpoint folder's name."""
    path = Path(name).expanduser()
    return path.name if path.is_dir() else name


class SpeechResponse:
    """The ASGI response of one queued job: its status waits for the job's first bytes (so an error that comes
    before any audio still gets its status), then audio goes out as the worker delivers it. A disconnect, noticed
    while waiting or while sending, cancels the job at once. `cut()` (the server stopping) ends it after what has
    been delivered: a complete response, its audio cut short (or a 503 before any audio)."""

    def __init__(self, job, items: asyncio.Queue, headers: dict, log: logging.Logger, live: set):
        self.job, self.items, self.headers, self.log, self.live = job, items, headers, log, live
        self.sent = 0  # bytes of audio sent (a WAV's header included)

    def cut(self) -> None:
        self.items.put_nowait(("cut", None))

    async def __call__(self, scope, receive, send) -> None:
        import anyio

        self.scope = scope
        self.live.add(self)
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    self.job.cancel()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                try:
                    await self._send(send)
                finally:
                    self.job.cancel()  # no effect once the worker has finished it
                    tg.cancel_scope.cancel()
        except asyncio.CancelledError:  # not ended even CUT_S after the grace (a client not reading): closed as it is
            self.log.warning("speech cut: the server stopped with its response unfinished (%d bytes sent): %s",
                             self.sent, self.job.summary)
        finally:
            self.live.discard(self)

    async def _send(self, send) -> None:
        from .serve_queue import ShuttingDown

        kind, value = await self.items.get()
        if kind == "cut":  # the server is stopping and nothing has gone out yet (mp3 and flac come at the end)
            self.log.warning("speech cut before its audio: the server is stopping and the grace period is over: %s",
                             self.job.summary)
            await api_error_of(ShuttingDown()).response()(self.scope, None, send)
            return
        if kind == "error":
            self._log_failure(value)
            await api_error_of(value).response()(self.scope, None, send)
            return
        headers = [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while kind == "data":
            await send({"type": "http.response.body", "body": value, "more_body": True})
            self.sent += len(value)
            kind, value = await self.items.get()
        if kind == "error":  # after audio went out: cut the stream, so the client sees it incomplete
            self._log_failure(value)
            return
        if kind == "cut":  # the server is stopping: end the stream where it is, as a complete response
            self.log.warning("speech cut: the server is stopping and the grace period is over; the stream ended "
                             "after %d bytes: %s", self.sent, self.job.summary)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _log_failure(self, e: Exception) -> None:
        from .serve_queue import ShuttingDown

        if isinstance(e, ShuttingDown):
            self.log.info("speech refused: %s: %s", e, self.job.summary)
        elif not isinstance(e, LeapvoxError) and os.environ.get("LEAPVOX_DEBUG"):
            self.log.exception("speech failed: %s", self.job.summary, exc_info=e)
        else:
            self.log.error("speech failed: %s: %s: %s", self.job.summary, type(e).__name__, e)


# ---- the app ------------------------------------------------------------------------------------------------


def build_app(model, settings: Settings, log: logging.Logger | None = None):
    """The Starlette app serving `model` (a models.checkpoint.LoadedModel)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute

    from .audio import Encoder, supported_formats
    from .serve_queue import Job, QueueFull, ShuttingDown, SpeechQueue

    log = log or logging.getLogger("leapvox.serve")
    formats = supported_formats()
    # being sent: SpeechResponses, SpeechStreams; the longest WebSocket message
    state = SimpleNamespace(queue=None, responses=set(), streams=set(), max_message=settings.max_body)
    cfg = model.config

    def guarded(handler):
        async def endpoint(request):
            try:
                check_key(settings, request)
                return await handler(request)
            except ApiError as e:
                return e.response()
        return endpoint

    async def health(request):
        q = state.queue
        auto = {"mode": settings.auto_mode, "why": settings.auto_why}
        return JSONResponse({"status": "ok", "model": settings.model_id, "weights": model.weights,
                             "backend": model.backend_name, "auto": auto, "busy": q.busy, "queue_depth": q.waiting,
                             "queue_limit": q.max_waiting, "streams": len(state.streams), **vars(q.counters),
                             "last": q.last})

    async def models(request):
        return JSONResponse({"object": "list", "data": [_model_card(settings)]})

    async def one_model(request):
        if request.path_params["name"] != settings.model_id:
            raise ApiError(404, f"the model {request.path_params['name'][:60]!r} is not served here", "model",
                           "model_not_found")
        return JSONResponse(_model_card(settings))

    async def voices(request):
        data = [{"id": name, "object": "audio.voice", "name": name, "type": "speaker",
                 "dialect": cfg.talker.spk_is_dialect.get(name) or None} for name in cfg.speakers]
        data += [{"id": name, "object": "audio.voice", "name": name, "type": "saved"} for name in saved_voices(model)]
        return JSONResponse({"object": "list", "data": data, "languages": cfg.languages,
                             "instructions": cfg.supports_instruct, "response_formats": formats})

    async def speech(request):
        body = await read_body(request, settings.max_body)
        try:
            req = json.loads(body)
        except ValueError as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
        text, opts, fmt, voice = parse_speech(req, model, settings, formats)
        loop, items = asyncio.get_running_loop(), asyncio.Queue()
        encoder = Encoder(fmt, model.sample_rate)
        who = opts.speaker if voice is None else "(saved)"
        summary = f"voice {who}, {fmt}, {len(text)} chars" + (f", text {text!r}" if settings.log_text else "")
        job = Job(text, opts, encoder, lambda item: loop.call_soon_threadsafe(items.put_nowait, item), summary, voice)
        try:
            state.queue.submit(job)
        except ShuttingDown as e:
            raise api_error_of(e) from None
        except QueueFull as e:
            raise ApiError(429, str(e), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        headers = {"Content-Type": encoder.content_type, "Cache-Control": "no-store",
                   "X-Sample-Rate": str(model.sample_rate)}
        return SpeechResponse(job, items, headers, log, state.responses)

    async def speech_stream(ws):
        from .serve_stream import open_stream

        await open_stream(ws, state, model, settings, log)

    async def http_error(request, exc: HTTPException):
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                        code="not_found" if exc.status_code == 404 else None).response()

    async def internal_error(request, exc: Exception):
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return ApiError(500, "internal error (see the server's log)", type="server_error").response()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.queue = SpeechQueue(model.synthesizer(), settings.queue, log)
        try:
            yield
        finally:
            state.queue.close()

    routes = [
        Route("/health", health),
        Route("/v1/models", guarded(models)),
        Route("/v1/models/{name:path}", guarded(one_model)),
        Route("/v1/audio/voices", guarded(voices)),
        Route("/v1/audio/speech", guarded(speech), methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: internal_error})
    app.state.leapvox = state
    return app


def _model_card(settings: Settings) -> dict:
    return {"id": settings.model_id, "object": "model", "created": 0, "owned_by": "leapvox"}


def make_logger() -> logging.Logger:
    log = logging.getLogger("leapvox.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def listen(host: str, port: int):
    """The listening socket, bound before the model loads so that a taken port fails first. Its protocol is said to
    be TCP, so that asyncio sets TCP_NODELAY on each connection (it does only where the socket's proto says so, and
    create_server leaves it 0): without it, a message written right after another one (an event, then audio) waited
    for the client's delayed ACK, about 40 ms."""
    import socket

    try:
        sock = socket.create_server((host.strip("[]"), port), backlog=128)
        return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    except OSError as e:
        raise LeapvoxError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                           hint="pick another --port (0 picks a free one)" if port else None) from None


def load_on_own_thread(args, folder=None, weights: str | None = None):
    """The model, loaded on a thread that has ended when this returns. torch's OpenMP runtime (libgomp) keeps a
    pool of threads for each thread that ran parallel work, and while its pools hold more threads than there are
    CPUs it sleeps between parallel regions instead of spin-waiting: after a load on the main thread, synthesis on
    the worker thread was much slower than `leapvox speak` on an otherwise idle machine. The loader's pool ends with
    it, so the worker's is the only one, as in `speak`."""
    out = {}

    def run() -> None:
        try:
            out["model"] = load(args, model=folder, pull=True, say=quiet_or(args), weights=weights)
        except BaseException as e:  # raised again on the main thread (a one-line error there)
            out["error"] = e

    thread = threading.Thread(target=run, name="leapvox-load", daemon=True)  # daemon: Ctrl-C does not wait for it
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["model"]


def cmd_serve(args) -> int:

    check_serve_args(args)
    require_model(args)
    sock = listen(args.host, args.port)
    try:
        folder = open_model(args, pull=True, say=quiet_or(args))
        choice = choose(args, folder, "auto")  # a request's mode auto, and --weights auto: once, before the load
        model = load_on_own_thread(args, folder, choice.weights)
        settings = Settings(model_id(args.model), args.api_key, args.queue, args.max_input, args.max_frames,
                            args.log_text, choice.mode, choice.why)
        app = build_app(model, settings, make_logger())
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
        tell(f"serving {settings.model_id} ({model.weights}, {model.backend_name}) at {url} (queue {args.queue}, "
             f"API key {'required' if args.api_key else 'off'}; Ctrl-C stops)")
        tell(f"requests' mode {choice.line()}")
        if not any(importlib.util.find_spec(name) for name in ("websockets", "wsproto")):
            tell("the speech stream (WS /v1/audio/speech/stream) is off: uvicorn needs websockets "
                 '(pip install "leapvox[serve]")')
        server = make_server(app, args.grace)
        server.run(sockets=[sock])
    finally:
        sock.close()
    if server.stopped_by is not None:
        tell(f"stopped ({signal.Signals(server.stopped_by).name})")
    return EXIT_OK if server.started else 1


def _cut_all(responses: set) -> None:
    for response in list(responses):
        response.cut()


def make_server(app, grace: float):
    """A uvicorn server for `app` whose SIGINT/SIGTERM is a graceful stop: waiting requests get 503 at once, running
    ones have `grace` seconds to finish, then their streams are ended where they are (complete responses, the audio
    cut short, each named in the log); then `run` returns (uvicorn itself would re-raise the signal afterwards,
    inside its event loop). A second Ctrl-C stops at once. Speech streams (WebSockets) are closed at once with 1012
    (service restart), their synthesis stopped. WebSocket messages are capped as request bodies are, and not
    compressed (PCM hardly compresses, and zlib would take CPU from the synthesis)."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame) -> None:
            self.stopped_by = self.stopped_by or sig
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            state = getattr(app.state, "leapvox", None)
            if state is not None and state.queue is not None:
                state.queue.refuse_waiting()
                asyncio.get_running_loop().call_later(grace, _cut_all, state.responses)
            await super().shutdown(sockets)

    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"  # messages on stderr, like every command
    config = uvicorn.Config(app, timeout_graceful_shutdown=grace + CUT_S, server_header=False, log_level="info",
                            log_config=log_config, lifespan="on", ws_max_size=app.state.leapvox.max_message,
                            ws_per_message_deflate=False)
    return Server(config)
