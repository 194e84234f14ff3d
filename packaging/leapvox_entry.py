"""Entry point of the standalone bundle: the same `leapvox` command as the installed console script."""

import multiprocessing
import sys

from leapvox.app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen program must say so before anything spawns a worker process
    sys.exit(main())
