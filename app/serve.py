"""`leapvox serve`: a local speech server speaking OpenAI's audio API (`POST /v1/audio/speech`, `GET /v1/models`,
`GET /v1/audio/voices`, `GET /health`) over the one synthesis stream, on Starlette + uvicorn.

One model, loaded once; one worker thread synthesises one request at a time from a bounded queue (serve_queue.py).
Audio goes out as it is produced (chunked; WAV with a streaming header). A client that disconnects stops its
synthesis between two frames. Errors use OpenAI's JSON shape. Safe by default: loopback only unless an API key is
set, the key compared in constant time, bodies and inputs capped, no request text in the log unless --log-text."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from leapvox.engine.errors import InputError, LeapvoxError
from leapvox.engine.options import MODES

from .common import EXIT_OK, UsageError, backend_args, load, model_args, quiet_or, require_model, speak_options, tell

DEFAULT_PORT = 8880
KEY_ENV = "LEAPVOX_API_KEY"
SPEECH_FIELDS = {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format",
                 "mode", "seed", "language"}  # the last three are leapvox's own


def add_commands(sub) -> None:
    s = sub.add_parser(
        "serve", help="a local speech server speaking OpenAI's audio API (POST /v1/audio/speech), streaming",
        description="Serve one model over HTTP in OpenAI's audio API shape: POST /v1/audio/speech (wav, pcm and "
        "opus stream as they are produced; flac and mp3 are sent when synthesis ends), GET /v1/models, "
        "GET /v1/audio/voices, GET /health. One request is synthesised at a time; others wait in a bounded queue "
        "(429 with Retry-After when it is full).",
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
                   help="requests that may wait while one is synthesised; more get 429 (default 8)")
    s.add_argument("--max-input", type=int, default=4096, metavar="CHARS",
                   help="longest input (and instructions) in characters; longer gets 413 (default 4096, as OpenAI)")
    s.add_argument("--max-frames", type=int,
                   help="stop each sentence after N frames of 80 ms (the runaway guard applies as well)")
    s.add_argument("--grace", type=float, default=10.0, metavar="S",
                   help="on SIGINT/SIGTERM, seconds to let running requests finish before cutting them (default 10)")
    s.add_argument("--log-text", action="store_true", help="write each request's text to the log (off by default)")
    s.set_defaults(func=cmd_serve)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_serve_args(args) -> None:
    """Everything that can be refused before the slow model load: the bind, the limits, the installed stack."""
    if not is_loopback(args.host) and not args.api_key:
        raise UsageError(f"refusing to listen on {args.host} without an API key: anyone who can reach it could use "
                         "this machine", hint=f"set {KEY_ENV}=... (or --api-key), or keep the default --host 127.0.0.1")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    for flag, value, low in (("--queue", args.queue, 0), ("--max-input", args.max_input, 1),
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


# ---- settings, errors ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    model_id: str
    api_key: str | None = None
    queue: int = 8
    max_input: int = 4096
    max_frames: int | None = None
    log_text: bool = False

    @property
    def max_body(self) -> int:
        """Request bodies over this many bytes get 413: the input and instructions at 12 bytes a character (JSON
        escapes of astral characters), plus 16 KiB for the rest."""
        return 16384 + 24 * self.max_input


class ApiError(Exception):
    """A response in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.code, self.type, self.headers = status, param, code, type, headers or {}

    def response(self):
        from starlette.responses import JSONResponse

        body = {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, self.status, headers=self.headers)


def _auth(settings: Settings, request) -> None:
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), settings.api_key.encode())):
        raise ApiError(401, "incorrect or missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
    return bytes(body)


# ---- the speech request -------------------------------------------------------------------------------------


def saved_voices() -> list[str]:
    """Names of the user's saved (cloned) voices: the one place the voices store plugs in. None yet: cloning is
    not part of leapvox; when models/voices.py lands, list its voices here and map them in `_voice`."""
    return []


def _voice(value, cfg) -> str:
    """The speaker a request's `voice` names (a name, or OpenAI's {"id": name}); never a path."""
    name = value.get("id") if isinstance(value, dict) else value
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "voice must be a voice name (GET /v1/audio/voices lists them)", "voice")
    key = name.strip().lower()
    if key in cfg.talker.spk_id:
        return key
    shown = name if len(name) <= 40 else name[:40] + "..."
    raise ApiError(400, f"unknown voice {shown!r}; this model's voices: {', '.join(cfg.speakers + saved_voices())}",
                   "voice", "voice_not_found")


