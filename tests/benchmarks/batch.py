"""Throughput benchmark of `leapvox batch` (not a test): items/s and xRT of N short demo items through one local
worker, two local workers and a local Ray cluster (two actors), --threads each, and Ray's overhead against the
local run with as many workers.

    python3 -m tests.benchmarks.batch --items 200 --rounds 3 --json tests/benchmarks/batch-demo.json

Each run is a fresh `leapvox batch` process into an empty folder, timed from its start to its exit: the Python
start, the model loads (one per worker) and, for Ray, starting the local cluster are all in it, as a user meets
them. xRT is the audio written per wall second; `synth xRT` is the audio over the workers' own synthesis seconds
(the manifest's timings, summed), which leaves the start-up out. The routes run interleaved (A B C, B C A, C A B,
...) and the table quotes medians. Speed on a shared machine is noisy: read it with the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

SENTENCES = [
    "The river rose slowly through the night.",
    "By morning the fields were silver with water.",
    "She packed the lamps and the bread.",
    "The bell rang at noon.",
    "A long letter arrived from the city.",
    "He read it twice by the window.",
    "By evening the wind had turned.",
    "Tomorrow the roads would open again.",
]


def routes(args) -> dict[str, list[str]]:
    t = ["--threads", str(args.threads)]
    return {"local 1 worker": ["--workers", "1", *t], "local 2 workers": ["--workers", "2", *t],
            "ray local, 2 actors": ["--ray", "local", "--workers", "2", *t]}


def run_once(args, items: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "leapvox.app.cli", "batch", str(items), "--out", str(out), "--model",
               args.model, "--weights", args.weights, "-q", *extra]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr}")
        entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    audio = sum(e["seconds"] for e in entries)
    synth = sum(e["timings"]["synth_s"] for e in entries)
    return {"wall_s": wall, "items": len(entries), "audio_s": audio, "items_per_s": len(entries) / wall,
            "xrt": audio / wall, "synth_xrt": audio / synth, "load": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="demo")
    p.add_argument("--weights", default="fp32")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker, the same on every route")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    names = routes(args)
    with tempfile.TemporaryDirectory() as tmp:
        items = Path(tmp) / "items.jsonl"
        items.write_text("".join(json.dumps({"id": f"b{n:04d}", "text": SENTENCES[n % len(SENTENCES)]}) + "\n"
                                 for n in range(args.items)))
        runs = {name: [] for name in names}
        order = list(names)
        for r in range(args.rounds):
            for name in order[r % len(order):] + order[: r % len(order)]:  # A B C, B C A, C A B
                res = run_once(args, items, names[name])
                runs[name].append(res)
                print(f"round {r + 1} {name}: {res['wall_s']:.1f} s, {res['items_per_s']:.2f} items/s, "
                      f"xRT {res['xrt']:.2f} (load {res['load']:.1f})", file=sys.stderr, flush=True)
    med = {name: {k: median(x[k] for x in rs) for k in ("wall_s", "items_per_s", "xrt", "synth_xrt", "load")}
           for name, rs in runs.items()}
    local2, ray = med["local 2 workers"], med["ray local, 2 actors"]
    overhead = {"wall_ratio": ray["wall_s"] / local2["wall_s"], "extra_s": ray["wall_s"] - local2["wall_s"]}
    print(f"\n{args.items} items, {args.rounds} rounds interleaved, medians ({args.model}, {args.weights}, "
          f"{len(os.sched_getaffinity(0))} cores)\n")
    print("| route | wall s | items/s | xRT | synth xRT | load |\n|---|---|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['wall_s']:.1f} | {m['items_per_s']:.3f} | {m['xrt']:.3f} | {m['synth_xrt']:.3f} | "
              f"{m['load']:.1f} |")
    print(f"\nRay against 2 local workers: {overhead['wall_ratio']:.2f}x the wall time, "
          f"{overhead['extra_s']:+.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"items": args.items, "rounds": args.rounds, "model": args.model,
                                         "weights": args.weights, "threads": args.threads,
                                         "cores": len(os.sched_getaffinity(0)),
                                         "routes": {n: names[n] for n in names}, "median": med,
                                         "ray_overhead_vs_local_2": overhead, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
