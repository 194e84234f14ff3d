"""Text that arrives in pieces, as what the stream speaks: `TextFeed` cuts sentences and pauses (markup.segments)
out of a growing text as soon as they are sure, and `TextPieces` is a thread-safe queue of pieces to feed it from
another thread (a pipe reader, a WebSocket).

A segment is sure once nothing that may still come can change it: a sentence end followed by the start of the
next sentence (the next character decides: "Dr. Smith", "e.g. this"), a paragraph break, a closed pause tag. A
pause is handed out with the sentence after it (pauses next to each other add up). Fed any cutting of a text into
pieces and then closed, a feed gives exactly `markup.segments` of the whole text; `flush` (the producer paused)
gives what is there before that.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator

from leapvox.engine.markup import _OPEN, _TAG, _TOKEN, PARAGRAPH_PAUSE_S, Pause, Segment, _seconds, check_markup
from leapvox.engine.text import _CLAUSE_END, SENTENCE_MAX_CHARS, _sentence_ends, has_words, split_sentences

_PARTIAL_OPEN = re.compile(r"\[\s*(?:p(?:a(?:u(?:s(?:e)?)?)?)?)?", re.I)  # what may still become a pause tag
_WORD = re.compile(r"\S")
_DECISIVE = re.compile(r"[\[\]\n.!?\u2026\u3002\uff01\uff1f]")  # tag brackets, line breaks, sentence-end marks
_QUOTES = "\"'(\u201c\u2018["  # what text._ends_sentence strips off the front of the word before a full stop


class TextFeed:
    """An incremental `markup.segments`: `feed(piece)`, `flush()`, `close()` each return the segments now sure."""

    def __init__(self, max_chars: int = SENTENCE_MAX_CHARS):
        self.max_chars = max_chars
        self.buf = ""  # text not cut yet: the open stretch, maybe a pause tag in the making
        self.offset = 0  # characters before `buf` (for the position in a malformed tag's message)
        self.done = 0  # sentences of the open stretch already handed out (a cut only where a space follows)
        self.pause: float | None = None  # pause seconds waiting for the next sentence
        self.paragraph = self.said = False

    def feed(self, piece: str) -> list[Segment]:
        start = len(self.buf)
        self.buf += piece
        while start > 0 and self.buf[start - 1].isspace():
            start -= 1
        if not _DECISIVE.search(self.buf, max(0, start - 64)):
            return []  # nothing near the new text can end a stretch or a sentence: a long one costs no rescans
        return self._take()

    def flush(self) -> list[Segment]:
        """The input paused: the open sentence as it stands (a pause tag in the making stays)."""
        return self._take(flush=True)

    def close(self) -> list[Segment]:
        """End of input: everything left; a pause tag left open is an InputError, as for a whole text."""
        self._check(self.buf)
        out = self._take(flush=True, end=True)
        if self.pause is not None:
            out.append(Pause(self.pause))
            self.pause = None
        return out

    def opening(self) -> tuple[list[Segment], str]:
        """The sentence being written, before it is sure: the start that the sentence handed out for it will begin
        with, or "" (whole words, each followed by a space already, a word-level tokenizer's tokens of them are
        final; up to its last clause mark if it has one, as an overlong sentence is cut at clauses: where, only its
        end can tell). With such a start, a pause waiting for the sentence is sure now and comes out (only) here."""
        stretch = settled(self.buf)
        last = stretch.rfind("[")
        if last >= 0 and _PARTIAL_OPEN.fullmatch(stretch, last):
            stretch = stretch[:last]  # "[pa" may still become a tag
        text = " ".join(stretch.split())
        pieces = split_sentences(text, self.max_chars)[self.done :]
        if len(pieces) != 1 or not text.endswith(pieces[0]):
            return [], ""  # nothing begun, or already too long to be one sentence
        sentence = pieces[0]
        end = len(sentence) if stretch[-1:].isspace() else max(sentence.rfind(" "), 0)
        clauses = [m.end() for m in _CLAUSE_END.finditer(sentence) if m.end() <= end]
        end = clauses[-1] if clauses else end
        if end < len(sentence) and sentence[end] != " ":
            end = max(sentence.rfind(" ", 0, end), 0)  # a CJK clause mark: no word boundary right after it
        start = sentence[:end]
        if not has_words(start):
            return [], ""
        out: list[Segment] = []
        if self.paragraph and self.said:
            self.pause = PARAGRAPH_PAUSE_S if self.pause is None else self.pause + PARAGRAPH_PAUSE_S
        if self.pause is not None:
            out.append(Pause(self.pause))
        self.pause, self.paragraph = None, False
        return out, start

    def _check(self, text: str) -> None:
        check_markup(" " * self.offset + text)  # the same message as for the whole text, at the same character

    def _take(self, flush: bool = False, end: bool = False) -> list[Segment]:
        out: list[Segment] = []
        while True:
            tags = {t.start() for t in _TAG.finditer(self.buf)}
            opened = next((o for o in _OPEN.finditer(self.buf) if o.start() not in tags), None)  # not closed yet
            limit = opened.start() if opened else len(self.buf)
            if opened and "[" in self.buf[opened.end():] and len(self.buf) >= opened.start() + 24:
                self._check(self.buf)  # a tag that can no longer close (its message shows 24 characters)
            m = _TOKEN.search(self.buf, 0, limit)
            if m is None:
                break
            if m.group().startswith("["):
                self._check(self.buf[: m.end()])
            self._sentences(self.buf[: m.start()], out, close=True)
            if m.group().startswith("["):
                self.pause = _seconds(m) if self.pause is None else self.pause + _seconds(m)
            else:
                self.paragraph = True
            self._cut(m.end())
        last = self.buf.rfind("[", 0, limit)
        if not end and limit == len(self.buf) and last >= 0 and _PARTIAL_OPEN.fullmatch(self.buf, last, limit):
            limit = last  # "[pa" at the very end may still become a tag
        self._sentences(self.buf[:limit], out, close=flush)
        if flush:
            self._cut(limit)
        return out

    @staticmethod
    def _context(text: str, end: int) -> int:
        """Where to keep `text` from when cutting at a sentence end `end` with no space after it (CJK): a later
        full stop looks back at its word (text.split_sentences: "Dr.", an initial), so keep the word's last 16
        characters, starting at a letter rather than a quote, or all of it."""
        word = text.rfind(" ", 0, end) + 1
        start = max(word, end - 16)
        while start > word and text[start] in _QUOTES:
            start -= 1
        return start

    def _cut(self, at: int) -> None:
        self.buf, self.offset, self.done = self.buf[at:], self.offset + at, 0

    def _sentences(self, stretch: str, out: list[Segment], close: bool) -> None:
        """The sentences of `stretch` not handed out yet: all when it is closed, else those before its last sure
        sentence end, where the stretch is then cut (keeping what a later full stop may look back at)."""
        text = " ".join(stretch.split())
        if close:
            new = split_sentences(text, self.max_chars)[self.done :]
        else:
            ends = [e for e in _sentence_ends(text) if e < len(text)]  # the next character is there
            if not ends:
                return
            e = ends[-1]
            new = split_sentences(text[:e], self.max_chars)[self.done :]
            start = e if text[e] == " " else self._context(text, e)
            chars = len(_WORD.findall(text[:start]))  # cut the raw stretch before text[start:]
            self._cut(next(m for i, m in enumerate(_WORD.finditer(stretch)) if i == chars - 1).end() if chars else 0)
            self.done = len(split_sentences(text[start:e], self.max_chars))
        for s in new:
            if self.paragraph and self.said:
                self.pause = PARAGRAPH_PAUSE_S if self.pause is None else self.pause + PARAGRAPH_PAUSE_S
            if self.pause is not None:
                out.append(Pause(self.pause))
            out.append(s)
            self.pause, self.paragraph, self.said = None, False, True


def settled(text: str) -> str:
    """`text` up to a pause tag still open at its end (one that may yet close): what can be checked already."""
    tags = {t.start() for t in _TAG.finditer(text)}
    opened = next((o for o in _OPEN.finditer(text) if o.start() not in tags and "[" not in text[o.end():]), None)
    return text[: opened.start()] if opened else text


# ---- pieces from another thread --------------------------------------------------------------------------------


class _Flush:
    def __repr__(self) -> str:
        return "FLUSH"


FLUSH = _Flush()  # in a stream of pieces: the producer paused, speak what is there
_END = object()


class TextPieces:
    """A thread-safe queue of text pieces, iterated by the synthesis thread (`Synthesizer.stream_text(pieces)`):
    producers `put` text, `flush()` (speak the open sentence now), `close()` (end of the text) or `fail(error)`
    (the iterator raises it). With `idle_s`, a pause of that long in the input after some text also flushes."""

    def __init__(self, idle_s: float | None = None):
        self.idle_s, self._q, self._closed = idle_s, queue.SimpleQueue(), threading.Event()

    def put(self, text: str) -> None:
        if text:
            self._q.put(text)

    def flush(self) -> None:
        self._q.put(FLUSH)

    def close(self) -> None:
        self._closed.set()
        self._q.put(_END)

    def fail(self, error: BaseException) -> None:
        self._q.put(error)
        self.close()

    def ready(self) -> bool:
        """Whether a piece is waiting (iterating would not block)."""
        return not self._q.empty()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __iter__(self) -> Iterator[str | object]:
        waiting = False  # text came since the last flush
        while True:
            try:
                item = self._q.get(timeout=self.idle_s if waiting else None)
            except queue.Empty:
                item = FLUSH
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            waiting = item is not FLUSH
            yield item
