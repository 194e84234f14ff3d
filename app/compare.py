"""`leapvox compare`: the same text, seed and speaker through every available decoding mode, and `auto` beside them
(the mode the model's tune profile picks here, models.auto).

Writes one WAV per mode, compare.json with the raw numbers, and compare.png when matplotlib is importable.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from leapvox.engine.errors import LeapvoxError
from leapvox.engine.options import AUTO, MODE_CHOICES, MODES, check_options, check_text
from leapvox.models.files import write_bytes_atomic

from .common import (
    UsageError,
    backend_args,
    choose,
    cli_name,
    flag_values,
    load,
    model_args,
    open_model,
    speak_options,
    tell,
)

COMPARED = (*MODES, AUTO)  # the default rows: every mode, then what auto picks (the same run as its mode's row)
COLUMNS = [  # (header, format of one row's value); a row is (its name, its StreamStats)
    ("mode", lambda s: s.mode),
    ("xRT", lambda s: f"{s.xrt:.2f}"),
    ("tok/call", lambda s: f"{s.tok_per_call:.2f}"),
    ("pred calls/s", lambda s: f"{s.predictor_calls_per_s:.0f}"),
    ("first audio s", lambda s: "-" if s.first_audio_s is None else f"{s.first_audio_s:.2f}"),
    ("KV MB", lambda s: f"{s.kv_mb:.2f}"),
    ("audio s", lambda s: f"{s.audio_s:.2f}"),
]


def add_commands(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="speak one text through every decoding mode; table, WAVs, JSON (and a plot)",
        description=f"The same text, seed and speaker through each available mode ({', '.join(MODES)}), and auto: "
        "the mode leapvox tune chose for this model here (else ar), its row named 'auto (MODE)'. Prints a table on "
        "stdout; writes MODE.wav, compare.json and (with matplotlib, pip install 'leapvox[plots]') compare.png into "
        "--out. --weights auto follows the tune profile too; the table's last line says what auto chose and why.",
    )
    c.add_argument("text", help="text to speak")
    model_args(c)
    c.add_argument("--out", type=Path, default=Path("leapvox-compare"), help="output folder (./leapvox-compare)")
    c.add_argument("--modes", help=f"comma-separated subset of: {', '.join(COMPARED)} (default: all)")
    c.add_argument("--speaker", help="voice (default: the model's first)")
    c.add_argument("--language", default="auto")
    c.add_argument("--seed", type=int, default=0, help="random seed shared by all modes (default 0)")
    c.add_argument("--max-frames", type=int, help="stop each sentence after N frames")
    c.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    backend_args(c)
    c.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    modes = tuple(m.strip() for m in args.modes.split(",")) if args.modes else COMPARED
    unknown = [m for m in modes if m not in MODE_CHOICES]
    if unknown:
        raise UsageError(f"unknown mode {unknown[0]!r}", hint=f"this build offers: {', '.join(COMPARED)}")
    check_text(args.text.strip(), cli_name("text"))
    check_options(flag_values(args), cli_name)  # a bad --seed or --max-frames: one line now
    out = args.out.expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is not a folder", hint="give a folder for the WAVs and compare.json")
    try:
        out.mkdir(parents=True, exist_ok=True)  # before the load: a folder that cannot be made fails first
    except OSError as e:
        raise LeapvoxError(f"cannot make {args.out}: {e.strerror or e}") from None
    folder = open_model(args)
    # the auto row's mode and --weights auto, by the tune profile, before the load
    choice = choose(args, folder, AUTO if AUTO in modes else "ar")
    opts = speak_options(args, folder, choice=choice)  # a bad --speaker or --language: one line before the load
    from leapvox.engine.fast.fused import prepare_fp32_layers

    prepare_fp32_layers(folder.config.talker.hidden_size)  # the rows' speeds as a later speak would see them
    model = load(args, folder, weights=choice.weights)
    if model.backend_name == "ane" and not args.modes and "windowed" in modes:
        modes = tuple(m for m in modes if m != "windowed")
        tell("the ane backend has no windowed mode (not exported): comparing " + ", ".join(modes))
    try:
        record = compare(model, args.text.strip(), opts, modes, out, choice)
    except OSError as e:  # a full disk, a read-only folder: one line
        raise LeapvoxError(f"cannot write into {args.out}: {e.strerror or e}") from None
    print(record["table"])
    if choice.line():
        tell(choice.line())
    wrote = [f"{m}.wav" for m in modes] + ["compare.json"] + ([record["plot"]] if record["plot"] else [])
    tell(f"wrote {', '.join(wrote)} in {args.out}" +
         ("" if record["plot"] else " (install matplotlib for a plot: pip install 'leapvox[plots]')"))
    return 0


def warm_up(synth, text: str, opts) -> None:
    """A two-frame run so that one-time costs (allocator, kernels) do not land on the first mode measured."""
    for _ in synth.stream(text[:40], replace(opts, max_frames=2)):
        pass


def row_name(name: str, stats) -> str:
    """A row's name in the table and plot: the mode, or for auto the mode it ran, `auto (spec)`."""
    return f"{name} ({stats.mode})" if name == AUTO else name


def table(rows: list) -> str:
    """`rows`: (name, StreamStats) pairs."""
    cells = [[h for h, _ in COLUMNS]] + [[row_name(n, s), *(fmt(s) for _, fmt in COLUMNS[1:])] for n, s in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    return "\n".join(lines)


def plot(rows: list, path: Path) -> bool:
    """A bar chart of xRT and first-audio time per mode; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = [row_name(n, s) for n, s in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.bar(modes, [s.xrt for _, s in rows])
    a.set_title("xRT (audio s / wall s, higher is faster)")
    b.bar(modes, [s.first_audio_s or 0.0 for _, s in rows])
    b.set_title("first audio (s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return True


def compare(model, text: str, opts, modes: tuple[str, ...], out_dir: Path, auto=None) -> dict:
    """Run every mode, write the WAVs, JSON and plot; returns the JSON record. `auto` (a models.auto.Choice) is
    what the mode `auto` runs, and why; its record says both."""
    from leapvox.models.files import write_text_atomic

    from .audio import write_wav

    out_dir.mkdir(parents=True, exist_ok=True)
    synth = model.synthesizer()
    warm_up(synth, text, opts)
    rows, record = [], {"text": text, "model": str(model.path), "weights": model.weights, "seed": opts.seed,
                        "speaker": opts.speaker, "language": opts.language, "modes": {}}
    for mode in modes:
        runs = auto.mode if mode == AUTO else mode
        result = synth.synthesize(text, replace(opts, mode=runs))
        wav = write_wav(out_dir / f"{mode}.wav", result.audio, model.sample_rate)
        stats = result.stats
        rows.append((mode, stats))
        record["modes"][mode] = {**stats.as_dict(), "wav": wav.name}
        if mode == AUTO:
            record["modes"][mode]["why"] = auto.why
    if auto is not None and auto.why:
        record["auto"] = {"mode": auto.mode, "weights": auto.weights, "why": auto.why, "source": auto.source}
    record["plot"] = "compare.png" if plot(rows, out_dir / "compare.png") else None
    write_text_atomic(out_dir / "compare.json", json.dumps(record, indent=2) + "\n")
    record["table"] = table(rows)
    return record
