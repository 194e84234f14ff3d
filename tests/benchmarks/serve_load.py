"""Load benchmark of `leapvox serve` (not a test): requests/s, first-byte latency percentiles and xRT under 1, 4
and 16 concurrent clients, through the real `openai` client, streaming PCM.

    python3 -m tests.benchmarks.serve_load --model demo --weights int8 --requests 16 --json serve-load.json
    python3 -m tests.benchmarks.serve_load --url http://127.0.0.1:8880/v1 --model demo   # a server already running

Without --url it starts `leapvox serve` on a free port with a queue as deep as the largest concurrency (so nothing
is refused), waits for it and stops it after. Each client sends its requests one after another; a level's clock
runs from the first request to the last byte. xRT is the audio delivered per wall second over the whole level (all
clients together), and per request (audio / its own wall time, queueing included). Speed on a shared machine is
noisy: read it with the load average printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "leapvox.app.cli", "serve", "--model", args.model, "--weights", args.weights,
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
    args = p.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]

    import openai

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
