"""Developer benchmark: first audio of text that arrives while it is spoken (#40), against the producer's rate.

    python3 -m tests.benchmarks.first_audio_producer [--models demo,0.6b] [--rates 3,10,30] [--rounds 3]

A producer thread writes `TEXT` word by word at R words per second into a `textfeed.TextPieces`; the synthesis
stream (`Synthesizer.stream_text`, speak's path for a pipe) speaks it. Each round runs every model, text layout and
rate once, interleaved (A B C ... A B C ...); the table gives the median [min-max] over rounds of the seconds from the
producer's first word to the first audio chunk, and of when the producer finished its first sentence, on the same
clock. `0.6b`: the random-weight full-size checkpoint of bench.py. Not a test: pytest collects nothing here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

TEXT = "The quick brown fox jumps over the lazy dog near the river bank. It was a bright cold day in April."
RESULTS = Path(__file__).parent / "first-audio-producer.json"


def produce(pieces, words: list[str], rate: float, t0: float, marks: dict) -> None:
    """Write `words` at `rate` words per second from `t0`; mark when the first sentence was all written."""
    for i, w in enumerate(words):
        time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        pieces.put(w if i == 0 else " " + w)
        if w.endswith(".") and "sentence" not in marks:
            marks["sentence"] = time.perf_counter() - t0
    pieces.close()


def first_audio(synth, opts, rate: float) -> dict:
    from leapvox.engine.textfeed import TextPieces

    pieces, marks, t0 = TextPieces(idle_s=0.6), {}, time.perf_counter()
    producer = threading.Thread(target=produce, args=(pieces, TEXT.split(), rate, t0, marks), daemon=True)
    producer.start()
    first = None
    for chunk in synth.stream_text(pieces, opts):
        if first is None and len(chunk.audio):
            first = time.perf_counter() - t0
    producer.join()
    return {"first_audio_s": first, "first_sentence_written_s": marks.get("sentence"),
            "frames": chunk.stats.frames, "xrt": chunk.stats.xrt}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.first_audio_producer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo,0.6b", help="comma-separated: demo, 0.6b (default both)")
    p.add_argument("--rates", default="3,10,30", help="producer rates in words per second (default 3,10,30)")
    p.add_argument("--layouts", default="non-streaming,streaming", help="comma-separated text layouts")
    p.add_argument("--weights", default="auto", help="weight format (default auto)")
    p.add_argument("--frames", type=int, default=12, help="frame cap per sentence (default 12)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--json", type=Path, default=RESULTS, help=f"write the numbers here (default {RESULTS.name})")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from leapvox.models.load import load_model
    from tests.benchmarks.bench import checkpoint_for

    synths = {}
    for name in args.models.split(","):
        model = load_model("demo" if name == "demo" else checkpoint_for(name), weights=args.weights)
        base = replace(model.defaults, runaway_guard=False, mode="ar", max_frames=args.frames)
        synths[name] = (model.synthesizer(), base)
        list(synths[name][0].stream("Warm up.", replace(base, max_frames=2, seed=1)))
    combos = [(m, lay, float(r)) for m in synths for lay in args.layouts.split(",") for r in args.rates.split(",")]
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name, layout, rate in combos:
            synth, base = synths[name]
            out = first_audio(synth, replace(base, seed=r, text_layout=layout), rate)
            runs.setdefault(f"{name}, {layout}, {rate:g} words/s", []).append(out)
    print(f"| model, text layout, producer | first audio s | first sentence written s | xRT |  ({args.weights}, "
          f"{args.threads} threads, {args.frames} frames a sentence, median [min-max] of {args.rounds})")
    print("|---|---|---|---|")
    for key, rs in runs.items():
        cells = [_cell([x[k] for x in rs]) for k in ("first_audio_s", "first_sentence_written_s", "xrt")]
        print(f"| {key} | {' | '.join(cells)} |")
    from leapvox.models.files import write_text_atomic

    write_text_atomic(args.json, json.dumps({"weights": args.weights, "threads": args.threads, "frames": args.frames,
                                             "text": TEXT, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
