"""`leapvox` command line. Data goes to stdout, messages to stderr; exit 0 ok, 1 failure, 2 bad usage or input.

Heavy imports (torch, the engine) happen inside the commands so that `--help` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from leapvox.engine.modes import MODES
from leapvox.models.catalog import default_model

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_WEIGHTS = "int8"  # --weights default: the fastest on CPU, fidelity measured (README "Weights and CPU speed")


class UsageError(Exception):
    """Bad command-line usage detected after parsing."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def error_line(e: Exception) -> str:
    """One line: the message, then the hint if there is one."""
    hint = getattr(e, "hint", None)
    return f"leapvox: error: {e}" + (f" (hint: {hint})" if hint else "")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="leapvox",
        description="Fast, faithful local text-to-speech for Qwen3-TTS models.",
        epilog="Run 'leapvox COMMAND --help' for the options of a command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "speak",
        help="synthesise text to a WAV file (or stdout)",
        description="Synthesise TEXT to a 24 kHz mono WAV file.",
        epilog='examples:\n  leapvox speak "Hello there." -o hello.wav --model ./Qwen3-TTS-12Hz-0.6B-CustomVoice\n'
        "  echo 'Hi.' | leapvox speak - -o - --model M > hi.wav\n  leapvox speak -f story.txt -o story.wav --model M",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("text", nargs="?", help="text to speak; '-' reads standard input")
    s.add_argument("-f", "--file", type=Path, help="read the text from FILE")
    s.add_argument("-o", "--output", help="WAV file to write; '-' writes the WAV to standard output")
    s.add_argument("--play", action="store_true", help="play through the speakers while synthesising (-o optional)")
    s.add_argument("--device", help="output device number or name for --play (see 'leapvox devices')")
    _model_args(s)
    s.add_argument("--speaker", help="voice to use (see 'leapvox speakers'); default: the model's first")
    s.add_argument("--language", default="auto", help="language of the text, or 'auto' (default)")
    s.add_argument("--instruct", help="style instruction (1.7B models only; 0.6B ignores it with a warning)")
    s.add_argument("--seed", type=int, help="random seed; the same seed gives the same codes as the official package")
    s.add_argument("--temperature", type=float, help="sampling temperature for all codes (default 0.9)")
    s.add_argument("--top-k", type=int, help="keep the K most likely codes (default 50; 0 disables)")
    s.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0 = off)")
    s.add_argument("--repetition-penalty", type=float, help="penalty on repeated code-0 values (default 1.05)")
    s.add_argument("--greedy", action="store_true", help="argmax instead of sampling, for code 0 and codes 1..15")
    s.add_argument(
        "--max-frames", type=int, help="stop after N frames of 80 ms (the official max_new_tokens is N+1)"
    )
    s.add_argument(
        "--no-guard", action="store_true", help="disable the runaway cap derived from the text length"
    )
    s.add_argument(
        "--text-layout",
        choices=["non-streaming", "streaming"],
        default="non-streaming",
        help="all text in the prompt (default, as the official package) or text rows riding on frames",
    )
    s.add_argument("--mode", choices=MODES, default="ar", help="decoding mode (default ar)")
    s.add_argument(
        "--window", type=int, metavar="W", help="windowed mode: frames the talker attends to besides the prompt "
        "(default 48); an approximation on a full-attention model until an adapted checkpoint exists"
    )
    s.add_argument("--codes", type=Path, help="also write the generated codes [frames x 16] as JSON to this file")
    __import__("leapvox.app.coreml_cmd", fromlist=["add_backend_args"]).add_backend_args(s)
    s.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    s.set_defaults(func=cmd_speak)

    k = sub.add_parser("speakers", help="list a model's speakers and languages")
    _model_args(k)
    k.set_defaults(func=cmd_speakers)

    from leapvox.app import demo_cmd, doctor_cmd, live_cmd, models_cmd, spec_cmd, window_cmd

    models_cmd.add_commands(sub)
    live_cmd.add_commands(sub)
    spec_cmd.add_commands(sub)
    demo_cmd.add_commands(sub)
    window_cmd.add_commands(sub)
    __import__("leapvox.app.coreml_cmd", fromlist=["add_commands"]).add_commands(sub)
    __import__("leapvox.app.bench_cmd", fromlist=["add_commands"]).add_commands(sub)
    doctor_cmd.add_commands(sub)
    p.add_argument("--version", action="version", version=f"leapvox {doctor_cmd.version()}")
    return p


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=default_model(),
        help="catalog name (leapvox models list), Hub repo org/name[@revision] or checkpoint folder "
        "(default: $LEAPVOX_MODEL, else the bundled demo model)",
    )
    p.add_argument(
        "--weights", dest="dtype", choices=["fp32", "bf16", "int8"], default=DEFAULT_WEIGHTS,
        help=f"weight format: fp32, bf16, or int8 (8-bit talker and predictor weights, bf16 activations; "
        f"see README 'Weights and CPU speed') (default {DEFAULT_WEIGHTS})",
    )
    p.add_argument("--dtype", dest="dtype", choices=["fp32", "bf16"], help=argparse.SUPPRESS)  # old name of --weights


