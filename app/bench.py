"""`leapvox bench`: CPU speed of every decoding mode and weight format on a full-size random-weight checkpoint,
optionally next to the official implementation (`--vs-official`). The work is in leapvox.models.bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path

WEIGHTS = ("fp32", "bf16", "int8")
MODES = ("ar", "spec", "windowed")


def add_commands(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="benchmark modes and weight formats on a full-size random-weight model (table, JSON, plots)",
        description="Build (once, in leapvox's data folder) a random-weight checkpoint of the official architecture "
        "and measure per frame the talker step, code-predictor calls (ar and verify at N = 4..64), codec decode, "
        "overheads, xRT, time to first audio, peak memory and each call's time over its memory-bandwidth floor.",
    )
    b.add_argument("--model-size", choices=["0.6b", "1.7b"], default="0.6b", help="architecture (default 0.6b)")
    b.add_argument("--model", type=Path, help="benchmark this checkpoint folder instead of a random-weight one")
    b.add_argument("--weights", default=",".join(WEIGHTS), help="comma-separated weight formats (default all)")
    b.add_argument("--modes", default=",".join(MODES), help="comma-separated decoding modes (default all)")
    b.add_argument("--frames", type=int, default=25, help="frames per utterance and per timing series (default 25)")
    b.add_argument("--repeats", type=int, default=3, help="repetitions; the minimum time is reported (default 3)")
    b.add_argument(
        "--vs-official",
        action="store_true",
        help="also run the official qwen-tts on the same checkpoint (needs the reference virtualenv)",
    )
    b.add_argument("--threads", type=int, help="torch threads, here and in every worker (default: torch's own choice)")
    b.add_argument("--window", type=int, help="windowed mode's window in frames (default half of --frames, <= 48)")
    b.add_argument(
        "--acceptance",
        type=Path,
        help="a calibrate-tree JSON (rank acceptance): turns verify costs into the speedup-vs-N curve",
    )
    b.add_argument("--json", type=Path, default=Path("bench.json"), help="where to write the raw numbers")
    b.add_argument("--no-plots", action="store_true", help="do not write the PNG plots")
    b.set_defaults(func=cmd_bench)


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    from leapvox.app.common import UsageError

    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise UsageError(f"unknown {what} {bad[0] if bad else '(none)'!r}", hint=f"choose from {', '.join(allowed)}")
    return items


def cmd_bench(args) -> int:
    from leapvox.app.common import UsageError

    weights = _list(args.weights, WEIGHTS, "weight format")
    modes = _list(args.modes, MODES, "mode")
    if args.frames < 2 or args.repeats < 1:
        raise UsageError("--frames must be >= 2 and --repeats >= 1")
    if args.json.parent and not args.json.expanduser().parent.is_dir():
        raise UsageError(f"cannot write {args.json}: its folder does not exist")
    if (args.threads is not None and args.threads < 1) or (args.window is not None and args.window < 1):
        raise UsageError("--threads and --window must be >= 1")
    if args.acceptance is not None and not args.acceptance.is_file():
        raise UsageError(f"no acceptance file {args.acceptance}", hint="write one with leapvox calibrate-tree --json")

    def say(msg: str) -> None:
        print(f"leapvox: {msg}", file=sys.stderr, flush=True)

    if args.threads:
        import os

        import torch

        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers and the official run start with it
        torch.set_num_threads(args.threads)
    from leapvox.models import bench
    from leapvox.models.files import write_text_atomic

    if args.acceptance is not None:
        try:
            bench.read_acceptance(args.acceptance)
        except ValueError as e:  # also a file that is not JSON
            raise UsageError(str(e), hint="write one with leapvox calibrate-tree --json") from None

    if args.model is not None:
        from leapvox.models.checkpoint import check_folder

        folder = check_folder(args.model)
    else:
        folder = bench.checkpoint_for(args.model_size, say=say)
    result = bench.run_bench(
        folder,
        weights,
        modes,
        args.frames,
        args.repeats,
        official=args.vs_official,
        say=say,
        window=args.window,
        acceptance=args.acceptance,
    )
    print(bench.table(result))
    write_text_atomic(args.json, json.dumps(result, indent=1))
    plots = [] if args.no_plots else bench.plot(result, args.json)
    say(f"wrote {args.json}" + "".join(f", {p}" for p in plots))
    return 0
