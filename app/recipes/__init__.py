"""`leapvox recipe NAME`: the commands that make and measure model assets (spec offsets and trees, windowed
adaptation, Core ML exports, the demo model). One verb, so the top level holds only what users run."""

from __future__ import annotations

import importlib
import sys

# modules with add_commands(subparsers), in the order of `leapvox recipe --help`; they import only argparse-level code
MODULES = ("leapvox.app.recipes.offsets", "leapvox.app.recipes.window", "leapvox.app.recipes.coreml",
           "leapvox.app.recipes.demo")


def add_commands(sub) -> None:
    """Register `recipe` and every recipe under it."""
    r = sub.add_parser("recipe", help="recipes that make model assets: offsets, tree, window, coreml, demo",
                       description="Recipes that make and measure model assets. 'leapvox recipe NAME --help' lists "
                       "a recipe's options.")
    rsub = r.add_subparsers(dest="recipe", metavar="RECIPE")
    r.set_defaults(func=lambda args: r.print_help(sys.stderr) or 2)
    for module in MODULES:
        importlib.import_module(module).add_commands(rsub)
