"""Developer benchmark: peak memory of speaking a few frames under a large frame cap, one fresh process per cap.

    python3 -m tests.benchmarks.kv_memory [--weights auto] [--caps 32,2000,8191] [--frames 32] [--json FILE]

`ar` preallocates the talker's KV cache for the prompt plus the frame cap (the runaway guard's, or --max-frames
with --no-guard: 8,191 by default). Each cap runs in its own process: the random-weight 0.6B checkpoint of
bench.py, `bench.TEXT`, streamed in 16-frame chunks (as `speak -o FILE`), stopped after --frames frames; the table
gives the process's peak and final resident memory (MiB). Not a test: pytest collects nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def worker(weights: str, cap: int, frames: int, threads: int) -> dict:
    from dataclasses import replace

    import torch

    from leapvox.models.load import load_model

    from .bench import TEXT, checkpoint_for, rss_mb

    torch.set_num_threads(threads)
    model = load_model(checkpoint_for("0.6b"), weights=weights)
    opts = replace(model.defaults, max_frames=cap, seed=0, runaway_guard=False)
    spoken = 0
    for chunk in model.synthesizer().stream(TEXT, opts, first_chunk=16):
        spoken += chunk.codes.shape[0]
        if spoken >= frames:
            break
    mem = rss_mb()
    return {"cap": cap, "frames": spoken, "peak_mib": round(mem["peak_rss_mb"]), "rss_mib": round(mem["rss_mb"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.kv_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default="auto", help="weight format (default auto)")
    p.add_argument("--caps", default="32,2000,8191", help="comma-separated frame caps (default 32,2000,8191)")
    p.add_argument("--frames", type=int, default=32, help="frames spoken before stopping (default 32)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--json", type=Path, help="write the numbers here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(**json.loads(args.worker))), flush=True)
        return 0
    if sys.platform != "linux":
        p.error("reads /proc/self/status: Linux only")
    rows = []
    for cap in (int(c) for c in args.caps.split(",")):
        job = json.dumps({"weights": args.weights, "cap": cap, "frames": args.frames, "threads": args.threads})
        done = subprocess.run([sys.executable, "-m", "tests.benchmarks.kv_memory", "--worker", job],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"cap {cap:>5} frames  spoke {rows[-1]['frames']:>3}  peak {rows[-1]['peak_mib']:>5} MiB  "
              f"now {rows[-1]['rss_mib']:>5} MiB", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"weights": args.weights, "threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
