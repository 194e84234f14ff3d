"""Developer benchmark: the server's first audio for a sentence over the speech stream (#40) against POST, with the
connections' TCP_NODELAY (serve.listen) and without it (the listening socket as socket.create_server makes it).

    python3 -m tests.benchmarks.stream_first_audio [--model demo] [--weights fp32] [--rounds 7]

Two `leapvox serve` apps on one model in this process, on free localhost ports, used one at a time. Each round runs,
interleaved (A B C D A B C D ...), on each socket:
  post     POST /v1/audio/speech {"input": SENTENCE, "response_format": "pcm"}: request sent -> first audio byte;
  stream   on an open WS /v1/audio/speech/stream (settings sent before the clock starts): SENTENCE + " And" sent (the
           sentence becomes sure) -> first audio frame (after the sentence.started event, sent just before it).
The table gives the median [min-max] over rounds; the JSON keeps every round. Not a test: pytest collects nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import statistics
import time
from pathlib import Path

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
RESULTS = Path(__file__).parent / "stream-first-audio.json"


def post(url: str, seed: int) -> float:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = json.dumps({"model": "m", "voice": "leap", "input": SENTENCE, "response_format": "pcm", "seed": seed})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/audio/speech", body)
    r = conn.getresponse()
    r.read1(1)
    first = time.perf_counter() - t0
    r.read()
    conn.close()
    return first


def stream(url: str, seed: int) -> float:
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream", open_timeout=60) as ws:
        ws.send(json.dumps({"model": "m", "voice": "leap", "response_format": "pcm", "seed": seed}))
        assert json.loads(ws.recv(60))["type"] == "session.started"
        t0 = time.perf_counter()
        ws.send(json.dumps({"type": "text", "text": SENTENCE + " And"}))
        while not isinstance(ws.recv(300), bytes):
            pass
        first = time.perf_counter() - t0
        ws.send(json.dumps({"type": "close"}))
        for _ in ws:  # to the end: the server closes after "done"
            pass
    return first


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.stream_first_audio",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--weights", default="fp32")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)

    from leapvox.models.load import load_model
    from tests.test_serve_stream import serving

    model = load_model(args.model, args.weights)
    runs = {f"{kind} {sock}": [] for sock in ("nodelay", "plain") for kind in ("post", "stream")}
    with contextlib.ExitStack() as stack:
        urls = {"nodelay": stack.enter_context(serving(model, "m", max_frames=None)),
                "plain": stack.enter_context(serving(model, "m", socket.create_server(("127.0.0.1", 0)),
                                                     max_frames=None))}
        for url in urls.values():
            post(url, 0), stream(url, 0)  # warm-up, unmeasured
        for r in range(args.rounds):
            for sock, url in urls.items():
                runs[f"post {sock}"].append(post(url, r))
                runs[f"stream {sock}"].append(stream(url, r))
    print(f"first audio of one sentence, {args.model} {args.weights}, {args.rounds} rounds, median [min-max] s")
    for name, values in runs.items():
        print(f"  {name:15s} {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]")
    RESULTS.write_text(json.dumps({"model": args.model, "weights": args.weights, "sentence": SENTENCE,
                                   "seconds": runs}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