def _text(req: dict, field: str, limit: int, required: bool) -> str | None:
    from .common import clean_text

    value = req.get(field)
    if value is None and not required:
        return None
    if value is None:
        raise ApiError(400, f"missing required parameter: '{field}'", field, "missing_required_parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"'{field}' must be a string", field)
    if len(value) > limit:
        raise ApiError(413, f"'{field}' is {len(value)} characters; the limit is {limit} (--max-input)", field,
                       "input_too_long")
    if "\0" in value:
        raise ApiError(400, f"'{field}' contains a NUL character", field)
    text = clean_text(value)
    if required and not text:
        raise ApiError(400, f"'{field}' is empty: give some words to speak", field, "empty_input")
    return text or None


def _choice(req: dict, field: str, choices, default):
    value = req.get(field, default)
    if value not in choices:
        raise ApiError(400, f"unsupported {field} {value!r}; supported: {', '.join(map(str, choices))}", field,
                       f"unsupported_{field}")
    return value


def parse_speech(req, model, settings: Settings, formats: list[str]):
    """A speech request's JSON -> (text, SynthesisOptions, format); ApiError for anything wrong, before any work."""
    if not isinstance(req, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(req) - SPEECH_FIELDS)
    if unknown:
        raise ApiError(400, f"unrecognized request argument: {unknown[0]!r}", unknown[0], "unknown_parameter")
    name = req.get("model")
    if not isinstance(name, str):
        raise ApiError(400, "missing required parameter: 'model'" if name is None else "'model' must be a string",
                       "model", "missing_required_parameter" if name is None else None)
    if name != settings.model_id:
        raise ApiError(404, f"the model {name[:60]!r} is not served here; this server has {settings.model_id!r}",
                       "model", "model_not_found")
    text = _text(req, "input", settings.max_input, required=True)
    instructions = _text(req, "instructions", settings.max_input, required=False)
    cfg = model.config
    speaker = _voice(req["voice"], cfg) if req.get("voice") is not None else None
    fmt = _choice(req, "response_format", formats, "mp3" if "mp3" in formats else "wav")
    _choice(req, "stream_format", ["audio"], "audio")
    speed = req.get("speed", 1.0)
    if speed != 1.0 or isinstance(speed, bool):
        raise ApiError(400, "speed is not implemented by leapvox; only 1.0 (the default) is accepted", "speed",
                       "unsupported_speed")
    mode = _choice(req, "mode", MODES, "ar")
    seed = req.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ApiError(400, "seed must be an integer in 0..2^63-1", "seed")
    language = req.get("language", "auto")
    if not isinstance(language, str) or language.lower() not in cfg.languages:
        raise ApiError(400, f"unsupported language {str(language)[:40]!r}; supported: {', '.join(cfg.languages)}",
                       "language", "unsupported_language")
    # the options `leapvox speak` would build from the same flags, so the same seed gives the same samples
    flags = SimpleNamespace(language=language, instruct=instructions, text_layout="non-streaming", seed=seed,
                            no_guard=False, mode=mode, speaker=speaker, repetition_penalty=None,
                            max_frames=settings.max_frames)
    from leapvox.engine.options import validate

    opts = speak_options(flags, model.defaults)
    try:
        validate(opts, cfg)
    except InputError as e:
        raise ApiError(400, str(e)) from None
    return text, opts, fmt


def _failure(e: Exception) -> ApiError:
    """An exception from synthesis as an API error, without a traceback."""
    from .serve_queue import ShuttingDown

    if isinstance(e, ShuttingDown):
        return ApiError(503, str(e), type="server_error", code="shutting_down")
    if isinstance(e, InputError):
        return ApiError(400, str(e))
    if isinstance(e, LeapvoxError):
        return ApiError(500, str(e), type="server_error")
    return ApiError(500, "internal error while synthesising (see the server's log)", type="server_error")


class SpeechResponse:
    """The ASGI response of one queued job: its status waits for the job's first bytes (so an error that comes
    before any audio still gets its status), then audio goes out as the worker delivers it. A disconnect, noticed
    while waiting or while sending, cancels the job at once."""

    def __init__(self, job, items: asyncio.Queue, headers: dict, log: logging.Logger):
        self.job, self.items, self.headers, self.log = job, items, headers, log

    async def __call__(self, scope, receive, send) -> None:
        import anyio

        self.scope = scope
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
        except asyncio.CancelledError:  # the server stopping after its grace period: the stream is cut, not an error
            self.log.info("speech cut: the server is stopping: %s", self.job.summary)

    async def _send(self, send) -> None:
        kind, value = await self.items.get()
        if kind == "error":
            self._log_failure(value)
            await _failure(value).response()(self.scope, None, send)
            return
        headers = [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while kind == "data":
            await send({"type": "http.response.body", "body": value, "more_body": True})
            kind, value = await self.items.get()
        if kind == "error":  # after audio went out: cut the stream, so the client sees it incomplete
            self._log_failure(value)
            return
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
    from starlette.routing import Route

    from .serve_queue import Encoder, Job, QueueFull, ShuttingDown, SpeechQueue, supported_formats

    log = log or logging.getLogger("leapvox.serve")
    formats = supported_formats()
    state = SimpleNamespace(queue=None)
    cfg = model.config

    def guarded(handler):
        async def endpoint(request):
            try:
                _auth(settings, request)
                return await handler(request)
            except ApiError as e:
                return e.response()
        return endpoint

    async def health(request):
        q = state.queue
        return JSONResponse({"status": "ok", "model": settings.model_id, "weights": model.weights,
                             "backend": model.backend_name, "busy": q.current is not None, "queue_depth": q.waiting,
                             "queue_limit": q.max_waiting, **vars(q.counters), "last": q.last})

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
        data += [{"id": name, "object": "audio.voice", "name": name, "type": "saved"} for name in saved_voices()]
        return JSONResponse({"object": "list", "data": data, "languages": cfg.languages,
                             "instructions": cfg.supports_instruct, "response_formats": formats})

    async def speech(request):
        body = await _read_body(request, settings.max_body)
        try:
            req = json.loads(body)
        except ValueError as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
        text, opts, fmt = parse_speech(req, model, settings, formats)
        loop, items = asyncio.get_running_loop(), asyncio.Queue()
        encoder = Encoder(fmt, model.sample_rate)
        summary = f"voice {opts.speaker}, {fmt}, {len(text)} chars" + (f", text {text!r}" if settings.log_text else "")
        job = Job(text, opts, encoder, lambda item: loop.call_soon_threadsafe(items.put_nowait, item), summary)
        try:
            state.queue.submit(job)
        except ShuttingDown as e:
            raise _failure(e) from None
        except QueueFull as e:
            raise ApiError(429, str(e), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        headers = {"Content-Type": encoder.content_type, "Cache-Control": "no-store",
                   "X-Sample-Rate": str(model.sample_rate)}
        return SpeechResponse(job, items, headers, log)

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
    """The listening socket, bound before the model loads so that a taken port fails first."""
    import socket

    try:
        return socket.create_server((host.strip("[]"), port), backlog=128)
    except OSError as e:
        raise LeapvoxError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                           hint="pick another --port (0 picks a free one)" if port else None) from None


def cmd_serve(args) -> int:

    check_serve_args(args)
    require_model(args)
    sock = listen(args.host, args.port)
    try:
        model = load(args, pull=True, say=quiet_or(args))
        settings = Settings(model_id(args.model), args.api_key, args.queue, args.max_input, args.max_frames,
                            args.log_text)
        app = build_app(model, settings, make_logger())
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
        tell(f"serving {settings.model_id} ({model.weights}, {model.backend_name}) at {url} (queue {args.queue}, "
             f"API key {'required' if args.api_key else 'off'}; Ctrl-C stops)")
        server = make_server(app, args.grace)
        server.run(sockets=[sock])
    finally:
        sock.close()
    if server.stopped_by is not None:
        tell(f"stopped ({signal.Signals(server.stopped_by).name})")
    return EXIT_OK if server.started else 1


def make_server(app, grace: float):
    """A uvicorn server for `app` whose SIGINT/SIGTERM is a graceful stop: waiting requests get 503 at once, running
    ones have `grace` seconds to finish before they are cut; then `run` returns (uvicorn itself would re-raise the
    signal afterwards, inside its event loop). A second Ctrl-C stops at once."""
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
            await super().shutdown(sockets)

    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"  # messages on stderr, like every command
    config = uvicorn.Config(app, timeout_graceful_shutdown=grace, server_header=False, log_level="info",
                            log_config=log_config, lifespan="on")
    return Server(config)
