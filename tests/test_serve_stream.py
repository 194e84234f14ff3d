"""`WS /v1/audio/speech/stream` through the real `websockets` client against a server started here (the bundled demo
model, fp32, in-process on a free localhost port): text deltas in, audio and events out in order, flush, cancel, a
disconnect that frees the worker, the API key (header or subprotocol), the Origin rule, and errors in OpenAI's shape
before the server closes."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import time

import pytest

pytest.importorskip("uvicorn", reason="the server needs uvicorn and starlette: pip install -e '.[test]'")
pytest.importorskip("starlette", reason="the server needs uvicorn and starlette: pip install -e '.[test]'")
ws_client = pytest.importorskip("websockets.sync.client", reason="the stream tests need websockets: pip install -e "
                                "'.[test]'")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from .conftest import serve_in_thread  # noqa: E402

KEY = "test-key-0123456789"
MAX_FRAMES = 40  # per sentence: bounded test time
SETTINGS = {"model": "demo", "voice": "leap", "response_format": "pcm", "seed": 7}
LONG = " ".join(f"Sentence number {n} is here." for n in range(1, 13))


def serving(model, model_id: str = "demo", **settings):
    """A context manager: build_app served on a thread (conftest.serve_in_thread), on a free localhost port, giving
    its base URL (http://127.0.0.1:PORT)."""
    from leapvox.app.serve import build_app
    from leapvox.app.serve_request import Settings

    # a logger of its own: "leapvox.serve" may hold a handler on an earlier test's captured (closed) stderr
    app = build_app(model, Settings(model_id, **{"max_frames": MAX_FRAMES, **settings}), logging.getLogger(__name__))
    return serve_in_thread(app)


@pytest.fixture(scope="module")
def model():
    from leapvox.models.load import load_model

    return load_model("demo", "fp32")


@pytest.fixture(scope="module")
def server(model):
    with serving(model, api_key=KEY, queue=2, max_input=600) as url:
        yield url


def connect(url: str, key: str | None = KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return ws_client.connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream", additional_headers=headers,
                             open_timeout=30, close_timeout=30, **kw)


@contextlib.contextmanager
def start(url: str, **settings):
    """A stream with its settings sent: (the connection, its session.started event)."""
    with connect(url) as ws:
        ws.send(json.dumps(SETTINGS | settings))
        started = json.loads(ws.recv(30))
        assert started["type"] == "session.started", started
        yield ws, started


def send(ws, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def receive(ws, until=None, timeout: float = 120.0) -> list:
    """Messages (JSON events as dicts, audio as bytes) up to and including the first event `until(event)` accepts,
    or until the server closes."""
    got = []
    with contextlib.suppress(ConnectionClosed):
        while True:
            m = ws.recv(timeout)
            got.append(m if isinstance(m, bytes) else json.loads(m))
            if until is not None and isinstance(got[-1], dict) and until(got[-1]):
                return got
    return got


def events(messages) -> list[tuple]:
    """The events, short: (type, index) or (type,), audio runs as ("audio",)."""
    out = []
    for m in messages:
        if isinstance(m, bytes):
            if not out or out[-1] != ("audio",):
                out.append(("audio",))
        elif "index" in m:
            out.append((m["type"], m["index"]))
        else:
            out.append((m["type"],))
    return out


def audio(messages) -> bytes:
    return b"".join(m for m in messages if isinstance(m, bytes))


def health(url: str) -> dict:
    u = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(u[0], int(u[1]), timeout=60)
    conn.request("GET", "/health")
    return json.loads(conn.getresponse().read())


def wait_idle(url: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(url)
        if not h["busy"] and h["queue_depth"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"the server stayed busy for {timeout} s: {h}")


def post_pcm(url: str, text: str, seed: int = 7) -> bytes:
    u = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(u[0], int(u[1]), timeout=60)
    body = json.dumps({"model": "demo", "voice": "leap", "input": text, "response_format": "pcm", "seed": seed})
    conn.request("POST", "/v1/audio/speech", body, {"Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    return r.read()


# ---- speaking -------------------------------------------------------------------------------------------------


def test_deltas_in_audio_out_sentence_by_sentence(server):
    """Deltas cut anywhere: the first sentence is spoken while the second is still being written (its audio comes
    before any more text is sent); close speaks the rest; the events come in order around the audio, and the audio
    equals POST /v1/audio/speech's for the same text and seed."""
    with start(server) as (ws, started):
        assert started["sample_rate"] == 24000 and started["response_format"] == "pcm" and started["voice"] == "leap"
        for piece in ("Hel", "lo the", "re. ", "How"):
            send(ws, "text", text=piece)
        got = receive(ws, until=lambda e: e["type"] == "sentence.started")
        got.append(ws.recv(120))  # audio of the first sentence, with the second still unfinished
        assert got[0] == {"type": "sentence.started", "index": 0, "text": "Hello there."} and audio(got)
        send(ws, "text", text=" are you?")
        send(ws, "close")
        got += receive(ws)
        assert ws.close_code == 1000
    assert events(got) == [("sentence.started", 0), ("audio",), ("sentence.finished", 0), ("stats", 0),
                           ("sentence.started", 1), ("audio",), ("sentence.finished", 1), ("stats", 1), ("done",)]
    said = [(m["index"], m["text"], m["finish_reason"]) for m in got if m.__class__ is dict
            and m["type"] == "sentence.finished"]
    assert said == [(0, "Hello there.", "eos"), (1, "How are you?", "eos")]
    assert got[-1] == {"type": "done", "finish_reason": "eos", "sentences": 2}
    stats = [m for m in got if m.__class__ is dict and m["type"] == "stats"]
    assert 0 < stats[0]["audio_s"] < stats[1]["audio_s"] and stats[1]["frames"] > stats[0]["frames"] > 0
    pcm = audio(got)
    assert pcm == post_pcm(server, "Hello there. How are you?")


def test_flush_speaks_an_unfinished_sentence(server):
    with start(server, response_format="wav") as (ws, _):
        for piece in ("\x1b[3", "1mHel", "lo\x1b[0m there"):  # no sentence end: nothing is sure yet
            send(ws, "text", text=piece)
        send(ws, "flush")  # (a terminal's escape sequence, even cut in two, is taken out as POST takes it out)
        got = receive(ws, until=lambda e: e["type"] == "sentence.started")
        assert got == [{"type": "sentence.started", "index": 0, "text": "Hello there"}]
        head = ws.recv(120)  # spoken without waiting for more text
        assert head[:4] == b"RIFF" and len(head) > 44  # the streaming WAV header, then audio
        send(ws, "close")
        got += [head, *receive(ws)]
    assert events(got) == [("sentence.started", 0), ("audio",), ("sentence.finished", 0), ("stats", 0), ("done",)]


def test_cancel_stops_then_the_stream_goes_on(server):
    before = wait_idle(server)
    with start(server) as (ws, _):
        send(ws, "text", text=LONG + " ")
        send(ws, "flush")
        got = receive(ws, until=lambda e: e["type"] == "sentence.started")
        got += [ws.recv(60)]  # the first audio
        assert isinstance(got[-1], bytes)
        send(ws, "cancel")
        got += receive(ws, until=lambda e: e["type"] == "cancelled")
        finished = [m for m in got if isinstance(m, dict) and m["type"] == "sentence.finished"]
        assert finished and finished[-1]["finish_reason"] == "cancelled" and len(finished) < 12
        after = wait_idle(server)
        assert after["cancelled"] == before["cancelled"] + 1 and after["last"]["outcome"] == "cancelled"
        send(ws, "text", text="Next one.")
        send(ws, "close")
        rest = receive(ws)
        assert [m["text"] for m in rest if isinstance(m, dict) and m["type"] == "sentence.started"] == ["Next one."]
        assert rest[-1]["type"] == "done" and audio(rest)
        assert rest[0]["index"] == len(finished)  # the numbering goes on


def test_disconnect_stops_synthesis_and_frees_the_worker(server):
    before = wait_idle(server)
    with start(server) as (ws, _):
        send(ws, "text", text=LONG)
        send(ws, "flush")
        receive(ws, until=lambda e: e["type"] == "sentence.started")
        assert isinstance(ws.recv(60), bytes)
        ws.socket.close()  # gone without a closing handshake
    after = wait_idle(server)
    assert after["cancelled"] == before["cancelled"] + 1 and after["last"]["outcome"] == "cancelled"
    assert after["last"]["frames"] < 12 * MAX_FRAMES // 2  # stopped early, not run to the end
    assert post_pcm(server, "Next.")  # the worker takes the next request
    assert wait_idle(server)["completed"] == after["completed"] + 1


def test_a_stopping_server_closes_streams_at_once(model):
    """SIGTERM or Ctrl-C (uvicorn's shutdown, as make_server runs it): a speaking stream is closed at once with 1012
    (service restart), and the server still ends."""
    server = serving(model)
    url = server.__enter__()
    with start(url) as (ws, _):
        send(ws, "text", text=LONG)
        send(ws, "flush")
        receive(ws, until=lambda e: e["type"] == "sentence.started")
        assert isinstance(ws.recv(60), bytes)
        server.__exit__(None, None, None)  # should_exit, then the thread joined
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(30)
        assert ws.close_code == 1012


# ---- refusals -------------------------------------------------------------------------------------------------


def refused(url: str, **kw) -> tuple[int, dict]:
    with pytest.raises(InvalidStatus) as e:
        connect(url, **kw)
    r = e.value.response
    body = json.loads(r.body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return r.status_code, body["error"]


def test_api_key_by_header_or_subprotocol(server):
    assert refused(server, key=None)[0] == 401
    status, err = refused(server, key="wrong")
    assert (status, err["code"]) == (401, "invalid_api_key")
    status, err = refused(server, key=None, subprotocols=["leapvox.v1", "bearer.wrong"])
    assert (status, err["code"]) == (401, "invalid_api_key")
    with connect(server, key=None, subprotocols=["leapvox.v1", f"bearer.{KEY}"]) as ws:  # as a browser sends it
        assert ws.subprotocol == "leapvox.v1"  # chosen; the key is never echoed
        ws.send(json.dumps(SETTINGS))
        assert json.loads(ws.recv(30))["type"] == "session.started"


def test_keyless_server_refuses_web_pages_from_elsewhere(model):
    with serving(model) as url:
        status, err = refused(url, key=None, origin="https://example.com")
        assert (status, err["code"]) == (403, "origin_not_allowed")
        for origin in (None, "http://localhost:3000", "http://127.0.0.1:8000"):
            with connect(url, key=None, origin=origin) as ws:
                ws.send(json.dumps(SETTINGS))
                assert json.loads(ws.recv(30))["type"] == "session.started"


def test_too_many_streams(server):
    with contextlib.ExitStack() as stack:
        for _ in range(3):  # --queue 2: one speaking and two waiting at most
            stack.enter_context(start(server))
        status, err = refused(server)
        assert (status, err["code"]) == (429, "too_many_streams")
    with start(server):  # closed ones are counted out
        pass


@pytest.mark.parametrize("first, param, code", [
    ({"voice": "alloy"}, "voice", "voice_not_found"),
    ({"response_format": "mp3"}, "response_format", "unsupported_response_format"),
    ({"model": "tts-1"}, "model", "model_not_found"),
    ({"input": "Hello."}, "input", "unknown_parameter"),
    ({"mode": "fast"}, "mode", "unsupported_mode"),
    ({"type": "text", "text": "Hi."}, "type", "settings_expected"),
])
def test_bad_settings_error_then_close(server, first, param, code):
    with connect(server) as ws:
        ws.send(json.dumps(SETTINGS | first))
        got = receive(ws)
        assert ws.close_code == 1008
    assert len(got) == 1 and got[0]["type"] == "error", got
    err = got[0]["error"]
    assert set(err) == {"message", "type", "param", "code"} and (err["param"], err["code"]) == (param, code), err


def test_bad_messages_error_then_close(server):
    cases = [
        ({"type": "shout"}, "invalid_message"),
        ({"type": "text", "text": 5}, None),
        ({"type": "text", "text": "x" * 601}, "input_too_long"),  # over the server's --max-input for the stream
        ({"type": "text", "text": "a [pause forever] b"}, "invalid_markup"),
        ("not json", "invalid_json"),
        (b"\x00\x01", "invalid_message"),  # audio goes the other way only
    ]
    for message, code in cases:
        with start(server) as (ws, _):
            ws.send(message if isinstance(message, bytes | str) else json.dumps(message))
            got = receive(ws)
            assert got[-1]["type"] == "error" and got[-1]["error"]["code"] == code, (message, got)
            assert ws.close_code == 1008


def test_an_idle_stream_gives_the_worker_up_to_a_waiting_request(server):
    """A stream that has said everything keeps the worker only until another request waits (HOLD_S): a POST made
    while the stream stays open is answered, and the stream's next text takes a new turn."""
    with start(server) as (ws, _):
        send(ws, "text", text="Hello there.")
        send(ws, "flush")
        got = receive(ws, until=lambda e: e["type"] == "sentence.started")
        assert isinstance(ws.recv(120), bytes)
        assert wait_idle_but(server, lambda h: h["busy"] and h["queue_depth"] == 0)  # the stream holds the worker
        assert post_pcm(server, "Next.")  # served while the stream is open
        send(ws, "text", text="And again.")
        send(ws, "close")
        got += receive(ws)
    said = [(m["type"], m["index"], m["text"]) for m in got if isinstance(m, dict) and "text" in m]
    assert said == [("sentence.started", 0, "Hello there."), ("sentence.finished", 0, "Hello there."),
                    ("sentence.started", 1, "And again."), ("sentence.finished", 1, "And again.")]
    assert got[-1]["type"] == "done"


def wait_idle_but(url: str, cond, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while not cond(h := health(url)):
        assert time.monotonic() < deadline, h
        time.sleep(0.05)
    return h


def test_settings_late_or_idle_too_long(server, monkeypatch):
    from leapvox.app import serve_stream

    monkeypatch.setattr(serve_stream, "SETTINGS_S", 0.5)
    monkeypatch.setattr(serve_stream, "IDLE_S", 0.5)
    with connect(server) as ws:  # no settings
        got = receive(ws)
    assert got[-1]["error"]["code"] == "timeout" and ws.close_code == 1008
    with start(server) as (ws, _):  # settings, then nothing
        got = receive(ws)
    assert got[-1]["error"]["code"] == "idle_timeout" and ws.close_code == 1008