def _require_model(args) -> str:
    if not args.model:
        raise UsageError("no model given", hint="pass --model qwen3-tts-0.6b, or --model PATH to a checkpoint folder")
    return args.model


def _quiet_or(args, tell):
    return (lambda msg: None) if args.quiet else (lambda msg: tell(f"leapvox: {msg}"))


def read_text(args) -> str:
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


def _given(obj, **values):
    """replace() with only the options the user gave (None = not given)."""
    from dataclasses import replace

    return replace(obj, **{k: v for k, v in values.items() if v is not None})


def sampling_args(p, args):
    """SamplingParams `p` with the --greedy, --temperature, --top-k and --top-p that `args` has and the user gave."""
    from dataclasses import replace

    p = replace(p, do_sample=p.do_sample and not args.greedy)
    return _given(p, **{k: getattr(args, k, None) for k in ("temperature", "top_k", "top_p")})


def speak_options(args, defaults):
    from dataclasses import replace

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
    return _given(
        opts, speaker=args.speaker or None, repetition_penalty=args.repetition_penalty, max_frames=args.max_frames,
        window=getattr(args, "window", None),
    )


def cmd_speak(args) -> int:
    text = read_text(args)
    if not args.output and not args.play:
        raise UsageError("no output given", hint="add -o out.wav, -o - for standard output, or --play")
    if args.output and args.output != "-" and not Path(args.output).expanduser().parent.is_dir():
        raise UsageError(f"cannot write {args.output}: its folder does not exist")
    from leapvox.app.coreml_cmd import check_backend, use_backend

    check_backend(args)  # --backend ane off macOS: exit 2 before downloading or loading anything
    from leapvox.models.hub import resolve_model_path

    folder = resolve_model_path(
        _require_model(args), pull=True, say=_quiet_or(args, say), progress=sys.stderr.isatty() and not args.quiet
    )
    from leapvox.models.checkpoint import load_model

    model = load_model(folder, dtype=args.dtype)
    use_backend(args, folder, model, _quiet_or(args, say))
    if args.play:
        from leapvox.app.live_cmd import speak_play

        return speak_play(args, model, text, speak_options(args, model.defaults))
    result = model.synthesizer().synthesize(text, speak_options(args, model.defaults))
    for w in result.warnings:
        say(f"warning: {w}")
    if args.codes:
        import json

        from leapvox.models.files import write_text_atomic

        write_text_atomic(args.codes, json.dumps(result.codes.tolist()))
    from leapvox.app.audio import write_wav, write_wav_stream

    if args.output == "-":
        write_wav_stream(sys.stdout.buffer, result.audio, result.sample_rate)
    else:
        write_wav(Path(args.output).expanduser(), result.audio, result.sample_rate)
    if not args.quiet:
        s = result.stats
        dest = "standard output" if args.output == "-" else args.output
        say(
            f"wrote {dest}: {result.duration_s:.2f} s of audio, {s.frames} frames ({s.stop_reason}), "
            f"{result.elapsed_s:.2f} s, xRT {result.realtime_factor:.2f}"
        )
    return EXIT_OK


def cmd_speakers(args) -> int:
    from leapvox.models.hub import resolve_model_path

    folder = resolve_model_path(_require_model(args), pull=False)
    from leapvox.models.checkpoint import load_config

    cfg = load_config(folder)
    tc = cfg.talker
    print("speakers:")
    for name in tc.spk_id:
        dialect = tc.spk_is_dialect.get(name)
        print(f"  {name}" + (f"  (speaks {dialect} for chinese/auto)" if dialect else ""))
    print("languages:")
    for lang in cfg.languages:
        print(f"  {lang}")
    print(f"instruct: {'yes' if cfg.supports_instruct else 'no (ignored by this model size)'}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except UsageError as e:
        say(error_line(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("leapvox: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as e:
        from leapvox.engine.errors import LeapvoxError

        if isinstance(e, LeapvoxError):
            say(error_line(e))
            return e.exit_code
        if os.environ.get("LEAPVOX_DEBUG"):
            raise
        say(f"leapvox: internal error: {type(e).__name__}: {e} (hint: set LEAPVOX_DEBUG=1 for the traceback)")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
