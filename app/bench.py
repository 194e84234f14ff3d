"""`leapvox bench`: this machine, this model. xRT and time to first audio of every decoding mode and weight format,
measured the way `leapvox speak` runs (load_model(...).synthesizer().stream(text, opts), the final chunk's stats),
in interleaved rounds (A B C, A B C, ...) so that a machine that slows down or speeds up mid-run shifts every
configuration alike; medians are reported.

The developer benchmark (random-weight full-size checkpoints, per-call floors, the official package side by side,
plots) is tests/benchmarks/bench.py in the source tree: `python -m tests.benchmarks.bench --help`."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from leapvox.app.common import UsageError, tell
from leapvox.engine.errors import LeapvoxError
from leapvox.engine.options import MODES, WEIGHT_FORMATS, build_options, validate
from leapvox.models.catalog import default_model
from leapvox.models.files import output_problem

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again "
    "before the sun goes down."
)


def add_commands(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="this machine, this model: speed per decoding mode and weight format",
        description="Speak one text with every decoding mode and weight format on this machine, through the same "
        "streaming path as `leapvox speak`, in interleaved rounds, and report the median xRT (audio seconds per "
        "wall second; bigger is faster) and time to first audio. Developer benchmarks (random-weight full-size "
        "checkpoints, bandwidth floors, the official package) are tests/benchmarks/bench.py in the source tree.",
    )
    b.add_argument(
        "--model",
        default=default_model(),
        help="catalog name, Hub repo or checkpoint folder (default: $LEAPVOX_MODEL, else the bundled demo model)",
    )
    b.add_argument("--weights", help="comma-separated weight formats (default: every format that runs here)")
    b.add_argument("--modes", default=",".join(MODES), help="comma-separated decoding modes (default all)")
    b.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default 3)")
    b.add_argument("--text", default=TEXT, help="the text to speak (default: two clauses, about 7 s of speech)")
    b.add_argument("--max-frames", type=int, help="cap each utterance at this many 80 ms frames")
    b.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    b.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    b.set_defaults(func=cmd_bench)


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise UsageError(f"unknown {what} {bad[0] if bad else '(none)'!r}", hint=f"choose from {', '.join(allowed)}")
    return items


def run_once(synth, text: str, opts) -> dict:
    """One utterance through the stream; the final chunk's stats, as numbers."""
    stats = None
    for chunk in synth.stream(text, opts):
        stats = chunk.stats
    return {
        "xrt": stats.xrt,
        "first_audio_s": stats.first_audio_s,
        "elapsed_s": stats.elapsed_s,
        "audio_s": stats.audio_s,
        "frames": stats.frames,
        "stop_reason": stats.stop_reason,
        "tok_per_call": stats.tok_per_call,
    }


def run(models: dict, modes: list[str], text: str, rounds: int, max_frames: int | None = None, say=None) -> dict:
    """Every (mode, weight format) once per round, in the same order each round, after one untimed warm-up each.
    `models`: weight format -> LoadedModel. Returns {mode: {weights: record}} with medians over the rounds."""
    say = say or (lambda m: None)
    configs = []
    for mode in modes:
        for w, model in models.items():
            opts = validate(build_options({"mode": mode, "seed": 0, "max_frames": max_frames}, model.defaults),
                            model.config)
            configs.append((mode, w, model.synthesizer(), opts))
    for _mode, _w, synth, opts in configs:  # warm-up: first-call allocations and lazy setup, not timed
        run_once(synth, text, opts)
    runs: dict = {(mode, w): [] for mode, w, _, _ in configs}
    for r in range(rounds):
        say(f"round {r + 1} of {rounds}")
        for mode, w, synth, opts in configs:
            runs[mode, w].append(run_once(synth, text, opts))
    out: dict = {}
    for (mode, w), rs in runs.items():
        first = [x["first_audio_s"] for x in rs if x["first_audio_s"] is not None]
        out.setdefault(mode, {})[w] = {
            "xrt": statistics.median(x["xrt"] for x in rs),
            "first_audio_s": statistics.median(first) if first else None,
            "xrt_runs": [x["xrt"] for x in rs],
            "first_audio_runs": [x["first_audio_s"] for x in rs],
            "audio_s": rs[-1]["audio_s"],
            "frames": rs[-1]["frames"],
            "stop_reason": rs[-1]["stop_reason"],
            **({"tokens_per_call": statistics.median(x["tok_per_call"] for x in rs)} if mode == "spec" else {}),
        }
    return out


def table(result: dict) -> str:
    lines = [
        f"{result['model']}  {result['threads']} threads, {result['rounds']} interleaved round(s); medians",
        f"{'mode':<10}{'weights':<9}{'xRT':>8}{'first audio s':>15}{'audio s':>9}{'frames':>8}",
    ]
    for mode, per in result["results"].items():
        for w, rec in per.items():
            first = "-" if rec["first_audio_s"] is None else f"{rec['first_audio_s']:.2f}"
            lines.append(
                f"{mode:<10}{w:<9}{rec['xrt']:>8.2f}{first:>15}{rec['audio_s']:>9.2f}{rec['frames']:>8d}"
            )
    return "\n".join(lines)


def cmd_bench(args) -> int:
    from leapvox.app.common import require_model

    weights = _list(args.weights or ",".join(WEIGHT_FORMATS), WEIGHT_FORMATS, "weight format")
    modes = _list(args.modes, MODES, "mode")
    if args.rounds < 1:
        raise UsageError("--rounds must be >= 1")
    if (args.threads is not None and args.threads < 1) or (args.max_frames is not None and args.max_frames < 1):
        raise UsageError("--threads and --max-frames must be >= 1")
    if not args.text.strip():
        raise UsageError("the text is empty", hint="give some words to speak")
    if args.json is not None and (problem := output_problem(args.json.expanduser())):
        raise UsageError(f"cannot write {args.json}: {problem}")
    name = require_model(args)

    import torch

    from leapvox.models.files import write_text_atomic
    from leapvox.models.load import load_model, open_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.weights is None:  # every format: those this machine cannot run are left out, with the reason
        from leapvox.engine.fast.quant import format_unavailable_reason

        for w in list(weights):
            if why := format_unavailable_reason(w):
                tell(f"leaving out {w}: {why}")
                weights.remove(w)
    models, folder = {}, open_model(name, say=tell)
    from leapvox.engine.fast.fused import prepare_fp32_layers

    prepare_fp32_layers(folder.config.talker.hidden_size)  # fp32 timed as a later speak runs it
    for w in weights:
        tell(f"loading {name} ({w})")
        models[w] = load_model(folder, w, say=tell)
    result = {
        "model": str(name),
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "text": args.text,
        "max_frames": args.max_frames,
        "torch": torch.__version__,
        "results": run(models, modes, args.text, args.rounds, args.max_frames, say=tell),
    }
    print(table(result))
    sys.stdout.flush()
    if args.json is not None:
        try:
            write_text_atomic(args.json.expanduser(), json.dumps(result, indent=1))
        except OSError as e:
            raise LeapvoxError(f"cannot write {args.json}: {e.strerror or e}") from None
        tell(f"wrote {args.json}")
    return 0
