"""Text front ends a model can ask for in its config.json (`leapvox_text_frontend`), run before tokenization.

`espeak-ng-ipa` (the bundled demo model): English text -> espeak-ng IPA, exactly as the demo's training data was
made. Needs the espeak-ng program (Debian/Ubuntu: `apt install espeak-ng`; macOS: `brew install espeak-ng`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

from leapvox.engine.errors import LeapvoxError

VOICE = "en-us"
CANONICAL = (175, 50)  # espeak-ng defaults: words per minute, pitch; every sentence gets this variant
CLAUSE_END = re.compile(r"[,;:.!?]+(?=\s|$)")
FINAL_MARKS = ",;:.!?"  # a text ending in one of these gets it back at the end
# A lone line break ends a clause when espeak-ng reads standard input but not in an argument (a blank line ends
# one in both): it becomes a space, so that stdin gives what the argument gave
_LONE_NEWLINE = re.compile(r"(?<!\n)\n(?!\n)")


def phoneme_string(text: str, clauses: list[str]) -> tuple[str, bool]:
    """espeak prints one IPA line per clause and drops punctuation; put the text's clause punctuation back
    ("həlˈoʊ, wˈɜːld."). Returns (string, aligned). A text without final punctuation has one mark fewer than
    clauses; its last clause stays bare ("həlˈoʊ, wˈɜːld"). When the counts differ otherwise the clauses are joined
    by spaces and only the final mark is kept (as the demo's training data was made: its sentences end in .!?)."""
    marks = CLAUSE_END.findall(text)
    if len(marks) == len(clauses):
        return " ".join(c + m for c, m in zip(clauses, marks, strict=True)), True
    if text and text[-1] in FINAL_MARKS:
        return " ".join(clauses) + text[-1], False
    if clauses and len(marks) == len(clauses) - 1:
        return " ".join(c + m for c, m in zip(clauses, marks + [""], strict=True)), True
    return " ".join(clauses), False


def ipa(text: str) -> str:
    """The phoneme string the demo model was trained on, for `text` (canonical speed and pitch)."""
    if shutil.which("espeak-ng") is None:
        raise LeapvoxError(
            "the demo model reads phonemes from espeak-ng, which is not installed",
            hint="install it (apt install espeak-ng / brew install espeak-ng), or use --model with a Qwen3-TTS model",
        )
    # the text goes on standard input, not in argv: a long text would not fit there (E2BIG), nor would a NUL
    cmd = ["espeak-ng", "-q", "-v", VOICE, "-s", str(CANONICAL[0]), "-p", str(CANONICAL[1]), "--ipa"]
    out = subprocess.run(cmd, input=_LONE_NEWLINE.sub(" ", text.replace("\0", " ")), capture_output=True,
                         text=True, encoding="utf-8", check=True).stdout
    clauses = [line.strip() for line in out.splitlines() if line.strip()]
    return phoneme_string(text, clauses)[0]


def text_frontend(raw_config: dict) -> Callable[[str], str] | None:
    """The text -> text step a model's config.json asks for, or None."""
    return ipa if raw_config.get("leapvox_text_frontend") == "espeak-ng-ipa" else None
