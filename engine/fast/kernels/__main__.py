"""`python -m leapvox.engine.fast.kernels prebuild [--out DIR]`: build leapvox's CPU kernels now (the w8a8 library and
the fp32 layer's) and place them where a later run finds them without a compiler (packaging/build.sh does this for
the standalone bundle); prints each library's path on a line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from leapvox.engine.fast.kernels import FP32_FLAGS, FP32_SOURCES, PREBUILT_DIR, prebuild


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m leapvox.engine.fast.kernels", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prebuild", help="build the kernels for this torch and place them in a folder")
    pre.add_argument("--out", type=Path, default=PREBUILT_DIR, help=f"the folder (default {PREBUILT_DIR})")
    args = p.parse_args(argv)
    try:
        libs = [prebuild(args.out), prebuild(args.out, FP32_SOURCES, FP32_FLAGS)]  # w8a8 (and codec), fp32 layer
    except RuntimeError as e:
        print(f"leapvox: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the folder cannot be written (a system-wide install): say where it could go
        why = e.strerror or e
        print(f"leapvox: cannot write the library into {args.out}: {why}; choose a writable folder with --out",
              file=sys.stderr)
        return 1
    print("\n".join(map(str, libs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
