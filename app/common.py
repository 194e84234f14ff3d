"""What the commands share: exit codes, usage errors, messages, --model/--weights/--backend, reading the text, and
the flags as the plain mapping engine.options builds and checks options from (no rules of its own here). Only
argparse, the standard library and engine.options at import time; nothing here imports the dispatcher (cli.py)."""

from __future__ import annotations

import argparse
import re
import sys

from leapvox.engine.options import (
    AUTO,
    BACKEND_CHOICES,
    COMPUTE_UNIT_CHOICES,
    OPTION_KEYS,
    WEIGHT_FORMATS,
    build_options,
    check_options,
    check_text,
    validate,
)
from leapvox.models.catalog import default_model

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
WEIGHT_CHOICES = (AUTO, *WEIGHT_FORMATS)
# --weights default: auto = the format `leapvox tune` chose for this model on this machine (models.auto), else fp32
# for a narrow model (the demo), else w8a8 where torch's quantized kernels run, else int8
# (engine.fast.quant.resolve_weights): the fastest on the CPUs measured, fidelity measured (tests/benchmarks/README.md)
DEFAULT_WEIGHTS = AUTO
# --mode default: auto. Without a tune profile it is exactly ar (the same codes for a seed), so an untuned model speaks
# as before; a tuned one gets the mode its profile measured to be faster here. --mode ar stays the reference.
DEFAULT_MODE = AUTO
MODE_AUTO_HELP = ("auto: the mode `leapvox tune` chose for this model on this machine (spec where it measured it "
                  "faster), else ar")


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


def interruption(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (`Terminated`) that `e` is or wraps: Python wraps one raised while a class is being made
    (a lazy import in progress) as "RuntimeError: Error calling __set_name__ ...", caused by it."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def stop_status(stop: KeyboardInterrupt) -> tuple[str, int]:
    """How a stop is told and what the process exits with: ("terminated", 143) for SIGTERM, ("interrupted", 130)."""
    return ("terminated", 128 + 15) if isinstance(stop, Terminated) else ("interrupted", 130)


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
        "bf16 activations, torch's kernel), or auto: the format `leapvox tune` chose for this model on this "
        "machine, else fp32 for a model as narrow as the demo (8-bit formats only slow its small products), else "
        f"w8a8 where torch's quantized kernels run, else int8 (default {DEFAULT_WEIGHTS})",
    )
    p.add_argument("--dtype", dest="weights", choices=["fp32", "bf16"], help=argparse.SUPPRESS)  # old name


def backend_args(p, default: str = "auto", help: str | None = None) -> None:
    """--backend and --compute-units on a command that runs the model."""
    p.add_argument("--backend", choices=BACKEND_CHOICES, default=default,
                   help=help or "what runs the talker and code predictor: cpu = PyTorch; ane = the model's Core ML "
                   "export (leapvox recipe coreml) on macOS 15+, Neural Engine; auto = ane on a Mac with coremltools "
                   "and an export of this model, else cpu (default auto)")
    p.add_argument("--compute-units", choices=COMPUTE_UNIT_CHOICES, default="cpu_and_ne",
                   help="ane backend: where Core ML may run: cpu_and_ne (CPU + Neural Engine, default), all (also "
                   "the GPU), cpu_only")


def check_backend(args) -> None:
    """--backend ane where Core ML predictions cannot run: a one-line usage error (exit 2) before any loading."""
    if getattr(args, "backend", "auto") != "ane":
        return
    from leapvox.engine.coreml.runtime import unavailable_reason

    why = unavailable_reason()
    if why:
        raise UsageError(why, hint="use --backend cpu")


def require_model(args) -> str:
    if not args.model:
        raise UsageError("no model given", hint="pass --model qwen3-tts-0.6b, or --model PATH to a checkpoint folder")
    return args.model


def open_model(args, pull: bool = False, say=tell):
    """The model --model names, resolved once for the whole command: its folder, config.json and default options
    (models.load.ModelFolder), pulled first where `pull` and it is missing."""
    from leapvox.models.load import open_model

    check_backend(args)  # --backend ane off macOS: exit 2 before downloading or loading anything
    return open_model(require_model(args), pull=pull, say=say,
                      progress=pull and sys.stderr.isatty() and not getattr(args, "quiet", False))


