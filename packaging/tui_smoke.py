"""Start `EXE tui ...` in a pseudo-terminal, wait until the model is loaded, press Ctrl+Q, expect a clean exit.

    python3 packaging/tui_smoke.py dist/leapvox/leapvox --model demo

Exit 0 when the TUI showed "[ready]" and quit with status 0 within the time limits; 1 otherwise, saying why.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time

READY_S = int(os.environ.get("TUI_SMOKE_READY_S", "120"))  # loading and warming up the model
QUIT_S = 20
CTRL_Q = b"\x11"  # the TUI's Quit binding
ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Z0-9]")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    pid, fd = pty.fork()
    if pid == 0:  # child: the TUI on the pty
        os.environ.update(TERM="xterm-256color", COLUMNS="110", LINES="32")
        try:
            os.execv(argv[0], [argv[0], "tui", *argv[1:]])
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 32, 110, 0, 0))
    seen = bytearray()

    def pump(until: float) -> bool:
        """Read what the TUI draws until `until`; False when the pty closed (the program ended)."""
        while time.monotonic() < until:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return False
                if not chunk:
                    return False
                seen.extend(chunk)
                return True
        return True

    def text() -> str:
        return ANSI.sub("", seen.decode("utf-8", "replace"))

    deadline, alive = time.monotonic() + READY_S, True
    while alive and time.monotonic() < deadline and "[ready]" not in text() and "[failed]" not in text():
        alive = pump(deadline)
    screen = text()
    if os.environ.get("TUI_SMOKE_DUMP"):
        with open(os.environ["TUI_SMOKE_DUMP"], "wb") as f:
            f.write(bytes(seen))
    if "[ready]" not in screen:
        why = "the model failed to load" if "[failed]" in screen else "ended early" if not alive else \
            f"no '[ready]' within {READY_S} s"
        print(f"tui_smoke: {why}; last output:\n{screen[-1500:]}", file=sys.stderr)
        with_kill(pid)
        return 1
    os.write(fd, CTRL_Q)
    deadline = time.monotonic() + QUIT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code != 0 or "Traceback" in text():
                print(f"tui_smoke: the TUI exited with status {code}:\n{text()[-1500:]}", file=sys.stderr)
                return 1
            print("tui_smoke: the TUI loaded the model and quit cleanly on Ctrl+Q (status 0)", file=sys.stderr)
            return 0
        pump(time.monotonic() + 0.2)
    print(f"tui_smoke: the TUI did not quit within {QUIT_S} s of Ctrl+Q", file=sys.stderr)
    with_kill(pid)
    return 1


def with_kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
