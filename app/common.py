"""What the commands share: exit codes, usage errors, messages, --model/--weights/--backend and reading the text.
Only argparse and the standard library at import time, and nothing here imports the dispatcher (cli.py)."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace

from leapvox.engine.options import BACKEND_CHOICES, COMPUTE_UNIT_CHOICES, check_options, check_text
from leapvox.models.catalog import default_model

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# engine.quant.WEIGHT_FORMATS, torch-free here (a test checks they agree)
WEIGHT_FORMATS = ("fp32", "bf16", "int8", "w8a8", "w4a8", "int4")
WEIGHT_CHOICES = ("auto", *WEIGHT_FORMATS)
# --weights default: auto = w8a8 where torch's quantized kernels run, else int8 (engine.quant.resolve_weights): the
# fastest on the CPUs measured, fidelity measured (tests/benchmarks/README.md)
DEFAULT_WEIGHTS = "auto"


class UsageError(Exception):
    """Bad command-line usage detected after parsing (exit 2)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def version() -> str:
    """leapvox's version from the installed package metadata ("unknown" when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("leapvox")
    except PackageNotFoundError:
        return "unknown (not installed)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by the CLI's handler where the program is: the Ctrl-C path (temp files removed, players
    stopped), then "leapvox: terminated" and exit 143 (128 + SIGTERM) without a traceback."""


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
        help="weight format of the talker and code predictor: fp32, bf16, int8 (8-bit weights, bf16 activations), "
        "w8a8 (8-bit weights and activations, integer products), w4a8 (4-bit weights in groups of 64, 8-bit "
        "activations, leapvox's compiled AVX-512 kernel only: the fastest, less faithful), int4 (4-bit weights, "
        "bf16 activations, torch's kernel), or auto: w8a8 where torch's quantized kernels run, else int8 "
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


# What is taken out of the text before speaking: terminal escape sequences (CSI such as "\x1b[31m", OSC such as a
# window title or hyperlink, and two-character escapes), then any other control character. Tabs and line breaks
# stay (they are white space); everything else would be read aloud or passed on to a front end such as espeak-ng.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI ... final byte
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL or ST
    r"|\x1b[ -/]*[0-~]"  # other escapes: ESC (, ESC =, ESC 7 ...
)
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    """`text` without terminal escape sequences and control characters (see _ESCAPES), stripped."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text)).strip()


def _check_no_nul(text: str, where: str) -> None:
    if "\0" in text:
        raise UsageError(f"{where} contains a NUL byte (at character {text.index(chr(0))}): it is not plain text",
                         hint="give a UTF-8 text file")


# byte order marks of the other Unicode encodings a text file may be in (UTF-32's first: FF FE starts both)
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


def read_text(args) -> str:
    """The text of `TEXT`, `-` (standard input) or `-f FILE`, cleaned of control characters and escape sequences
    and stripped; a usage error when there is none, or when it is not UTF-8 text or holds a NUL byte."""
    if args.file is not None and args.text is not None:
        raise UsageError("give the text either as an argument or with -f, not both")
    if args.file is not None:
        where = str(args.file)
        try:
            data = args.file.read_bytes()
            text = data.decode("utf-8")
        except OSError as e:
            raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            utf = next((name for bom, name in _BOMS if data.startswith(bom)), None)
            if utf:
                raise UsageError(f"cannot read {args.file}: it is {utf} text (it starts with a {utf} byte order mark), "
                                 "not UTF-8", hint=f"convert it, e.g. iconv -f {utf} -t UTF-8") from None
            raise UsageError(f"cannot read {args.file}: it is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
                             f"offset {e.start})", hint="convert it, e.g. iconv -f latin1 -t utf-8") from None
        if text.startswith("\ufeff"):  # a UTF-8 byte order mark
            text = text[1:]
    elif args.text == "-":
        where = "standard input"
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as e:
            utf = next((name for bom, name in _BOMS if e.start < 4 and e.object.startswith(bom)), None)
            raise UsageError(f"cannot read standard input: it is {f'{utf} text, not' if utf else 'not'} {e.encoding} "
                             f"text (byte 0x{e.object[e.start]:02x} at offset {e.start})",
                             hint=f"pipe it through iconv -f {utf} -t UTF-8" if utf else "pipe UTF-8 text") from None
    elif args.text is not None:
        where, text = "the text", args.text
    else:
        raise UsageError("no text given", hint='leapvox speak "Hello" -o hello.wav, or - to read standard input')
    _check_no_nul(text, where)
    text = clean_text(text)
    if not text:
        raise UsageError("the text is empty", hint="give some words to speak")
    return text


def given(obj, **values):
    """replace() with only the options the user gave (None = not given)."""
    return replace(obj, **{k: v for k, v in values.items() if v is not None})


def sampling_args(p, args):
    """SamplingParams `p` with the --greedy, --temperature, --top-k and --top-p that `args` has and the user gave;
    --temperature 0 means greedy (argmax), as in OpenAI's clients."""
    temperature = getattr(args, "temperature", None)
    greedy = getattr(args, "greedy", False) or temperature == 0
    p = replace(p, do_sample=p.do_sample and not greedy)
    values = {k: getattr(args, k, None) for k in ("temperature", "top_k", "top_p")}
    if temperature == 0:
        values["temperature"] = None  # greedy: the temperature is not used; the model's stays valid
    return given(p, **values)


