"""Text front ends a model can ask for in its config.json (`leapvox_text_frontend`), run before tokenization.

`espeak-ng-ipa` (the bundled demo model): English text -> espeak-ng IPA, exactly as the demo's training data was
made. Needs the espeak-ng program (Debian/Ubuntu: `apt install espeak-ng`; macOS: `brew install espeak-ng`).

`hibari-g2p`: English text -> misaki-style phonemes from hibari-tts's own pure-Python G2P (lexicon, tagger, a small
ONNX net for unknown words; numbers, dates and units read out), the string hibari's synthesiser reads. Needs only
pip: `pip install 'leapvox[hibari]'` (hibari-tts 0.2.1, numpy, onnxruntime).

`graphemes`: no front end program at all: the text, lower-cased, typographic quotes and dashes made plain and
whitespace collapsed, goes straight to the tokenizer (as the real Qwen models read text). Digits and symbols pass
through as they are; a model trained on text without them has never seen them.

A config naming any other front end is refused (`text_frontend`), rather than fed raw text it was not trained on.
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


HIBARI_VERSION = "0.2.1"  # the G2P that made the training phonemes; another version may read words otherwise
_HIBARI_G2P = None


def hibari_available() -> bool:
    from importlib.util import find_spec

    return find_spec("hibari") is not None


def hibari_phonemes(text: str) -> str:
    """hibari-tts's G2P of `text`: its sentences (hibari's own split) phonemized and joined by spaces."""
    global _HIBARI_G2P
    try:
        from hibari.g2p import G2P
        from hibari.tts import Hibari
    except ImportError:
        raise LeapvoxError(
            "this model reads phonemes from hibari-tts's G2P, which is not installed",
            hint=f"pip install 'leapvox[hibari]' (hibari-tts=={HIBARI_VERSION}: pure Python + onnxruntime)",
        ) from None
    if _HIBARI_G2P is None:
        _HIBARI_G2P = G2P(british=False)
    text = _LONE_NEWLINE.sub(" ", text.replace("\0", " "))
    return " ".join(p for p in (_HIBARI_G2P(s) for s in Hibari.split_sentences(text)) if p)


_PLAIN = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": " - ",
                        "\u2026": "..."})


def graphemes(text: str) -> str:
    """The `graphemes` front end: lower case, plain quotes and dashes, one space between words."""
    return " ".join(text.translate(_PLAIN).lower().split())


FRONTENDS: dict[str, Callable[[str], str]] = {"espeak-ng-ipa": ipa, "hibari-g2p": hibari_phonemes,
                                              "graphemes": graphemes}


# what a front end needs beyond leapvox's own dependencies (doctor shows it); the others need nothing
FRONTEND_NEEDS = {"espeak-ng-ipa": "espeak-ng", "hibari-g2p": "hibari-tts (pip)"}


def text_frontend(raw_config: dict) -> Callable[[str], str] | None:
    """The text -> text step a model's config.json asks for, or None when it names none."""
    name = raw_config.get("leapvox_text_frontend")
    if name is None:
        return None
    if name not in FRONTENDS:
        raise LeapvoxError(f"the model asks for text front end {name!r}, which this leapvox does not have",
                           hint=f"known front ends: {', '.join(FRONTENDS)}; a newer leapvox may have it")
    return FRONTENDS[name]
