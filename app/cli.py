"""`leapvox` command line: a table of command modules, each owning its parsers. Data goes to stdout, messages to
stderr; exit 0 ok, 1 failure, 2 bad usage or input.

Nothing imports this module. Heavy imports (torch, the engine) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import signal
import sys
import threading

from leapvox.app.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    Terminated,
    UsageError,
    error_line,
    interruption,
    say,
    stop_status,
    version,
)

# command -> (module with add_commands(subparsers), one-line help); the order is the order of `leapvox --help`: what
# users run, then `recipe` (app/recipes: making assets). `leapvox COMMAND` imports only COMMAND's module.
COMMANDS = {
    "speak": ("leapvox.app.speak", "synthesise text to a WAV file, standard output or the speakers"),
    "speakers": ("leapvox.app.speak", "list a model's speakers and languages"),
    "devices": ("leapvox.app.speak", "list audio output devices (for --device)"),
    "voices": ("leapvox.app.voices", "cloned voices of a Base model: add from a clip, list, show, remove"),
    "tui": ("leapvox.app.tui.command", "interactive window: type, speak, live speed readouts, history"),
    "serve": ("leapvox.app.serve", "a local speech server speaking OpenAI's audio API (POST /v1/audio/speech)"),
    "batch": ("leapvox.app.batch", "many items (JSONL, CSV, lines, chapters) to files, resumable, locally or on Ray"),
    "compare": ("leapvox.app.compare", "speak one text through every decoding mode; table, WAVs, JSON (and a plot)"),
    "models": ("leapvox.app.manage", "list, download, check and remove models (Hugging Face cache)"),
    "paths": ("leapvox.app.manage", "where leapvox and the Hugging Face cache keep files"),
    "bench": ("leapvox.app.bench", "this machine, this model: speed per decoding mode and weight format"),
    "doctor": ("leapvox.app.doctor", "check this installation: Python, torch, audio, espeak-ng, models"),
    "tune": ("leapvox.app.tune", "tune a model for this machine: the mode and weights --mode/--weights auto pick"),
    "recipe": ("leapvox.app.recipes", "recipes that make model assets: offsets, tree, window, coreml, demo"),
}
# the recipes' old top-level names -> their names under `recipe` (a one-line error says the new spelling)
RENAMED = {"train-offsets": "offsets", "calibrate-tree": "tree", "bench-spec": "bench-spec", "train-window": "window",
           "bench-window": "bench-window", "export-coreml": "coreml", "demo": "demo"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `command`, only that command's module is imported (the others are listed by name)."""
    p = argparse.ArgumentParser(
        prog="leapvox",
        description="Fast, faithful local text-to-speech for Qwen3-TTS models.",
        epilog="Run 'leapvox COMMAND --help' for the options of a command. The recipes that make model assets "
        "(draft offsets and trees, windowed adaptation, Core ML exports, the demo model) are under 'leapvox recipe'.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    modules = dict.fromkeys(m for name, (m, _) in COMMANDS.items() if command in (None, name))
    for module in modules:
        importlib.import_module(module).add_commands(sub)
    for name, (_, help) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help)
    p.add_argument("--version", action="version", version=f"leapvox {version()}")
    return p


