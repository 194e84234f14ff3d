"""`leapvox` command line: a table of command modules, each owning its parsers. Data goes to stdout, messages to
stderr; exit 0 ok, 1 failure, 2 bad usage or input.

Nothing imports this module. Heavy imports (torch, the engine) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from leapvox.app.common import EXIT_FAILED, EXIT_USAGE, UsageError, error_line, say

# Each module has add_commands(subparsers); the order is the order of `leapvox --help`.
COMMAND_MODULES = (
    "leapvox.app.speak",  # speak, speakers, devices
    "leapvox.app.tui.command",  # tui
    "leapvox.app.compare",  # compare
    "leapvox.app.manage",  # models, paths
    "leapvox.app.recipes.offsets",  # train-offsets, calibrate-tree, bench-spec
    "leapvox.app.recipes.demo",  # demo
    "leapvox.app.recipes.window",  # train-window, bench-window
    "leapvox.app.recipes.coreml",  # export-coreml
    "leapvox.app.bench",  # bench
    "leapvox.app.doctor",  # doctor
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="leapvox",
        description="Fast, faithful local text-to-speech for Qwen3-TTS models.",
        epilog="Run 'leapvox COMMAND --help' for the options of a command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    from leapvox.app.doctor import version

    p.add_argument("--version", action="version", version=f"leapvox {version()}")
    return p


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