def cli_name(key: str) -> str:
    """An option as the command line spells it: top_k -> --top-k; the text is "the text"."""
    return "the text" if key == "text" else "--" + key.replace("_", "-")


# speak's flags under the one set of option rules (engine.options.check_options)
CHECKED_FLAGS = ("seed", "temperature", "top_k", "top_p", "repetition_penalty", "max_frames", "window", "mode",
                 "greedy", "device", "play", "speaker")


def check_flags(args) -> list[str]:
    """The values of speak's flags, named as the user typed them: a usage error (exit 2) before any loading; else
    a warning for each flag that will have no effect (--window with --mode ar, --top-k with --greedy)."""
    return check_options({k: getattr(args, k, None) for k in CHECKED_FLAGS}, cli_name)


def check_speak(args, text: str) -> None:
    """What speak checks first, in no time: the text (something to say), the flags' values (warnings for those
    without effect said now) and --backend."""
    check_text(text, cli_name("text"))
    for warning in check_flags(args):
        say(f"warning: {warning}")
    check_backend(args)


def precheck_speak(args) -> None:
    """What speak can check before the slow model load from the model's config.json and generation_config.json
    alone: the speaker, language and the options as `validate` will see them. A Hub model that is not downloaded
    yet is checked after `load` pulls it, as before."""
    from leapvox.engine.options import validate
    from leapvox.models.checkpoint import load_config, model_defaults
    from leapvox.models.hub import NotCachedError, resolve_model_path

    try:
        folder = resolve_model_path(require_model(args), pull=False)
    except NotCachedError:
        return
    cfg = load_config(folder)
    check_voice_flags(args, cfg, folder)
    validate(speak_options(args, model_defaults(folder, cfg)), cfg)


def check_voice_flags(args, cfg, folder=None) -> None:
    """--voice / --ref-audio / --ref-text / --instruct / --speaker against the model type (config.json), as usage
    errors (exit 2) before any loading: Base models speak only in a cloned voice and take no instruction or speaker;
    the others take no cloned voice. With `folder`, a saved --voice is checked too (missing, damaged)."""
    voice, ref_audio = getattr(args, "voice", None), getattr(args, "ref_audio", None)
    if voice and ref_audio is not None:
        raise UsageError("give --voice or --ref-audio, not both")
    ref_text = getattr(args, "ref_text", None)
    if ref_text is not None and ref_audio is None:
        raise UsageError("--ref-text goes with --ref-audio", hint="it says what the reference clip says")
    if ref_text is not None and not ref_text.strip():
        raise UsageError("--ref-text is empty", hint="give what the clip says, or leave --ref-text out (x-vector only)")
    kind, name = cfg.tts_model_type, getattr(args, "model", None)
    if kind != "base":
        if voice or ref_audio is not None:
            raise UsageError(f"{'--voice' if voice else '--ref-audio'} clones a voice, which needs a Base model; "
                             f"{name} is a {kind} model", hint="use --model qwen3-tts-0.6b-base (or 1.7b-base)")
        return
    if getattr(args, "instruct", None):
        raise UsageError("a Base model takes no --instruct", hint="describe a voice in words with --model "
                         "qwen3-tts-1.7b-voicedesign, or clone one here with --voice / --ref-audio")
    if getattr(args, "speaker", None):
        raise UsageError("a Base model has no built-in speakers (--speaker)", hint="clone a voice with --voice NAME "
                         "(leapvox voices add) or --ref-audio CLIP")
    if not voice and ref_audio is None:
        raise UsageError(f"{name} is a Base model: it speaks in a cloned voice",
                         hint="give --voice NAME (see leapvox voices) or --ref-audio CLIP [--ref-text ...]")
    if voice and folder is not None:
        from leapvox.models.voices import load_voice, model_key

        load_voice(model_key(folder), voice, cfg.talker.hidden_size)  # missing or damaged: one line now


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
