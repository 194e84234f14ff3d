"""Developer benchmark: first audio of text that arrives while it is spoken (#40), against the producer's rate.

    python3 -m tests.benchmarks.first_audio_producer [--models demo,0.6b] [--rates 3,10,30] [--rounds 3]

A producer thread writes `TEXT` word by word at R words per second into a `textfeed.TextPieces`; the synthesis
stream (`Synthesizer.stream_text`, speak's path for a pipe) speaks it. Each round runs every model, text layout and
rate once, interleaved (A B C ... A B C ...); the table gives the median [min-max] over rounds, on one clock from the
producer's first word, of: the first audio chunk; when the producer finished its first sentence; the stalls a
listener who starts playing at the first chunk would hear (the seconds the next chunk came after the audio so far
ran out, summed); and when that listener hears the last sample. With the streaming layout a model without a text
front end (the 0.6B) starts a sentence while it is being written (in-sentence streaming); the demo reads phonemes of
whole sentences, so it waits for the sentence in both layouts. `0.6b`: the random-weight full-size checkpoint of
bench.py (it never says EOS: every sentence runs to --frames). Not a test: pytest collects nothing here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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
    first, stall, heard = None, 0.0, 0.0  # heard: when a listener playing from the first chunk is done so far
    for chunk in synth.stream_text(pieces, opts):
        if not len(chunk.audio):
            continue
        now, seconds = time.perf_counter() - t0, len(chunk.audio) / chunk.sample_rate
        first = now if first is None else first
        stall, heard = stall + max(0.0, now - heard) * (heard > 0), max(heard, now) + seconds
    producer.join()
    return {"first_audio_s": first, "first_sentence_written_s": marks.get("sentence"), "stall_s": stall,
            "last_heard_s": heard, "frames": chunk.stats.frames, "xrt": chunk.stats.xrt}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.first_audio_producer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo,0.6b", help="comma-separated: demo, 0.6b (default both)")
    p.add_argument("--rates", default="3,10,30", help="producer rates in words per second (default 3,10,30)")
    p.add_argument("--layouts", default="non-streaming,streaming,auto", help="comma-separated text layouts")
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
    load_before = [round(x, 2) for x in os.getloadavg()]
    combos = [(m, lay, float(r)) for m in synths for lay in args.layouts.split(",") for r in args.rates.split(",")]
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name, layout, rate in combos:
            synth, base = synths[name]
            out = first_audio(synth, replace(base, seed=r, text_layout=layout), rate)
            runs.setdefault(f"{name}, {layout}, {rate:g} words/s", []).append(out)
            print(f"round {r + 1}: {name}, {layout}, {rate:g} words/s: first audio {out['first_audio_s']:.2f} s, "
                  f"stalls {out['stall_s']:.2f} s", file=sys.stderr, flush=True)  # progress: a long run may die
    load = [round(x, 2) for x in os.getloadavg()]
    keys = ("first_audio_s", "first_sentence_written_s", "stall_s", "last_heard_s", "xrt")
    print(f"| model, text layout, producer | first audio s | first sentence written s | stalls s | last heard s | xRT "
          f"|  ({args.weights}, {args.threads} threads, {args.frames} frames a sentence, median [min-max] of "
          f"{args.rounds}; load average {load_before} before, {load} after)")
    print("|---|---|---|---|---|---|")
    for key, rs in runs.items():
        print(f"| {key} | {' | '.join(_cell([x[k] for x in rs]) for k in keys)} |")
    from leapvox.engine.synthesis import OPEN_LOOKAHEAD
    from leapvox.models.files import write_text_atomic

    write_text_atomic(args.json, json.dumps({"weights": args.weights, "threads": args.threads, "frames": args.frames,
                                             "text": TEXT, "open_lookahead_tokens": OPEN_LOOKAHEAD,
                                             "load_average": [load_before, load], "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
