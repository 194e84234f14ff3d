"""Load benchmark of `leapvox serve` (not a test): requests/s, first-byte latency percentiles and xRT under 1, 4
and 16 concurrent clients, through the real `openai` client, streaming PCM.

    python3 -m tests.benchmarks.serve_load --model demo --weights auto --requests 16 \
        --json tests/benchmarks/serve-load-demo.json
    python3 -m tests.benchmarks.serve_load --url http://127.0.0.1:8880/v1 --model demo   # a server already running

Without --url it starts `leapvox serve` on a free port with a queue as deep as the largest concurrency (so nothing
is refused), waits for it and stops it after. Each client sends its requests one after another; a level's clock
runs from the first request to the last byte. xRT is the audio delivered per wall second over the whole level (all
clients together), and per request (audio / its own wall time, queueing included). Speed on a shared machine is
noisy: read it with the load average printed beside it.

    python3 -m tests.benchmarks.serve_load --model demo --weights fp32 --vs-speak 8 \
        --json tests/benchmarks/serve-vs-speak-demo-fp32.json

`--vs-speak N` instead runs `leapvox speak TEXT -o FILE` and one request to the started server on the same sentence
and seed, interleaved (A B, B A, ...: the order rotates by round), N rounds: speak's xRT from its summary line
(synthesis only, the model load left out), the request's xRT as the client sees it (audio / time to the last byte)
and as the server measured it (/health), medians and their ratio. `--old-server` adds a server that loads the model
on its main thread, as before issue #37.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from statistics import median

SENTENCES = [
    "The river rose slowly through the night.",
    "By morning the low fields were silver with water.",
    "She packed the lamps, the bread and the blue coat.",
    "When the bell rang at noon, the children ran out into the square.",
    "A long letter arrived from the city, full of news.",
    "He read it twice by the window and put it away.",
    "By evening the wind had turned and the clouds broke apart.",
    "Tomorrow, they said, the roads would open again.",
]
BYTES_PER_SECOND = 2 * 24000  # 16-bit mono PCM at 24 kHz


# `leapvox serve` as it was before issue #37: the model loaded on the main thread (see serve.load_on_own_thread)
OLD_SERVER = ("import sys; from leapvox.app import serve; from leapvox.app.cli import main; "
              "serve.load_on_own_thread = lambda a, f, w: serve.load(a, f, pull=True, weights=w); sys.exit(main())")


def start_server(args, old: bool = False) -> tuple[subprocess.Popen, str]:
    run = ["-c", OLD_SERVER] if old else ["-m", "leapvox.app.cli"]
    cmd = [sys.executable, *run, "serve", "--model", args.model, "--weights", args.weights,
           "--port", "0", "--queue", str(max(args.levels)), "--grace", "5"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        sys.stderr.write(line)
        if "serving " in line and " at http://" in line:
            url = line.split(" at ")[1].split()[0]
            break
    if url is None:
        raise SystemExit(f"the server did not start (exit {proc.wait()})")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # drain its log
    return proc, url


def one_request(client, model: str, voice: str, text: str, seed: int) -> dict:
    import openai

    t0 = time.perf_counter()
    first, n = None, 0
    try:
        with client.audio.speech.with_streaming_response.create(
            model=model, voice=voice, input=text, response_format="pcm", extra_body={"seed": seed}
        ) as r:
            for chunk in r.iter_bytes():
                if first is None and chunk:
                    first = time.perf_counter() - t0
                n += len(chunk)
    except openai.RateLimitError:
        return {"status": 429, "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    return {"status": 200, "first_byte_s": first, "wall_s": wall, "audio_s": n / BYTES_PER_SECOND}


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def run_level(client, model: str, voice: str, clients: int, requests: int) -> dict:
    def worker(c: int) -> list[dict]:
        return [one_request(client, model, voice, SENTENCES[(c + i) % len(SENTENCES)], seed=c * 1000 + i)
                for i in range(c, requests, clients)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(worker, range(clients)) for r in rs]
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == 200]
    firsts = [r["first_byte_s"] for r in ok if r["first_byte_s"] is not None]
    audio = sum(r["audio_s"] for r in ok)
    return {
        "clients": clients, "requests": len(results), "ok": len(ok), "refused_429": len(results) - len(ok),
        "wall_s": wall, "requests_per_s": len(ok) / wall, "audio_s": audio, "xrt": audio / wall,
        "xrt_per_request_median": percentile([r["audio_s"] / r["wall_s"] for r in ok], 0.5),
        **{f"first_byte_p{int(q * 100)}_s": percentile(firsts, q) for q in (0.5, 0.9, 0.99)},
    }


def speak_once(args, text: str, seed: int, out: str) -> dict:
    """`leapvox speak` in its own process, as a user runs it; its numbers from its summary line."""
    cmd = [sys.executable, "-m", "leapvox.app.cli", "speak", text, "-o", out, "--model", args.model, "--weights",
           args.weights, "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"([\d.]+) s of audio, .*, ([\d.]+) s, xRT ([\d.]+)", proc.stderr)
    if proc.returncode or not m:
        raise SystemExit(f"speak failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return {"audio_s": float(m[1]), "elapsed_s": float(m[2]), "xrt": float(m[3])}


def request_once(client, url: str, args, text: str, seed: int) -> dict:
    """One streamed PCM request: the client's view, and the server's own numbers for it from /health."""
    import urllib.request

    r = one_request(client, args.model, args.voice, text, seed)
    while True:  # the job's numbers are there once the worker has done its bookkeeping ("busy" until then)
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as h:
            health = json.load(h)
        if not health["busy"]:
            break
        time.sleep(0.02)
    last = health["last"]
    return {"audio_s": r["audio_s"], "wall_s": r["wall_s"], "xrt": r["audio_s"] / r["wall_s"],
            "first_byte_s": r["first_byte_s"], "server_xrt": last["audio_s"] / last["elapsed_s"],
            "server_first_audio_s": last["first_audio_s"]}


def vs_speak(args) -> None:
    """`leapvox speak` and single server requests on the same sentences and seeds, interleaved."""
    import openai

    servers = {"server": start_server(args)}
    if args.old_server:
        servers["old server"] = start_server(args, old=True)
    clients = {name: openai.OpenAI(base_url=url, api_key=args.api_key, max_retries=0, timeout=3600)
               for name, (_, url) in servers.items()}
    names, rows = ["speak", *servers], []
    out = os.path.join(tempfile.mkdtemp(prefix="leapvox-bench-"), "speak.wav")
    try:
        for name in servers:  # warm-up: the first request pays one-time costs, as speak's own warm-up frames
            request_once(clients[name], servers[name][1], args, SENTENCES[0], seed=0)
        for i in range(args.vs_speak):
            text, seed = SENTENCES[i % len(SENTENCES)], 100 + i
            for name in names[i % len(names):] + names[: i % len(names)]:  # rotated: each follows each in turn
                r = (speak_once(args, text, seed, out) if name == "speak"
                     else request_once(clients[name], servers[name][1], args, text, seed))
                rows.append({"round": i, "who": name, **r, "load_avg_1min": os.getloadavg()[0]})
                extra = f" (server-side {r['server_xrt']:.3f})" if "server_xrt" in r else ""
                print(f"round {i}: {name:10s} {r['audio_s']:.2f} s of audio, xRT {r['xrt']:.3f}{extra}, load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    summary = {}
    for name in names:
        mine = [r for r in rows if r["who"] == name]
        summary[name] = {k: median(r[k] for r in mine) for k in ("xrt", "server_xrt", "first_byte_s")
                         if k in mine[0]}
    base = summary["speak"]["xrt"]
    print("\n| who | xRT median (client) | xRT median (server-side) | first byte median | vs speak (client) |")
    print("|---|---|---|---|---|")
    for name in names:
        s = summary[name]
        print(f"| {name} | {s['xrt']:.3f} | {s.get('server_xrt', s['xrt']):.3f} | "
              f"{'-' if 'first_byte_s' not in s else format(s['first_byte_s'], '.2f') + ' s'} | "
              f"{s['xrt'] / base:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "weights": args.weights, "rounds": args.vs_speak, "summary": summary,
                       "runs": rows, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--weights", default="int8")
    p.add_argument("--voice", default="leap")
    p.add_argument("--url", help="an already running server's /v1 URL (else one is started)")
    p.add_argument("--api-key", default=os.environ.get("LEAPVOX_API_KEY", "unused"))
    p.add_argument("--levels", default="1,4,16", help="concurrent clients per level (default 1,4,16)")
    p.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    p.add_argument("--warmup", type=int, default=1, help="requests before the first level (default 1)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--vs-speak", type=int, metavar="ROUNDS", help="compare one request with `leapvox speak` instead "
                   "(ROUNDS interleaved rounds, one sentence each)")
    p.add_argument("--old-server", action="store_true", help="with --vs-speak: also a server started the old way")
    args = p.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]

    import openai

    if args.vs_speak:
        return vs_speak(args)
    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        client = openai.OpenAI(base_url=url, api_key=args.api_key, max_retries=0, timeout=3600)
        for i in range(args.warmup):
            one_request(client, args.model, args.voice, SENTENCES[0], seed=i)
        rows = []
        for clients in args.levels:
            rows.append(run_level(client, args.model, args.voice, clients, max(args.requests, clients)))
            r = rows[-1]
            print(f"clients {clients:2d}: {r['ok']}/{r['requests']} ok, {r['requests_per_s']:.3f} req/s, first byte "
                  f"p50 {r['first_byte_p50_s']:.2f} s p90 {r['first_byte_p90_s']:.2f} s p99 {r['first_byte_p99_s']:.2f}"
                  f" s, xRT {r['xrt']:.2f} (per request {r['xrt_per_request_median']:.2f}), load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print("\n| clients | requests | req/s | first byte p50 / p90 / p99 | xRT (all) | xRT per request (median) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['ok']}/{r['requests']} | {r['requests_per_s']:.3f} | "
              f"{r['first_byte_p50_s']:.2f} / {r['first_byte_p90_s']:.2f} / {r['first_byte_p99_s']:.2f} s | "
              f"{r['xrt']:.2f} | "
              f"{r['xrt_per_request_median']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "weights": args.weights, "levels": rows,
                       "cpus": os.cpu_count(), "load_avg": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
