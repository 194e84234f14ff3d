"""`leapvox serve` through the real `openai` client: the bundled demo model in a server subprocess (fp32, on a free
localhost port, API key from the environment), a tiny 1.7B-layout fixture in-process. Audio bytes equal `leapvox
speak`'s for the same seed; streaming, disconnects, the bounded queue, every error case, the bind refusal and a
graceful SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import numpy as np
import pytest
import soundfile as sf

from .conftest import FIXTURES, serve_in_thread

openai = pytest.importorskip("openai", reason="the server tests need the openai client: pip install -e '.[test]'")
pytest.importorskip("uvicorn", reason="the server needs uvicorn and starlette: pip install -e '.[test]'")
pytest.importorskip("starlette", reason="the server needs uvicorn and starlette: pip install -e '.[test]'")

KEY = "test-key-0123456789"
MAX_FRAMES = 40  # per sentence, on the server and in the `speak` it is compared with: bounded test time
TEXT = "Hello there. How are you?"
LONG = " ".join(f"Sentence number {n} is here." for n in range(1, 13))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "leapvox.app.cli", *args]


class Server:
    """`leapvox serve` in a subprocess; its stderr is collected by a thread."""

    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen(cli("serve", "--port", "0", *args), stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.url = None
        started = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                if "serving " in line and " at http://" in line:
                    self.url = line.split(" at ")[1].split()[0]
                    started.set()
            started.set()

        threading.Thread(target=read, daemon=True).start()
        started.wait(600)
        assert self.url, "".join(self.lines)
        self.base = self.url.removesuffix("/v1")

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def client(self, key: str = KEY, **kw):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=300, **kw)

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None, key=KEY):
        u = urlparse(self.base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
        conn.request(method, path, body=body, headers={**auth, **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), data

    def health(self) -> dict:
        return json.loads(self.raw("GET", "/health")[2])

    def wait_idle(self, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["busy"] and h["queue_depth"] == 0:
                return h
            time.sleep(0.05)
        raise AssertionError(f"the server stayed busy for {timeout} s: {h}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


@pytest.fixture(scope="module")
def speaking():
    """`leapvox speak TEXT -o - --seed 7` (a pipe: the streaming WAV header), fp32, the server's frame cap: started
    before the server, so that the two model loads overlap."""
    proc = subprocess.Popen(cli("speak", TEXT, "-o", "-", "--model", "demo", "--weights", "fp32", "--seed", "7",
                                "--max-frames", str(MAX_FRAMES), "-q"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(speaking):
    s = Server("--model", "demo", "--weights", "fp32", "--queue", "2", "--max-frames", str(MAX_FRAMES), "--grace",
               "600", env={"LEAPVOX_API_KEY": KEY})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spoken(speaking):
    out, err = speaking.communicate(timeout=600)
    assert speaking.returncode == 0, err.decode()
    return out


def speech(client, text=TEXT, fmt="wav", **extra):
    return client.audio.speech.create(model="demo", voice="leap", input=text, response_format=fmt, extra_body=extra)


def error_of(excinfo) -> dict:
    body = excinfo.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# ---- refusals before anything loads ---------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
def test_public_bind_without_key_refuses(host):
    env = {k: v for k, v in os.environ.items() if k != "LEAPVOX_API_KEY"}
    proc = subprocess.run(cli("serve", "--host", host), capture_output=True, text=True, timeout=120, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"refusing to listen on {host} without an API key" in lines[0] and "LEAPVOX_API_KEY" in lines[0]


def test_loopback_and_keyed_public_bind():
    from argparse import Namespace

    from leapvox.app.serve import check_serve_args, is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.20", "example.com", "localhost.example.com"]))
    base = dict(port=8880, queue=8, max_input=4096, max_frames=None, grace=10.0)
    check_serve_args(Namespace(host="0.0.0.0", api_key="k", **base))  # a key: allowed


def test_bad_port_and_taken_port():
    proc = subprocess.run(cli("serve", "--port", "70000"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--port must be in 0..65535" in proc.stderr
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = subprocess.run(cli("serve", "--port", str(port)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_model_loads_on_a_thread_that_ends_before_serving(monkeypatch, capsys):
    """torch's OpenMP runtime keeps a thread pool for each thread that ran parallel work; a load on the main thread
    left one beside the synthesis thread's, and with more pool threads than CPUs libgomp sleeps between parallel
    regions (a request spoke at about half of `leapvox speak`'s speed). The load runs on its own thread, ended before
    the server runs; its errors are still one line."""
    from leapvox.app import serve
    from leapvox.app.cli import main
    from leapvox.engine.errors import LeapvoxError
    from leapvox.models.load import load_model

    seen = {}

    def fake_load(args, **kw):
        seen["loader"] = threading.current_thread()
        if seen.get("fail"):
            raise LeapvoxError("cannot read the model", hint="pull it again")
        return load_model(FIXTURES / "tiny-0b6", "fp32")

    class Stub:
        started, stopped_by = True, None

        def run(self, sockets):
            seen["loader alive"] = seen["loader"].is_alive()

    monkeypatch.setattr(serve, "load", fake_load)
    monkeypatch.setattr(serve, "make_server", lambda app, grace: Stub())
    args = ["serve", "--port", "0", "--model", str(FIXTURES / "tiny-0b6")]
    assert main(args) == 0
    assert seen["loader"] is not threading.main_thread() and seen["loader alive"] is False
    seen["fail"] = True
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read the model" in err[0] and "pull it again" in err[0], err


# ---- the demo model through the openai client ------------------------------------------------------------------


def test_models_voices_health(server):
    c = server.client()
    assert [m.id for m in c.models.list()] == ["demo"]
    assert c.models.retrieve("demo").id == "demo"
    voices = c.get("/audio/voices", cast_to=object)
    assert [v["id"] for v in voices["data"]] == ["leap"]
    assert {"wav", "pcm"} <= set(voices["response_formats"])
    h = server.health()
    assert h["status"] == "ok" and h["model"] == "demo" and h["weights"] == "fp32" and h["queue_limit"] == 2


def test_wav_and_pcm_equal_speak(server, spoken):
    c = server.client()
    wav = speech(c, seed=7)
    assert wav.response.headers["content-type"] == "audio/wav"
    assert wav.content == spoken  # the same bytes as `leapvox speak -o -`, header included
    pcm = speech(c, fmt="pcm", seed=7).content
    assert pcm == spoken[44:]
    audio, sr = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert sr == 24000 and len(audio) == len(pcm) // 2 > 0


def test_other_formats_decode_to_the_same_audio(server, spoken):
    c = server.client()
    ref, _ = sf.read(io.BytesIO(spoken), dtype="int16")
    formats = server.client().get("/audio/voices", cast_to=object)["response_formats"]
    for fmt in set(formats) - {"wav", "pcm"}:
        audio, sr = sf.read(io.BytesIO(speech(c, fmt=fmt, seed=7).content), dtype="int16")
        assert sr == 24000 and len(audio) == len(ref), fmt
        if fmt == "flac":  # lossless
            assert np.array_equal(audio, ref)
        else:  # lossy, but the same speech: clearly correlated with the reference
            assert np.corrcoef(audio.astype(float), ref.astype(float))[0, 1] > 0.5, fmt


def test_streaming_first_chunk_then_disconnect_frees_worker(server):
    """The first chunk arrives while synthesis is still going (the client leaves then, and the job is found
    cancelled, not completed), the worker is freed, and the next request is served."""
    before = server.wait_idle()
    c = server.client()
    with c.audio.speech.with_streaming_response.create(model="demo", voice="leap", input=LONG,
                                                       response_format="pcm", extra_body={"seed": 1}) as r:
        assert r.status_code == 200
        first = next(r.iter_bytes(4096))
        assert len(first) > 0
    after = server.wait_idle()
    assert after["cancelled"] == before["cancelled"] + 1 and after["completed"] == before["completed"]
    assert after["last"]["outcome"] == "cancelled" and after["last"]["stop_reason"] == "cancelled"
    assert after["last"]["frames"] < 12 * MAX_FRAMES // 2  # stopped early, not run to the end of 12 sentences
    assert speech(c, "Next.", fmt="pcm", seed=1).content  # the worker takes the next request
    assert server.wait_idle()["completed"] == after["completed"] + 1


def test_40_concurrent_requests_complete_or_get_429(server):
    c = server.client()
    reference = speech(c, "Hi.", seed=3).content

    def one(_):
        try:
            return 200, speech(c, "Hi.", seed=3).content
        except openai.RateLimitError as e:
            return 429, (e.response.headers.get("retry-after"), e.response.json())

    before = server.wait_idle()
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(one, range(40)))
    ok = [body for status, body in results if status == 200]
    busy = [body for status, body in results if status == 429]
    assert len(ok) + len(busy) == 40 and ok and busy
    assert all(body == reference for body in ok)  # none corrupted or mixed up
    for retry_after, body in busy:
        assert int(retry_after) >= 1 and body["error"]["code"] == "queue_full"
    after = server.wait_idle()
    assert after["completed"] - before["completed"] == len(ok)
    assert after["rejected"] - before["rejected"] == len(busy)


def test_error_cases(server):
    c = server.client()
    cases = [
        (dict(voice="alloy"), 400, "voice", "voice_not_found"),
        (dict(voice="../../etc/passwd"), 400, "voice", "voice_not_found"),
        (dict(model="tts-1"), 404, "model", "model_not_found"),
        (dict(response_format="aac"), 400, "response_format", "unsupported_response_format"),
        (dict(input=""), 400, "input", "empty_input"),
        (dict(input=" \x1b[31m \x07"), 400, "input", "empty_input"),
        (dict(input="x" * 4097), 413, "input", "input_too_long"),
        (dict(speed=1.5), 400, "speed", "unsupported_speed"),
        (dict(stream_format="sse"), 400, "stream_format", "unsupported_stream_format"),
        (dict(extra_body={"temperatur": 0.5}), 400, "temperatur", "unknown_parameter"),
        (dict(extra_body={"mode": "fast"}), 400, "mode", "unsupported_mode"),
        (dict(extra_body={"seed": "seven"}), 400, "seed", None),
        (dict(extra_body={"language": "klingon"}), 400, "language", "unsupported_language"),
    ]
    for change, status, param, code in cases:
        kw = dict(model="demo", voice="leap", input="Hello.", response_format="wav") | change
        with pytest.raises(openai.APIStatusError) as e:
            c.audio.speech.create(**kw)
        err = error_of(e)
        assert (e.value.status_code, err["param"], err["code"]) == (status, param, code), (change, err)
    with pytest.raises(openai.APIStatusError) as e:
        speech(c, "x" * 4097)
    assert "4096" in error_of(e)["message"]  # the limit is named

    with pytest.raises(openai.BadRequestError) as e:  # no input at all
        c.post("/audio/speech", cast_to=object, body={"model": "demo", "voice": "leap"})
    assert error_of(e)["code"] == "missing_required_parameter" and error_of(e)["param"] == "input"

    with pytest.raises(openai.AuthenticationError) as e:
        speech(server.client("wrong-key"))
    assert error_of(e)["code"] == "invalid_api_key" and e.value.status_code == 401
    status, headers, body = server.raw("GET", "/v1/models", key=None)  # no key at all
    assert status == 401 and headers.get("www-authenticate") == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert server.raw("GET", "/health", key=None)[0] == 200  # health needs no key

    status, _, body = server.raw("POST", "/v1/audio/speech", b'{"model": "demo", "input": ',
                                 {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"
    big = json.dumps({"model": "demo", "input": "a" * 200_000}).encode()
    status, _, body = server.raw("POST", "/v1/audio/speech", big)
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
    status, _, body = server.raw("GET", "/v1/nothing-here")
    assert status == 404 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in server.log
    assert "Hello." not in server.log and "xxxx" not in server.log  # no request text without --log-text


def test_sigterm_stops_gracefully(server):
    """Last: SIGTERM while one request streams and one waits: the waiting one gets 503 at once, the streaming one
    finishes whole (the grace is long), and the process exits 0 without a traceback."""
    c = server.client()
    got_first, results = threading.Event(), {}
    whole = speech(c, LONG[:120], fmt="pcm", seed=5).content

    def streaming():
        with c.audio.speech.with_streaming_response.create(model="demo", voice="leap", input=LONG[:120],
                                                           response_format="pcm", extra_body={"seed": 5}) as r:
            chunks = r.iter_bytes()
            data = next(chunks)
            got_first.set()
            results["stream"] = data + b"".join(chunks)

    def waiting():
        try:
            results["waiting"] = speech(c, "Waiting.").content
        except openai.APIStatusError as e:
            results["waiting"] = e.status_code

    t1 = threading.Thread(target=streaming)
    t1.start()
    assert got_first.wait(300)
    t2 = threading.Thread(target=waiting)
    t2.start()
    deadline = time.monotonic() + 60
    while server.health()["queue_depth"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    t1.join(300)
    t2.join(300)
    assert server.proc.wait(120) == 0
    assert results["waiting"] == 503
    assert results["stream"] == whole  # not cut
    assert "stopped (SIGTERM)" in server.log and "Traceback" not in server.log, server.log
    assert "speech cut" not in server.log and "without completing" not in server.log, server.log


def test_sigterm_ends_a_stream_cleanly_after_the_grace():
    """SIGTERM while a long WAV streams, --grace 1: after the grace the stream is ended where it is, as a complete
    chunked response (the client reads to its end, no IncompleteRead) holding a readable WAV; the log names what was
    cut, uvicorn does not report an unfinished response, and the process exits 0."""
    s = Server("--model", "demo", "--weights", "fp32", "--grace", "1", "--max-frames", str(MAX_FRAMES),
               env={"LEAPVOX_API_KEY": KEY})
    try:
        u = urlparse(s.base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        body = json.dumps({"model": "demo", "voice": "leap", "input": LONG, "response_format": "wav", "seed": 2})
        conn.request("POST", "/v1/audio/speech", body, {"Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("transfer-encoding") == "chunked"
        head = r.read(44)
        s.proc.send_signal(signal.SIGTERM)
        data = head + r.read()  # IncompleteRead if the chunked body were cut without its end
        conn.close()
        assert s.proc.wait(120) == 0
    finally:
        s.stop()
    audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert data[:4] == b"RIFF" and sr == 24000 and len(audio) == (len(data) - 44) // 2
    assert len(audio) < 12 * MAX_FRAMES * 1920  # cut short: twelve sentences were asked for
    assert "speech cut: the server is stopping" in s.log and "voice leap, wav, " in s.log, s.log
    assert "without completing" not in s.log and "Traceback" not in s.log, s.log


# ---- tiny fixtures, in-process: instructions, saved voices --------------------------------------------------------


@contextlib.contextmanager
def in_process(model, name: str):
    """An openai client on `model` served by build_app on a thread (conftest.serve_in_thread; no API key)."""
    from leapvox.app.serve import build_app
    from leapvox.app.serve_request import Settings

    with serve_in_thread(build_app(model, Settings(name, max_frames=3))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def same_wav(streamed: bytes, file: bytes) -> bool:
    """The same samples and format; the header differs only in the sizes (streamed: unknown; a file: patched)."""
    return streamed[44:] == file[44:] and streamed[:4] + streamed[8:40] == file[:4] + file[8:40]


def test_tiny_fixture_in_process_with_instructions(tmp_path):
    from leapvox.app.cli import main
    from leapvox.models.load import load_model

    folder = FIXTURES / "tiny-1b7"
    args = ["--max-frames", "3", "--seed", "3", "--weights", "fp32", "--instruct", "Speak slowly.", "--speaker",
            "ryan", "-q"]
    assert main(["speak", "Hello.", "-o", str(tmp_path / "ref.wav"), "--model", str(folder), *args]) == 0
    model = load_model(folder, "fp32")
    with in_process(model, "tiny-1b7") as c:
        voices = c.get("/audio/voices", cast_to=object)
        ids = [v["id"] for v in voices["data"]]
        assert voices["instructions"] is True and ids == model.config.speakers and "ryan" in ids
        got = c.audio.speech.create(model="tiny-1b7", voice="Ryan", input="Hello.", response_format="wav",
                                    instructions="Speak slowly.", extra_body={"seed": 3}).content
    assert same_wav(got, (tmp_path / "ref.wav").read_bytes())


def test_saved_voice_of_a_base_model(tmp_path, monkeypatch):
    """A Base model's saved voice (models/voices.py) is listed and spoken as `speak --voice` speaks it."""
    voices = pytest.importorskip("leapvox.models.voices", reason="the saved-voices store (models/voices.py) is not "
                                 "installed in this tree")
    folder = FIXTURES / "tiny-base-0b6"
    if not folder.is_dir():
        pytest.skip("the tiny Base fixture (tests/fixtures/reference/tiny-base-0b6) is not in this tree")
    import torch

    from leapvox.app.cli import main
    from leapvox.engine.prompt import ClonedVoice
    from leapvox.models.load import load_model

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path / "home"))
    model = load_model(folder, "fp32")
    torch.manual_seed(0)
    voice = ClonedVoice(torch.randn(model.config.talker.hidden_size), None, None)  # an x-vector-only voice
    voices.save_voice(voices.model_key(model.path), "me", voice)
    args = ["--max-frames", "3", "--seed", "3", "--weights", "fp32", "-q"]
    assert main(["speak", "Hello.", "--voice", "me", "-o", str(tmp_path / "ref.wav"), "--model", str(folder),
                 *args]) == 0
    with in_process(model, "tiny-base") as c:
        listed = c.get("/audio/voices", cast_to=object)["data"]
        assert [(v["id"], v["type"]) for v in listed] == [("me", "saved")]
        got = c.audio.speech.create(model="tiny-base", voice="me", input="Hello.", response_format="wav",
                                    extra_body={"seed": 3}).content
        assert same_wav(got, (tmp_path / "ref.wav").read_bytes())
        for bad, code in (("../me", "voice_not_found"), ("other", "voice_not_found"), (None, None)):
            kw = {} if bad is None else {"voice": bad}
            with pytest.raises(openai.BadRequestError) as e:
                c.post("/audio/speech", cast_to=object, body={"model": "tiny-base", "input": "Hello.", **kw})
            assert error_of(e)["param"] == "voice" and (code is None or error_of(e)["code"] == code)