def choose(args, model, mode: str | None = None):
    """The mode and weights this request runs (models.auto.Choice): the command's --mode (or `mode`; ar where the
    command has none) and --weights, `auto` resolved for `model` (a ModelFolder or a loaded model) by its tune
    profile on this machine and --backend. Once per request, before the weights load."""
    from leapvox.models.auto import choose as choose_auto

    mode = mode or getattr(args, "mode", None) or "ar"
    weights = getattr(model, "weights", None) or getattr(args, "weights", None) or AUTO  # a loaded model's are known
    backend = getattr(model, "backend_name", None) or getattr(args, "backend", "cpu")
    talker = getattr(getattr(model, "config", None), "talker", None)  # read already: not read again
    return choose_auto(model.path, mode, weights, backend, getattr(args, "model", None),
                       getattr(talker, "hidden_size", None))


def load(args, model=None, pull: bool = False, say=tell, weights: str | None = None):
    """The model the command's --model (or `model`, the ModelFolder it opened), --weights (or `weights`, what a
    Choice resolved it to) and --backend name, ready to speak."""
    from leapvox.models.load import load_model

    model = model or open_model(args, pull, say)
    return load_model(model, weights or args.weights, getattr(args, "backend", "cpu"),
                      compute_units=getattr(args, "compute_units", "cpu_and_ne"), say=say)


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


STDIN = "standard input"


def _not_utf8(where: str, head: bytes, offset: int, byte: int, encoding: str = "utf-8") -> UsageError:
    """The one line for text that is not UTF-8 (`byte` at `offset`; `head`: the first bytes, for a UTF-16/32 byte
    order mark), worded for a file or for standard input."""
    utf = next((name for bom, name in _BOMS if head.startswith(bom)), None) if offset < 4 or where != STDIN else None
    if where == STDIN:
        return UsageError(f"cannot read standard input: it is {f'{utf} text, not' if utf else 'not'} {encoding} text "
                          f"(byte 0x{byte:02x} at offset {offset})",
                          hint=f"pipe it through iconv -f {utf} -t UTF-8" if utf else "pipe UTF-8 text")
    if utf:
        return UsageError(f"cannot read {where}: it is {utf} text (it starts with a {utf} byte order mark), not UTF-8",
                          hint=f"convert it, e.g. iconv -f {utf} -t UTF-8")
    return UsageError(f"cannot read {where}: it is not UTF-8 text (byte 0x{byte:02x} at offset {offset})",
                      hint="convert it, e.g. iconv -f latin1 -t utf-8")


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
            raise _not_utf8(where, data, e.start, e.object[e.start]) from None
        if text.startswith("\ufeff"):  # a UTF-8 byte order mark
            text = text[1:]
    elif args.text == "-":
        where = STDIN
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as e:
            raise _not_utf8(where, e.object, e.start, e.object[e.start], e.encoding) from None
    elif args.text is not None:
        where, text = "the text", args.text
    else:
        raise UsageError("no text given", hint='leapvox speak "Hello" -o hello.wav, or - to read standard input')
    _check_no_nul(text, where)
    text = clean_text(text)
    if not text:
        raise UsageError("the text is empty", hint="give some words to speak")
    return text


# ---- text that arrives while it is spoken (a pipe, a FIFO, a terminal) -------------------------------------------

# A pause this long in the input speaks the sentence begun (it may have no end mark yet): far longer than the gaps
# between a language model's tokens, short next to a person's pause for thought; Enter ends a line at a terminal.
IDLE_S = 0.6


def _streamed(args) -> tuple[int, str] | None:
    """(file descriptor, name) of input read as it arrives: `-` on a pipe, FIFO, socket or terminal, `-f` on a FIFO
    (opened now: it waits for a writer); None for text known whole (an argument, a regular file, stdin redirected
    from one, a stdin without a descriptor)."""
    import os
    import stat

    if args.text == "-" and args.file is None:
        try:
            fd = sys.stdin.fileno()
            return (fd, STDIN) if not stat.S_ISREG(os.fstat(fd).st_mode) else None
        except (AttributeError, OSError, ValueError):  # a stand-in without a descriptor
            return None
    if args.file is None or args.text is not None:
        return None
    try:
        if not stat.S_ISFIFO(os.stat(args.file).st_mode):
            return None
        return os.open(args.file, os.O_RDONLY), str(args.file)
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None


class PieceCleaner:
    """clean_text for text in pieces: an escape sequence split across pieces is held until it is whole (an OSC
    until its terminator, as clean_text reads one), so the pieces come out as the whole text would."""

    def __init__(self):
        self.held = ""

    def __call__(self, text: str, final: bool = False) -> str:
        text, cut = self.held + text, None
        i = max(text.rfind("\x1b"), text.rfind("\x9b"), text.rfind("\x9d"))
        if not final and i >= 0:
            osc = text.startswith(("\x1b]", "\x9d"), i) and not any(c in text[i:] for c in "\x07\x9c")
            cut = i if osc or len(text) - i <= 64 else None
        self.held = text[cut:] if cut is not None else ""
        return _CONTROLS.sub("", _ESCAPES.sub("", text[:cut]))


