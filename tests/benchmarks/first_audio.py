"""Developer benchmark: time to first audio by text layout and first-chunk size, in one process, interleaved.

    python3 -m tests.benchmarks.first_audio [--weights auto] [--rounds 3] [--frames 12] [--json FILE]

The random-weight 0.6B checkpoint of bench.py, `bench.TEXT`, `ar`, 2 threads by default. Each round runs every
combination of --layouts and --first-chunks once (A B C D A B C D ...) through bench.end_to_end (speak's streaming
path) for --frames frames, and the table gives the median and range over rounds of the time to the first audio
chunk, the prefill time and xRT. Not a test: pytest collects nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch


def _cell(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.first_audio", description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default="auto", help="weight format (default auto)")
    p.add_argument("--layouts", default="non-streaming,streaming", help="comma-separated text layouts")
    p.add_argument("--first-chunks", default="2,1", help="comma-separated first-chunk sizes in frames")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--frames", type=int, default=12, help="frames per run (default 12)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.frames < 2 or args.threads < 1:
        p.error("--rounds and --threads must be >= 1, --frames >= 2")
    torch.set_num_threads(args.threads)

    import leapvox.engine.streaming as streaming
    from leapvox.models.load import load_model
    from tests.benchmarks.bench import TEXT, checkpoint_for, end_to_end

    model = load_model(checkpoint_for("0.6b"), weights=args.weights)
    synth = model.synthesizer()
    base = replace(model.defaults, runaway_guard=False, mode="ar")
    end_to_end(synth, replace(base, max_frames=4, seed=1000), TEXT)  # warm-up
    combos = [(lay, int(c)) for lay in args.layouts.split(",") for c in args.first_chunks.split(",")]
    runs: dict[str, list[dict]] = {}
    default_first = streaming.FIRST_CHUNK_FRAMES
    try:
        for r in range(args.rounds):
            for layout, first in combos:
                streaming.FIRST_CHUNK_FRAMES = first  # end_to_end reads it at call time
                out = end_to_end(synth, replace(base, max_frames=args.frames, seed=r, text_layout=layout), TEXT)
                runs.setdefault(f"{layout}, first chunk {first}", []).append(
                    {k: out[k] for k in ("first_audio_s", "prefill_ms", "xrt", "frames")})
    finally:
        streaming.FIRST_CHUNK_FRAMES = default_first
    print(f"| text layout, first chunk | first audio s | prefill ms | xRT |  ({args.weights}, {args.threads} threads, "
          f"median [min-max] of {args.rounds})")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        cells = [_cell([x[key] for x in rs], fmt) for key, fmt in
                 (("first_audio_s", "{:.2f}"), ("prefill_ms", "{:.0f}"), ("xrt", "{:.3f}"))]
        print(f"| {name} | {' | '.join(cells)} |")
    if args.json:
        from leapvox.models.files import write_text_atomic

        write_text_atomic(args.json, json.dumps({"weights": args.weights, "threads": args.threads, "runs": runs},
                                                indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