def _command(argv: list[str]) -> str | None:
    """The command named in `argv` (the first argument that is not an option), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def _renamed(argv: list[str]) -> UsageError | None:
    """A recipe called by its old top-level name: the error, with the new spelling of the same command line."""
    old = next((a for a in argv if not a.startswith("-")), None)
    if old not in RENAMED:
        return None
    new = shlex.join(["leapvox", "recipe", RENAMED[old], *argv[argv.index(old) + 1:]])
    return UsageError(f"'{old}' is now a recipe", hint=new)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if renamed := _renamed(argv):
        say(error_line(renamed))
        return EXIT_USAGE
    parser = build_parser(_command(argv) or "")
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    previous = _on_sigterm()
    previous_hook, sys.unraisablehook = sys.unraisablehook, _redeliver_dropped_stops(sys.unraisablehook)
    with _RESEND.lock:
        _RESEND.active, _RESEND.run, _RESEND.pending = True, _RESEND.run + 1, None
    try:
        status = args.func(args)
        _stop_still_due()
        return status
    except UsageError as e:
        say(error_line(e))
        return EXIT_USAGE
    except Terminated:
        say("leapvox: terminated")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        say("leapvox: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as e:
        from leapvox.engine.errors import LeapvoxError

        if (stop := interruption(e)) is not None:  # Ctrl-C/SIGTERM that arrived where Python wraps it
            word, status = stop_status(stop)
            say(f"leapvox: {word}")
            return status
        if _FIRED:  # the SIGTERM's exception was lost in C code that raised its own error instead (torch does)
            say("leapvox: terminated")
            return 128 + signal.SIGTERM
        if isinstance(e, LeapvoxError):
            say(error_line(e))
            return e.exit_code
        if os.environ.get("LEAPVOX_DEBUG"):
            raise
        say(f"leapvox: internal error: {type(e).__name__}: {e} (hint: set LEAPVOX_DEBUG=1 for the traceback)")
        return EXIT_FAILED
    finally:
        with _RESEND.lock:  # no stop is sent again once main() is done (a sent one is handled below)
            _RESEND.active, _RESEND.pending = False, None
        sys.unraisablehook = previous_hook
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_FIRED: list[int] = []  # the SIGTERM handler has raised (cleared when that Terminated was dropped: see below)


def _on_sigterm():
    """Turn SIGTERM into `Terminated` (once: a second one while cleaning up is ignored); returns the handler it
    replaced, or None where no handler can be set (not the main thread)."""
    _FIRED.clear()

    def handler(signum, frame):
        if not _FIRED:
            _FIRED.append(signum)
            raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        return None


class _RESEND:
    """Stops sent again by `_redeliver_dropped_stops`, only while the main() call that dropped them runs (`run`
    counts the calls: a timer left from an earlier call in the same process, as in tests, sends nothing);
    `pending` is the signal a timer has yet to send."""

    lock = threading.RLock()  # re-entrant: the hook runs inside whatever the main thread was doing
    delay = 0.01  # seconds before a dropped stop is sent again
    active = False
    run = 0
    pending: int | None = None


def _send_again(signum: int, run: int) -> None:
    with _RESEND.lock:
        if _RESEND.active and _RESEND.run == run and _RESEND.pending is not None:
            _RESEND.pending = None
            os.kill(os.getpid(), signum)


def _stop_still_due() -> None:
    """The command finished before a dropped stop was sent again (it was dropped in its last moments): the stop
    happens now, as if it had landed at the end, instead of the command reporting success."""
    with _RESEND.lock:
        signum, _RESEND.pending, _RESEND.active = _RESEND.pending, None, False
    if signum == signal.SIGTERM:
        raise Terminated()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt()


def _redeliver_dropped_stops(previous):
    """A sys.unraisablehook for main(): a Ctrl-C or SIGTERM whose exception was raised inside a finalizer (a
    `__del__`, a weakref callback: Python prints "Exception ignored in ..." and carries on) is sent to this process
    again, so it stops where the program is instead of being lost (and with it, for SIGTERM, every later one).
    Anything else goes to `previous`."""

    def hook(unraisable):
        stop = interruption(unraisable.exc_value) if unraisable.exc_value is not None else None
        if stop is None or os.name != "posix":  # not a stop, or no signals to send again
            return previous(unraisable)
        if isinstance(stop, Terminated):
            _FIRED.clear()
        # from another thread, a moment later: a process that signals itself runs the handler at once, here, inside
        # the finalizer still; sent from elsewhere it is handled at the main thread's next check, past the finalizer
        signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
        with _RESEND.lock:
            _RESEND.pending = signum
        timer = threading.Timer(_RESEND.delay, _send_again, args=(signum, _RESEND.run))
        timer.daemon = True
        timer.start()

    return hook


if __name__ == "__main__":
    sys.exit(main())
