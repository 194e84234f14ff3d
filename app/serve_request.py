"""`leapvox serve`'s requests: settings, OpenAI-shaped errors, the API key check, the body cap and the speech
request's validation into the options `leapvox speak` would use. No I/O beyond reading the request body."""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass

from leapvox.engine.errors import InputError, LeapvoxError
from leapvox.engine.options import AUTO, MODE_CHOICES, OptionError, build_options, check_options, check_text, validate

from .common import clean_text

SPEECH_FIELDS = {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format",
                 "mode", "seed", "language"}  # the last three are leapvox's own
STREAM_FIELDS = SPEECH_FIELDS - {"input"} | {"type"}  # a speech stream's settings message
_FIELDS = {"text": "input", "instruct": "instructions", "speaker": "voice"}  # option -> the request's field
_CODES = {"language": "unsupported_language"}  # a bad field's error code, OpenAI's style


def field_name(key: str) -> str:
    """An option as a speech request spells it (engine.options.check_options): text -> input, seed -> seed."""
    return _FIELDS.get(key, key)


# ---- settings, errors ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    model_id: str
    api_key: str | None = None
    queue: int = 8
    max_input: int = 4096
    max_frames: int | None = None
    log_text: bool = False
    auto_mode: str = "ar"  # what a request's mode `auto` (the default) runs: chosen at start (models.auto)
    auto_why: str = ""

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


KEY_PROTOCOL = "bearer."  # a WebSocket subprotocol "bearer.KEY": the key of a browser, which cannot set headers


def check_key(settings: Settings, request) -> None:
    """The API key, in constant time: 'Authorization: Bearer KEY', or on a WebSocket the subprotocol 'bearer.KEY'
    (never a query parameter: URLs end up in logs)."""
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" and request.scope["type"] == "websocket":
        offered = [p[len(KEY_PROTOCOL):] for p in request.scope.get("subprotocols", ()) if p.startswith(KEY_PROTOCOL)]
        scheme, token = "bearer", (offered or [""])[0]
    if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), settings.api_key.encode())):
        raise ApiError(401, "incorrect or missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


async def read_body(request, limit: int) -> bytes:
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


def saved_voices(model) -> list[str]:
    """The model's saved cloned voices (a Base model's, `leapvox voices`): where the voices store plugs in. Read per
    request, so a voice added while the server runs is there; none where the store is not installed."""
    if getattr(model.config, "tts_model_type", "custom_voice") != "base":
        return []
    try:
        from leapvox.models import voices
    except ImportError:
        return []
    return [v.name for v in voices.list_voices(voices.model_key(model.path)) if v.mode != "damaged"]


def _voice(value, model):
    """(speaker, cloned voice) for a request's `voice` (a name, or OpenAI's {"id": name}): a built-in speaker, or a
    saved voice of a Base model. The name is only compared with the listed names, never used as a path itself."""
    cfg = model.config
    name = value.get("id") if isinstance(value, dict) else value
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "voice must be a voice name (GET /v1/audio/voices lists them)", "voice")
    if name.strip().lower() in cfg.talker.spk_id:
        return name.strip().lower(), None
    saved = saved_voices(model)
    if name in saved:
        from leapvox.models import voices

        try:
            return None, voices.load_voice(voices.model_key(model.path), name, cfg.talker.hidden_size)
        except LeapvoxError as e:  # damaged since it was listed
            raise ApiError(500, str(e), "voice", type="server_error") from None
    shown = name if len(name) <= 40 else name[:40] + "..."
    raise ApiError(400, f"unknown voice {shown!r}; this model's voices: {', '.join(cfg.speakers + saved) or 'none'}",
                   "voice", "voice_not_found")


def _text(req: dict, field: str, limit: int, required: bool) -> str | None:
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
    if required:
        check_text(text, field)  # what `leapvox speak` refuses: "!!! ???" has nothing to say
    return text or None


def _choice(req: dict, field: str, choices, default):
    value = req.get(field, default)
    if value not in choices:
        raise ApiError(400, f"unsupported {field} {value!r}; supported: {', '.join(map(str, choices))}", field,
                       f"unsupported_{field}")
    return value


