"""Text into sentences for synthesis: sentence ends, then clauses, then words, so no piece is too long."""

from __future__ import annotations

import re

SENTENCE_MAX_CHARS = 300  # longer sentences are cut at clauses, then at words

# Abbreviations whose full stop does not end a sentence (compared lowercased, without the final dot).
_ABBREVIATIONS = """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx no nos fig figs vol vols ch sec p pp
ed eds inc ltd co corp dept univ gen col lt sgt capt rev hon jan feb mar apr jun jul aug sep sept oct nov dec"""
ABBREVIATIONS = frozenset(_ABBREVIATIONS.split())
_SENTENCE_END = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)"  # Latin: the mark(s), closing quotes/brackets, then a space
    r"|[\u3002\uff01\uff1f]+[\u201d\u300d\u300f)\uff09]*"  # CJK full-width marks need no space
)
_CLAUSE_END = re.compile(r"[,;:\u2013\u2014](?=\s)|[\uff0c\uff1b\uff1a\u3001]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def split_sentences(text: str, max_chars: int = SENTENCE_MAX_CHARS) -> list[str]:
    """Sentences of `text` in order, none longer than `max_chars`: cut at sentence ends (not after "Dr." or
    "e.g.", not inside "3.14"), then overlong ones at clauses, then at words, then anywhere; pieces without a
    letter or digit are left out."""
    text = " ".join(text.split())
    out: list[str] = []
    for sentence in _cut(text, _sentence_ends(text)):
        out += _fit(sentence, max_chars)
    return [s for s in out if has_words(s)]  # a piece of marks alone ("!!!", '"?"') has nothing to say


def _sentence_ends(text: str) -> list[int]:
    ends = []
    for m in _SENTENCE_END.finditer(text):
        if m.group().startswith(".") and not _ends_sentence(text, m.start(), m.end()):
            continue
        ends.append(m.end())
    return ends


def _ends_sentence(text: str, dot: int, after: int) -> bool:
    """A full stop ends a sentence unless it closes an abbreviation or initial, or lowercase text follows."""
    word = text[:dot].rsplit(" ", 1)[-1].lstrip("\"'(\u201c\u2018[").lower()
    if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return False
    rest = text[after:].lstrip()
    return not (rest[:1].islower())


def _cut(text: str, ends: list[int]) -> list[str]:
    pieces, start = [], 0
    for end in [*ends, len(text)]:
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    return pieces


def _fit(sentence: str, max_chars: int) -> list[str]:
    """`sentence` as pieces of at most max_chars: clauses packed greedily, then words, then hard cuts."""
    return [piece for piece, _ in _fit_parts(sentence, max_chars)]


def _fit_parts(sentence: str, max_chars: int) -> list[tuple[str, str]]:
    """_fit's pieces, each with what stood before it in `sentence` (the first: ""). Packed parts are joined by
    that: a space between words and after a Latin clause mark, nothing after a CJK clause mark or inside a
    hard-cut run, so every piece is a stretch of the sentence itself."""
    if len(sentence) <= max_chars:
        return [(sentence, "")]
    ends = [m.end() for m in _CLAUSE_END.finditer(sentence)]
    bounds = [0, *ends, len(sentence)]
    clauses = [(sentence[a:b].strip(), " " if sentence[a : a + 1].isspace() else "")
               for a, b in zip(bounds, bounds[1:], strict=False)]
    clauses = [(c, g) for c, g in clauses if c]
    if len(clauses) > 1:
        return _pack([(p, g if j == 0 else pg)
                      for c, g in clauses for j, (p, pg) in enumerate(_fit_parts(c, max_chars))], max_chars)
    words = sentence.split(" ")
    if len(words) > 1:
        return _pack([(p, " " if j == 0 else pg)
                      for w in words for j, (p, pg) in enumerate(_fit_parts(w, max_chars))], max_chars)
    return [(sentence[i : i + max_chars], "") for i in range(0, len(sentence), max_chars)]


def _pack(parts: list[tuple[str, str]], max_chars: int) -> list[tuple[str, str]]:
    """Parts joined greedily, each by what stood before it, while a piece stays within max_chars."""
    out: list[tuple[str, str]] = []
    for p, gap in parts:
        if out and len(out[-1][0]) + len(gap) + len(p) <= max_chars:
            out[-1] = (out[-1][0] + gap + p, out[-1][1])
        else:
            out.append((p, gap))
    return out


def has_words(text: str) -> bool:
    """Whether `text` has something to say: a letter or a digit, in any script ("!!! ???" has not)."""
    return any(c.isalnum() for c in text)


def estimate_audio_s(text: str) -> float:
    """Rough spoken length: ~14 characters a second for alphabetic text, ~4.5 for CJK characters."""
    cjk = len(_CJK.findall(text))
    return 0.22 * cjk + 0.07 * (len(text) - cjk)


# The scripts each language is written in (unicodedata names start with these); a language not listed is not
# checked. Han covers Chinese and the kanji of Japanese.
LANGUAGE_SCRIPTS = {
    "english": ("LATIN",), "german": ("LATIN",), "french": ("LATIN",), "italian": ("LATIN",),
    "spanish": ("LATIN",), "portuguese": ("LATIN",), "russian": ("CYRILLIC",), "chinese": ("CJK",),
    "japanese": ("CJK", "HIRAGANA", "KATAKANA"), "korean": ("HANGUL",),
}


def script_of(ch: str) -> str:
    """The script of a letter by its Unicode name ("LATIN", "HEBREW", "CJK", ...); "" when it has none."""
    import unicodedata

    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else ""


def uncovered_script(text: str, languages: list[str]) -> str | None:
    """The script most of `text`'s letters are written in when none of `languages` is written in it (the model
    would read it as letter names or noise), else None. Languages whose script is unknown here cover anything."""
    known = [LANGUAGE_SCRIPTS.get(lang) for lang in languages if lang != "auto"]
    if not known or any(s is None for s in known):
        return None
    covered = {s for scripts in known for s in scripts}
    letters = [script_of(c) for c in text if c.isalpha()]
    if not letters:
        return None
    outside = [s for s in letters if s not in covered]
    if len(outside) * 2 <= len(letters):
        return None
    return max(set(outside), key=outside.count)


def script_warnings(text: str, languages: list[str]) -> tuple[str, ...]:
    """A warning for the user when `text` is mostly in a script none of the model's `languages` covers, else none."""
    script = uncovered_script(text, languages)
    if script is None:
        return ()
    name = {"CJK": "Han (CJK)"}.get(script, script.title())
    covered = ", ".join(lang for lang in languages if lang != "auto")
    return (f"the text is mostly in {name} script, which this model's languages ({covered}) do not cover: expect "
            "letter names or noise",)