def _read_pieces(fd: int, where: str, pieces, close: bool) -> None:
    """Reader thread: UTF-8 from `fd` into `pieces` as it comes (a character split across reads waits for its other
    bytes), cleaned as read_text cleans; read_text's one-line errors go to the consumer through `pieces.fail`."""
    import codecs
    import os

    decoder, clean, head, offset, chars = codecs.getincrementaldecoder("utf-8")(), PieceCleaner(), b"", 0, 0
    try:
        while True:
            data = os.read(fd, 65536)
            head = head if len(head) >= 4 else (head + data)[:4]
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                at = offset + e.start - len(e.object) + len(data)  # the decoder's buffer ends with `data`
                raise _not_utf8(where, head, at, e.object[e.start]) from None
            if chars == 0 and text.startswith("\ufeff"):  # a UTF-8 byte order mark
                text, chars = text[1:], 1
            if "\0" in text:
                _check_no_nul(" " * chars + text, where)
            offset, chars = offset + len(data), chars + len(text)
            pieces.put(clean(text, final=not data))
            if not data:
                break
    except OSError as e:
        pieces.fail(UsageError(f"cannot read {where}: {e.strerror or e}"))
    except BaseException as e:  # the consumer raises it
        pieces.fail(e)
    else:
        pieces.close()
    finally:
        if close:
            os.close(fd)


def read_text_stream(args):
    """`speak`'s text: (text, None) for text known whole (read_text); for input read as it arrives (see _streamed),
    (the cleaned text up to its first words, or all of it at the end of input, checked as read_text checks it;
    the pieces of the whole text, that text first, with textfeed.FLUSH after IDLE_S without input). A reader
    thread reads ahead meanwhile."""
    import itertools
    import threading

    from leapvox.engine.markup import strip_markup
    from leapvox.engine.text import has_words
    from leapvox.engine.textfeed import FLUSH, TextPieces, settled

    source = _streamed(args)
    if source is None:
        return read_text(args), None
    fd, where = source
    pieces = TextPieces(idle_s=IDLE_S)
    threading.Thread(target=_read_pieces, args=(fd, where, pieces, where != STDIN), daemon=True,
                     name="leapvox-text-reader").start()
    got, head, text = iter(pieces), [], ""
    for piece in got:
        head.append(piece)
        text += "" if piece is FLUSH else piece
        if has_words(strip_markup(settled(text))):  # something to say: the rest is read while the model loads
            return settled(text), itertools.chain(head, got)
    if not text.strip():
        raise UsageError("the text is empty", hint="give some words to speak")
    return text, iter(head)


def cli_name(key: str) -> str:
    """An option as the command line spells it: top_k -> --top-k; the text is "the text"."""
    return "the text" if key == "text" else "--" + key.replace("_", "-")


def flag_values(args, keys=(*OPTION_KEYS, "device", "play")) -> dict:
    """A command's option flags as the plain mapping engine.options reads (None: not given, or no such flag)."""
    return {k: getattr(args, k, None) for k in keys}


def check_speak(args, text: str) -> None:
    """What speak checks first, in no time and without the model: the text (something to say), the flags' values
    by the one set of option rules (engine.options; a warning said now for each flag without effect: --window with
    --mode ar, --top-k with --greedy), how the voice flags go together, and --backend."""
    check_text(text, cli_name("text"))
    for warning in check_options(flag_values(args), cli_name):
        say(f"warning: {warning}")
    voice, ref_audio, ref_text = (getattr(args, k, None) for k in ("voice", "ref_audio", "ref_text"))
    if voice and ref_audio is not None:
        raise UsageError("give --voice or --ref-audio, not both")
    if ref_text is not None and ref_audio is None:
        raise UsageError("--ref-text goes with --ref-audio", hint="it says what the reference clip says")
    if ref_text is not None and not ref_text.strip():
        raise UsageError("--ref-text is empty", hint="give what the clip says, or leave --ref-text out (x-vector only)")
    check_backend(args)


def speak_options(args, model, voice=None, choice=None):
    """The SynthesisOptions of the command's flags over the defaults of `model` (a ModelFolder or a loaded model),
    validated once against it (engine.options.validate): a bad --speaker, --language, or a voice the model type
    does not take, is one line before the weights load. `voice`: the cloned voice, or what stands for it (a saved
    voice's name, a clip). --mode auto becomes the mode `choice` (a models.auto.Choice) names, chosen here when
    not given."""
    given = flag_values(args)
    if given.get("mode") == AUTO:
        given["mode"] = (choice or choose(args, model)).mode
    return validate(build_options(given, model.defaults), model.config, voice, cli_name)
