"""Developer benchmark: a fresh process's time to its first audio (import, model load, first chunk), interleaved.

    python3 -m tests.benchmarks.cold_start [--models demo,PATH] [--rounds 5] [--weights auto] [--json FILE]

Each round starts one child process per model and variant (A B A B ...): the child imports leapvox, loads the model
with `load_checkpoint` and streams one sentence until its first chunk. Variants: `skeleton`, what leapvox does (the
modules are built on the meta device with torch.nn.init switched off, models/checkpoint.py `skeleton`), and `init`,
the same with the random init left on (how it loaded before: a random init on meta imports torch._dynamo). The table
gives medians and ranges over rounds per phase, whether torch._dynamo was imported, and the ratio of the process
times. Not a test: pytest collects nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = "The quick brown fox jumps over the lazy dog."
VARIANTS = ("skeleton", "init")

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
import leapvox.models.checkpoint as C
from leapvox.engine.options import SynthesisOptions
if {variant!r} == "init":
    C.skeleton = lambda: torch.device("meta")  # the random init runs on meta, as before
t1 = time.perf_counter()
m = C.load_checkpoint({model!r}, weights={weights!r})
t2 = time.perf_counter()
next(iter(m.synthesizer().stream({text!r}, SynthesisOptions(max_frames=40))))
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "first_chunk_s": t3 - t2,
                   "dynamo": "torch._dynamo" in sys.modules}}))
"""


def resolve(name: str) -> str:
    if name == "demo":
        from leapvox.models.catalog import DEMO_DIR

        return str(DEMO_DIR)
    return str(Path(name).resolve())


def one(model: str, variant: str, weights: str, threads: int) -> dict:
    code = CHILD.format(threads=threads, variant=variant, model=model, weights=weights, text=TEXT)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"cold_start: the child failed for {model} ({variant}):\n{r.stderr[-2000:]}")
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "process_s": wall}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.cold_start", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo", help="comma-separated: demo (the bundled model) or checkpoint folders")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--weights", default="auto", help="weight format (default auto)")
    p.add_argument("--threads", type=int, default=2, help="torch threads in the child (default 2)")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        p.error("--rounds and --threads must be >= 1")
    models = {name: resolve(name) for name in args.models.split(",")}
    runs: dict[str, dict[str, list[dict]]] = {m: {v: [] for v in VARIANTS} for m in models}
    for r in range(args.rounds):
        for name, path in models.items():
            for v in VARIANTS:
                runs[name][v].append(one(path, v, args.weights, args.threads))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    phases = ("import_s", "load_s", "first_chunk_s", "process_s")
    print(f"{'model':<12} {'variant':<9} " + " ".join(f"{ph[:-2]:>18}" for ph in phases) + "  dynamo  ratio")
    result = {"text": TEXT, "weights": args.weights, "threads": args.threads, "rounds": args.rounds, "models": {}}
    for name in models:
        base = statistics.median(x["process_s"] for x in runs[name]["skeleton"])
        result["models"][name] = {}
        for v in VARIANTS:
            xs = runs[name][v]
            med = {ph: statistics.median(x[ph] for x in xs) for ph in phases}
            ratio = med["process_s"] / base
            dyn = sorted({x["dynamo"] for x in xs})
            print(f"{name:<12} {v:<9} " + " ".join(f"{_cell([x[ph] for x in xs]):>18}" for ph in phases)
                  + f"  {'/'.join(map(str, dyn)):<6}  {ratio:.2f}x")
            result["models"][name][v] = {"median": med, "runs": xs, "process_over_skeleton": ratio}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
