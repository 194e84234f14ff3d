"""Developer benchmark: what `leapvox tune` costs on the random-weight 0.6B and 1.7B, stage by stage.

    python3 -m tests.benchmarks.tune_cost [--sizes 0.6b,1.7b] [--threads 2] [--utterances 16]
        [--json tests/benchmarks/tune-cost.json]

Each size runs `leapvox tune CHECKPOINT --json` once, in its own process under a fresh LEAPVOX_HOME (nothing
resumed, the real data folder untouched), on bench.py's random-weight checkpoint (`checkpoint_for`, built on first
use, ~1.8 GB for the 0.6B and ~4.5 GB for the 1.7B in leapvox's data folder). The table gives each stage's seconds
from the profile, the expected time tune stated before starting, the decision, tokens per call and the load average
around the run (the box is shared: read the load column before comparing runs). Not a test: pytest collects
nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_tune(folder: Path, threads: int, utterances: int) -> dict:
    """One fresh `leapvox tune` of `folder` in a subprocess; its profile, stated estimate, wall time and load."""
    from leapvox.engine.fast import kernels

    with tempfile.TemporaryDirectory(prefix="tune-cost-") as home:
        cache = kernels.cache_dir()
        if cache.is_dir():  # this environment's compiled kernels, not a fresh build inside the timing
            (Path(home) / "cache").mkdir()
            (Path(home) / "cache" / "kernels").symlink_to(cache, target_is_directory=True)
        env = {**os.environ, "LEAPVOX_HOME": home}
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "leapvox.app.cli", "tune", str(folder), "--threads", str(threads),
                            "--utterances", str(utterances), "--json"], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()
    if p.returncode != 0:
        raise SystemExit(f"leapvox tune failed ({p.returncode}):\n{p.stderr[-3000:]}")
    said = re.search(r"about (\d+) (s|min) \(", p.stderr)
    stated = None if not said else int(said.group(1)) * (60 if said.group(2) == "min" else 1)
    return {"profile": json.loads(p.stdout), "stated_s": stated, "wall_s": round(wall, 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "stderr_head": p.stderr.splitlines()[:3]}


def table(rows: dict) -> str:
    stages = ("frames", "offsets", "tree", "formats", "decision")
    out = ["| model | " + " | ".join(f"{s} s" for s in stages) + " | total (wall) | stated | load 1-min before/after "
           "| decision | tokens/call |", "|---" * (len(stages) + 6) + "|"]
    for size, r in rows.items():
        p = r["profile"]
        sec = p["stage_seconds"]
        d = p["decision"]
        out.append(f"| random {size} | " + " | ".join(f"{sec.get(s, 0):.0f}" for s in stages)
                   + f" | {r['wall_s'] / 60:.1f} min | {(r['stated_s'] or 0) / 60:.1f} min | "
                   f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} | {d['mode']}, {d['weights']} | "
                   f"{p['tokens_per_call']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.tune_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="0.6b,1.7b", help="comma list of 0.6b, 1.7b (default both)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the tune (default 2)")
    p.add_argument("--utterances", type=int, default=16, help="tune's --utterances (default 16, its default)")
    p.add_argument("--json", type=Path, default=Path("tests/benchmarks/tune-cost.json"))
    args = p.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not sizes or any(s not in ("0.6b", "1.7b") for s in sizes):
        p.error("--sizes takes a comma list of 0.6b, 1.7b")

    from tests.benchmarks.bench import checkpoint_for

    rows = {}
    for size in sizes:
        folder = checkpoint_for(size, say=print)
        print(f"tuning the random {size} ({args.threads} threads, {args.utterances} sentences) ...", flush=True)
        rows[size] = run_tune(folder, args.threads, args.utterances)
        r = rows[size]
        print(f"  {r['wall_s'] / 60:.1f} min (stated {(r['stated_s'] or 0) / 60:.1f}); "
              f"{r['profile']['decision']['why']}", flush=True)
    print(table(rows))
    out = {"threads": args.threads, "utterances": args.utterances, "cpu": rows[sizes[0]]["profile"]["machine"],
           "cores": os.cpu_count(), "runs": rows}
    args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