def parse_speech(req, model, settings: Settings, formats: list[str]):
    """A speech request's JSON -> (text, SynthesisOptions validated for `model`, format, cloned voice or None);
    ApiError for anything wrong, before any work, by the rules `leapvox speak` checks its flags and text with
    (engine.options), each field named as the request spells it; a field that will have no effect is a warning in
    the log."""
    return _parsed(req, model, settings, formats, stream=False)


def parse_stream_settings(req, model, settings: Settings, formats: list[str]):
    """A speech stream's first message -> (None, options, format, cloned voice or None), by the same rules: the
    speech request's fields less `input` (the text comes in pieces after it), and an optional "type": "settings"."""
    if isinstance(req, dict) and req.get("type", "settings") != "settings":
        raise ApiError(400, "the first message of a speech stream must be its settings", "type", "settings_expected")
    if isinstance(req, dict) and "input" in req:
        raise ApiError(400, 'a speech stream takes its text in {"type": "text", "text": ...} messages, not as '
                       "'input'", "input", "unknown_parameter")
    return _parsed(req, model, settings, formats, stream=True)


def _parsed(req, model, settings: Settings, formats: list[str], stream: bool):
    try:
        return _parse_speech(req, model, settings, formats, stream)
    except OptionError as e:
        raise ApiError(400, f"{e}" + (f"; {e.hint}" if e.hint else ""), e.param, _CODES.get(e.param)) from None
    except InputError as e:
        raise ApiError(400, str(e)) from None


def _parse_speech(req, model, settings: Settings, formats: list[str], stream: bool):
    if not isinstance(req, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(req) - (STREAM_FIELDS if stream else SPEECH_FIELDS))
    if unknown:
        raise ApiError(400, f"unrecognized request argument: {unknown[0]!r}", unknown[0], "unknown_parameter")
    name = req.get("model")
    if not isinstance(name, str):
        raise ApiError(400, "missing required parameter: 'model'" if name is None else "'model' must be a string",
                       "model", "missing_required_parameter" if name is None else None)
    if name != settings.model_id:
        raise ApiError(404, f"the model {name[:60]!r} is not served here; this server has {settings.model_id!r}",
                       "model", "model_not_found")
    text = None if stream else _text(req, "input", settings.max_input, required=True)
    instructions = _text(req, "instructions", settings.max_input, required=False)
    cfg = model.config
    speaker, voice = _voice(req["voice"], model) if req.get("voice") is not None else (None, None)
    fmt = _choice(req, "response_format", formats, "mp3" if "mp3" in formats else "wav")
    _choice(req, "stream_format", ["audio"], "audio")
    speed = req.get("speed", 1.0)
    if speed != 1.0 or isinstance(speed, bool):
        raise ApiError(400, "speed is not implemented by leapvox; only 1.0 (the default) is accepted", "speed",
                       "unsupported_speed")
    # the options `leapvox speak` builds from the same flags, by the same rules: the same seed, the same samples
    mode = _choice(req, "mode", MODE_CHOICES, AUTO)
    given = {"mode": settings.auto_mode if mode == AUTO else mode, "seed": req.get("seed"),
             "language": req.get("language"), "instruct": instructions, "speaker": speaker,
             "max_frames": settings.max_frames}
    for warning in check_options(given, field_name):
        logging.getLogger("leapvox.serve").warning("speech: %s", warning)  # as the stream's own warnings
    return text, validate(build_options(given, model.defaults), cfg, voice, field_name), fmt, voice


def api_error_of(e: Exception) -> ApiError:
    """An exception from synthesis as an API error, without a traceback."""
    from .serve_queue import ShuttingDown

    if isinstance(e, ShuttingDown):
        return ApiError(503, str(e), type="server_error", code="shutting_down")
    if isinstance(e, InputError):
        return ApiError(400, str(e))
    if isinstance(e, LeapvoxError):
        return ApiError(500, str(e), type="server_error")
    return ApiError(500, "internal error while synthesising (see the server's log)", type="server_error")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
