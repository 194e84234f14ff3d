"""The command line's shape: what users run at the top level, the recipes under `leapvox recipe`, and a one-line
error with the new spelling for a recipe's old top-level name."""

from __future__ import annotations

import pytest

from leapvox.app.cli import COMMANDS, RENAMED, build_parser, main

USER_COMMANDS = {"speak", "tui", "serve", "batch", "voices", "models", "compare", "bench", "doctor", "paths",
                 "speakers", "devices", "tune"}
RECIPES = ["offsets", "tree", "bench-spec", "window", "bench-window", "coreml", "demo"]


def test_top_level_is_what_users_run_and_says_where_recipes_live(capsys):
    assert set(COMMANDS) == USER_COMMANDS | {"recipe"} and list(COMMANDS)[-1] == "recipe"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "leapvox recipe" in out and not any(old in out for old in RENAMED if old != "demo")


def test_recipes_are_under_one_verb(capsys):
    sub = next(a for a in build_parser("recipe")._subparsers._group_actions if a.dest == "command")
    assert list(sub.choices["recipe"]._subparsers._group_actions[0].choices) == RECIPES
    assert main(["recipe"]) == 2 and "offsets" in capsys.readouterr().err


@pytest.mark.parametrize("old", list(RENAMED))
def test_an_old_recipe_name_is_one_line_with_the_new_spelling(old, capsys):
    assert main([old, "--model", "my model", "--steps", "3"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "usage" not in err
    assert err.strip() == (f"leapvox: error: '{old}' is now a recipe "
                           f"(hint: leapvox recipe {RENAMED[old]} --model 'my model' --steps 3)")


@pytest.mark.parametrize("flag", ["--talker-layers", "--predictor-layers"])
def test_demo_train_refuses_a_depth_below_one_before_loading_anything(flag, tmp_path, capsys):
    (tmp_path / "train.pt").write_bytes(b"")  # never read: the flag is checked first
    assert main(["recipe", "demo", "train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), flag, "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"leapvox: {flag} must be at least 1, got 0" and not (tmp_path / "run").exists()
