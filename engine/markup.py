"""Pause markup in the text to speak: `[pause 500ms]`, `[pause 1.5s]` (silence of that length) and paragraph breaks (a
blank line: a pause a little longer than the one a sentence end makes). Other bracketed text is spoken as written."""

from __future__ import annotations

import re
from dataclasses import dataclass

from leapvox.engine.errors import InputError
from leapvox.engine.text import SENTENCE_MAX_CHARS, split_sentences

PARAGRAPH_PAUSE_S = 0.35  # added between paragraphs, on top of the model's own silence at a sentence end
PAUSE_MAX_S = 60.0
_TAG = re.compile(r"\[\s*pause\b([^\[\]]*)\]", re.I)
_OPEN = re.compile(r"\[\s*pause\b", re.I)
_VALUE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", re.I)
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_TOKEN = re.compile(rf"{_TAG.pattern}|{_PARAGRAPH.pattern}", re.I)


@dataclass(frozen=True)
class Pause:
    """Silence in the speech, in seconds."""

    seconds: float


Segment = str | Pause  # a sentence to speak, or a pause


def segments(text: str, max_chars: int = SENTENCE_MAX_CHARS) -> list[Segment]:
    """`text` as what the stream speaks, in order: its sentences (text.split_sentences, within each stretch of text
    between tags and paragraph breaks) and its pauses (tags anywhere; a paragraph break only between two sentences;
    pauses next to each other add up). A malformed tag raises InputError (see check_markup)."""
    check_markup(text)
    out: list[Segment] = []
    start, paragraph, said = 0, False, False
    for m in [*_TOKEN.finditer(text), None]:
        for s in split_sentences(text[start : m.start() if m else len(text)], max_chars):
            if paragraph and said:
                _add_pause(out, PARAGRAPH_PAUSE_S)
            out.append(s)
            paragraph, said = False, True
        if m is None:
            break
        if m.group().startswith("["):
            _add_pause(out, _seconds(m))
        else:
            paragraph = True
        start = m.end()
    return out


def _add_pause(out: list[Segment], seconds: float) -> None:
    if out and isinstance(out[-1], Pause):
        out[-1] = Pause(out[-1].seconds + seconds)
    else:
        out.append(Pause(seconds))


def _seconds(m: re.Match) -> float:
    v = _VALUE.fullmatch(m.group(1))
    value = float(v.group(1)) / (1000 if v.group(2).lower() == "ms" else 1)
    return value


def check_markup(text: str) -> None:
    """Every pause tag well formed: `[pause N ms]` or `[pause N s]`, N a number, at most PAUSE_MAX_S seconds."""
    tags = {m.start(): m for m in _TAG.finditer(text)}
    for o in _OPEN.finditer(text):
        m = tags.get(o.start())
        where = f"at character {o.start() + 1}"
        hint = "write a length with its unit, e.g. [pause 500ms] or [pause 1.5s]"
        if m is None:
            raise InputError(f"unclosed pause tag {_shown(text[o.start():o.start() + 24])} {where}", hint=hint)
        v = _VALUE.fullmatch(m.group(1))
        if v is None:
            raise InputError(f"malformed pause tag {_shown(m.group())} {where}", hint=hint)
        if _seconds(m) > PAUSE_MAX_S:
            raise InputError(f"pause tag {_shown(m.group())} {where} is longer than {PAUSE_MAX_S:g} s",
                             hint="split it, or edit the silence in afterwards")


def strip_markup(text: str) -> str:
    """`text` without its pause tags (what is said)."""
    return _TAG.sub(" ", text)


def _shown(s: str) -> str:
    return repr(s if len(s) <= 40 else s[:37] + "...")
