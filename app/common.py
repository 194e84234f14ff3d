"""What the commands share: exit codes, usage errors, messages, --model/--weights/--backend and reading the text.
Only argparse and the standard library at import time, and nothing here imports the dispatcher (cli.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from leapvox.engine.options import BACKEND_CHOICES, COMPUTE_UNIT_CHOICES
from leapvox.models.catalog import default_model

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
WEIGHT_CHOICES = ("fp32", "bf16", "int8")  # engine.quant.WEIGHT_FORMATS (torch-free here, checked by a test)
DEFAULT_WEIGHTS = "int8"  # --weights default: the fastest on CPU, fidelity measured (tests/benchmarks/README.md)


class UsageError(Exception):
    """Bad command-line usage detected after parsing (exit 2)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def say(msg: str) -> None:
    """A message on stderr (stdout is for data)."""
    print(msg, file=sys.stderr, flush=True)


def tell(msg: str) -> None:
    """`say` with the program's name in front."""
    say(f"leapvox: {msg}")


def error_line(e: Exception) -> str:
    """One line: the message, then the hint if there is one."""
    hint = getattr(e, "hint", None)
    return f"leapvox: error: {e}" + (f" (hint: {hint})" if hint else "")


def quiet_or(args, out=tell):
    """`out`, or a function that says nothing with --quiet."""
    return (lambda msg: None) if getattr(args, "quiet", False) else out


def model_args(p: argparse.ArgumentParser) -> None:
    """--model and --weights on a command that loads a model."""
    p.add_argument(
        "--model",
        default=default_model(),
        help="catalog name (leapvox models list), Hub repo org/name[@revision] or checkpoint folder "
        "(default: $LEAPVOX_MODEL, else the bundled demo model)",
    )
    p.add_argument(
        "--weights", choices=WEIGHT_CHOICES, default=DEFAULT_WEIGHTS,
        help=f"weight format: fp32, bf16, or int8 (8-bit talker and predictor weights, bf16 activations) "
        f"(default {DEFAULT_WEIGHTS})",
    )
    p.add_argument("--dtype", dest="weights", choices=["fp32", "bf16"], help=argparse.SUPPRESS)  # old name


def backend_args(p, default: str = "auto", help: str | None = None) -> None:
    """--backend and --compute-units on a command that runs the model."""
    p.add_argument("--backend", choices=BACKEND_CHOICES, default=default,
                   help=help or "what runs the talker and code predictor: cpu = PyTorch; ane = the model's Core ML "
                   "export (leapvox export-coreml) on macOS 15+, Neural Engine; auto = ane on a Mac with coremltools "
                   "and an export of this model, else cpu (default auto)")
    p.add_argument("--compute-units", choices=COMPUTE_UNIT_CHOICES, default="cpu_and_ne",
                   help="ane backend: where Core ML may run: cpu_and_ne (CPU + Neural Engine, default), all (also "
                   "the GPU), cpu_only")


def check_backend(args) -> None:
    """--backend ane where Core ML predictions cannot run: a one-line usage error (exit 2) before any loading."""
    if getattr(args, "backend", "auto") != "ane":
        return
    from leapvox.engine.coreml_runtime import unavailable_reason

    why = unavailable_reason()
    if why:
        raise UsageError(why, hint="use --backend cpu")


def require_model(args) -> str:
    if not args.model:
        raise UsageError("no model given", hint="pass --model qwen3-tts-0.6b, or --model PATH to a checkpoint folder")
    return args.model


def load(args, pull: bool = False, say=tell):
    """The model the command's --model, --weights and --backend name, ready to speak."""
    from leapvox.models.load import load_model

    check_backend(args)  # --backend ane off macOS: exit 2 before downloading or loading anything
    return load_model(require_model(args), args.weights, getattr(args, "backend", "cpu"),
                      compute_units=getattr(args, "compute_units", "cpu_and_ne"), pull=pull, say=say,
                      progress=pull and sys.stderr.isatty() and not getattr(args, "quiet", False))


def read_text(args) -> str:
    """The text of `TEXT`, `-` (standard input) or `-f FILE`, stripped; a usage error when there is none."""
    if args.file is not None and args.text is not None:
        raise UsageError("give the text either as an argument or with -f, not both")
    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
    elif args.text == "-":
        text = sys.stdin.read()
    elif args.text is not None:
        text = args.text
    else:
        raise UsageError("no text given", hint='leapvox speak "Hello" -o hello.wav, or - to read standard input')
    text = text.strip()
    if not text:
        raise UsageError("the text is empty", hint="give some words to speak")
    return text


def given(obj, **values):
    """replace() with only the options the user gave (None = not given)."""
    return replace(obj, **{k: v for k, v in values.items() if v is not None})


def sampling_args(p, args):
    """SamplingParams `p` with the --greedy, --temperature, --top-k and --top-p that `args` has and the user gave."""
    p = replace(p, do_sample=p.do_sample and not args.greedy)
    return given(p, **{k: getattr(args, k, None) for k in ("temperature", "top_k", "top_p")})


def speak_options(args, defaults):
    """SynthesisOptions from speak's flags over the model's defaults."""
    opts = replace(
        defaults,
        language=args.language,
        instruct=args.instruct,
        text_layout=args.text_layout,
        talker=sampling_args(defaults.talker, args),
        predictor=sampling_args(defaults.predictor, args),
        seed=args.seed,
        runaway_guard=not args.no_guard,
        mode=args.mode,
    )
    return given(
        opts, speaker=args.speaker or None, repetition_penalty=args.repetition_penalty, max_frames=args.max_frames,
        window=getattr(args, "window", None),
    )
