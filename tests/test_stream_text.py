"""Text that arrives while it is spoken (#40): the incremental segmenter against markup.segments, stream_text against
stream, and `speak -` / `speak -f FIFO` reading real pipes as they are written."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from leapvox.engine.errors import InputError
from leapvox.engine.markup import Pause, segments
from leapvox.engine.textfeed import FLUSH, TextFeed, TextPieces

from .conftest import FIXTURES

TINY = FIXTURES / "tiny-0b6"

# ---- TextFeed: any cutting of a text gives the whole text's segments ------------------------------------------

# words, marks and markup that decide where sentences end: abbreviations, initials, lowercase after a full stop,
# CJK marks without a space, closing quotes, pause tags (whole, cut, malformed), paragraph breaks
_BITS = ["Hello", "world", "the", "Dr", "e.g", "x", "3.14", "i", " ", "  ", "\n", "\n\n", " \n \n", ".", ". ", "! ",
         "? ", "...", "\u2026 ", "\u3002", "\u4f60\u597d", "\u300d", '"', "\u201c", ")", ",", "[pause 1s]",
         "[pause 200ms]", "[ Pause 0.5s ]", "[pause", "]", "[pa", "[pause x]", "[", "Mr. ", "Caf\u00e9"]
texts = st.lists(st.sampled_from(_BITS), max_size=24).map("".join)


def fed(pieces, max_chars=300):
    feed, out = TextFeed(max_chars), []
    for p in pieces:
        out += feed.flush() if p is FLUSH else feed.feed(p)
    return out + feed.close()


def outcome(f, *a):
    try:
        return f(*a)
    except InputError as e:
        return str(e)  # a malformed tag: the same message, at the same character


@settings(max_examples=400, deadline=None)
@given(texts, st.lists(st.integers(0, 400)), st.sampled_from([300, 12]))
def test_any_cutting_gives_the_segments_of_the_whole_text(text, cuts, max_chars):
    at = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
    assert outcome(fed, pieces, max_chars) == outcome(segments, text, max_chars)


def test_a_sentence_is_handed_out_once_the_next_one_starts():
    feed = TextFeed()
    assert feed.feed("Hello there.") == [] and feed.feed(" ") == []  # "Hello there. e.g." would not end there
    assert feed.feed("Dr") == ["Hello there."]
    assert feed.feed(". Smith is here. [pause 1s]") == ["Dr. Smith is here."]
    assert feed.feed(" ") == []  # the pause waits for what follows: pauses next to each other add up
    assert feed.feed("[pause 500ms]\n\nBye") == []
    assert feed.feed(" now") == [] and feed.flush() == [Pause(1.5 + 0.35), "Bye now"]  # the producer paused
    assert feed.feed("\n\nEnd") == [] and feed.close() == [Pause(0.35), "End"]


def test_a_paragraph_break_ends_a_sentence_without_a_mark():
    feed = TextFeed()
    assert feed.feed("A heading\n") == [] and feed.feed("\n") == ["A heading"]


def test_text_pieces_from_another_thread_flush_when_the_producer_pauses():
    pieces, release = TextPieces(idle_s=0.05), threading.Event()

    def produce():
        pieces.put("Hello there")  # no end mark: spoken after the idle pause
        release.wait(30)
        pieces.put(" and bye.")
        pieces.close()

    threading.Thread(target=produce, daemon=True).start()
    got = []
    for p in pieces:
        got.append(p)
        if p is FLUSH:
            release.set()
    assert got == ["Hello there", FLUSH, " and bye."]
    assert fed(got) == ["Hello there", "and bye."]


def test_a_failing_producer_raises_in_the_consumer():
    pieces = TextPieces()
    pieces.put("Hi.")
    pieces.fail(InputError("cannot read it"))
    with pytest.raises(InputError, match="cannot read it"):
        list(pieces)


# ---- stream_text: the same samples as the whole text ---------------------------------------------------------


@functools.cache
def demo():
    from leapvox.models.load import load_model

    return load_model("demo", weights="fp32")


def test_streamed_pieces_give_the_samples_of_the_whole_text():
    """Sentence level: the same sentences streamed in pieces (cut inside words, marks and a pause tag) or given
    whole give the same samples and codes for a seed: one random stream, one codec state per sentence, the same
    joins; the pause is silence between them."""
    model = demo()
    opts = replace(model.defaults, seed=7, max_frames=6)
    text = "Hello there. Dr. Smith [pause 500ms] is here!"
    whole = list(model.synthesizer().stream(text, opts))
    cuts = ["Hel", "lo there", ". Dr", ". Smith [pa", "use 50", "0ms] is", " here!"]
    streamed = list(model.synthesizer().stream_text(iter(cuts), opts))
    join = lambda cs, f: np.concatenate([f(c) for c in cs])  # noqa: E731
    assert np.array_equal(join(streamed, lambda c: c.audio), join(whole, lambda c: c.audio))
    assert np.array_equal(join(streamed, lambda c: c.codes), join(whole, lambda c: c.codes))
    assert streamed[-1].stats.sentences == whole[-1].stats.sentences == 3
    assert streamed[-1].stats.stop_reasons == whole[-1].stats.stop_reasons
    audio = join(whole, lambda c: c.audio)
    runs = np.diff(np.flatnonzero(np.concatenate([[1], audio != 0, [1]])))  # gaps between non-zero samples
    assert runs.max() - 1 >= 0.5 * 24000 - 2 * 0.015 * 24000  # the pause, less the crossfades into and out of it


def test_a_text_with_nothing_to_say_is_an_input_error_once_the_pieces_end():
    model = demo()
    with pytest.raises(InputError, match="no text"):
        list(model.synthesizer().stream_text(iter(["!!! ", "[pause 1s]"]), model.defaults))


# ---- speak - and speak -f FIFO: real pipes, written while speak runs -----------------------------------------

SPEAK = [sys.executable, "-m", "leapvox.app.cli", "speak", "-o", "-", "--model", str(TINY), "--max-frames", "3",
         "--greedy"]
HEADER = 44  # a streaming WAV header
TWO_SENTENCES = (2 * 3 * 1920 - 360) * 2  # bytes: two sentences of 3 frames joined by a 15 ms crossfade, 16 bits


def _read_audio_then_finish(proc, write, finish) -> tuple[bytes, bytes]:
    """Wait until audio samples (past the WAV header) come out of `proc`'s stdout, then `finish()` the input; the
    whole stdout and stderr. The second part of the text is written only after audio came: if speak waited for the
    end of its input, this would wait forever (the guard below is for a hang, not a speed limit)."""
    out, got = bytearray(), threading.Event()

    def reader():
        while chunk := proc.stdout.read1(4096):
            out.extend(chunk)
            if len(out) > HEADER:
                got.set()
        got.set()

    threading.Thread(target=reader, daemon=True).start()
    write()
    assert got.wait(600), "no audio before the end of the input"
    assert len(out) > HEADER and proc.poll() is None  # audio out, and speak still running: still reading the input
    finish()
    err = proc.stderr.read()
    assert proc.wait(120) == 0, err.decode()
    return bytes(out), err


def test_speak_from_a_pipe_speaks_the_first_sentence_before_the_second_is_written():
    proc = subprocess.Popen([*SPEAK[:4], "-", *SPEAK[4:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)

    def write(text):
        proc.stdin.write(text.encode())
        proc.stdin.flush()

    def finish():
        write("And a tail without an end mark")  # closed mid-sentence: still spoken
        proc.stdin.close()

    out, err = _read_audio_then_finish(proc, lambda: write("Hello there. "), finish)
    assert out[:4] == b"RIFF" and b"2 sentence(s)" in err
    assert len(out) - HEADER == TWO_SENTENCES


def test_speak_from_a_fifo(tmp_path):
    fifo = tmp_path / "text"
    os.mkfifo(fifo)
    proc = subprocess.Popen([*SPEAK[:4], "-f", str(fifo), *SPEAK[4:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with open(fifo, "w") as w:  # opens once speak has opened it for reading
        def write(text):
            w.write(text)
            w.flush()

        out, err = _read_audio_then_finish(proc, lambda: write("Hello there. "), lambda: (write("Bye."), w.close()))
    assert b"2 sentence(s)" in err and len(out) - HEADER == TWO_SENTENCES


@pytest.mark.parametrize("data, needle", [
    (b"Caf\xe9 au lait.", "it is not utf-8 text (byte 0xe9 at offset 3)"),
    ("Hi.".encode("utf-16"), "it is UTF-16 text, not utf-8 text"),
    (b"Hi.\0", "standard input contains a NUL byte (at character 3)"),
    (b"", "the text is empty"),
    (b"Hi [pause 5", "unclosed pause tag '[pause 5' at character 4"),
])
def test_a_pipe_with_no_text_is_one_line(data, needle):
    """Before the load where the input ends before its first words; an open tag after them at the end of input."""
    proc = subprocess.run([*SPEAK[:4], "-", *SPEAK[4:]], input=data, capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert proc.stdout == (b"" if "pause" not in needle else proc.stdout[:HEADER])  # no audio


def test_the_reader_joins_characters_and_escapes_split_across_reads(monkeypatch):
    from leapvox.app.common import _read_pieces

    reads = iter([b"Caf\xc3", b"\xa9 \x1b[3", b"1mred\x1b", b"[0m.\x07", b""])  # a character and escapes cut in two
    monkeypatch.setattr(os, "read", lambda fd, n: next(reads))
    pieces = TextPieces()
    _read_pieces(0, "standard input", pieces, False)
    assert "".join(pieces) == "Caf\u00e9 red."


# ---- a sentence still being written (streaming text layout) ---------------------------------------------------


@functools.cache
def tiny_tokens():
    from leapvox.engine.prompt import wrap_text
    from leapvox.models.tokenizer import TextTokenizer

    tok = TextTokenizer(TINY)
    return lambda text: tok(wrap_text(text))[3:-5]


def fed_opening(pieces, max_chars):
    """`fed`, asking the feed for the open sentence's sure start after every piece: the segments, and (where in
    them the next ones go, the start) for every start given."""
    feed, out, starts = TextFeed(max_chars), [], []
    for p in pieces:
        out += feed.flush() if p is FLUSH else feed.feed(p)
        pauses, start = feed.opening()
        out += pauses
        if start:
            starts.append((len(out), start))
    return out + feed.close(), starts


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(st.integers(0, 400)), st.sampled_from([300, 12]))
@example("Hello there, one two three fourteen fifteen.", [27], 30)  # cut at the clause: "Hello there," is the first
def test_an_open_sentence_begins_as_the_sentence_handed_out_for_it(text, cuts, max_chars):
    """Whatever comes next, the sentence handed out begins with every sure start given for it, at a word boundary,
    and its tokens with the start's tokens; the segments stay those of the whole text (a pause given out early
    is the one before that sentence)."""
    at = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
    try:
        out, starts = fed_opening(pieces, max_chars)
    except InputError as e:
        assert str(e) == outcome(segments, text, max_chars)
        return
    assert out == segments(text, max_chars)
    tokens = tiny_tokens()
    for i, start in starts:
        sentence = out[i]
        assert isinstance(sentence, str) and (sentence == start or sentence.startswith(start + " ")), (sentence, start)
        assert tokens(sentence)[: len(tokens(start))] == tokens(start)


def test_the_sure_start_stops_at_whole_words_and_the_last_clause_mark():
    feed = TextFeed()
    said = [(feed.feed(p), *feed.opening()) for p in ["[pause 1s] Hel", "lo there", " my", " friend, how", " are"]]
    assert [s for *_, s in said] == ["", "Hello", "Hello there", "Hello there my friend,", "Hello there my friend,"]
    assert [fed + pauses for fed, pauses, _ in said] == [[], [Pause(1.0)], [], [], []]  # out with the first start
    feed = TextFeed(max_chars=20)
    feed.feed("one two three four five six ")
    assert feed.opening() == ([], "")  # over max_chars: where it is cut is not sure yet


@functools.cache
def tiny():
    from leapvox.models.load import load_model

    return load_model(str(TINY), weights="fp32")


OPEN = "Hello there my good friend how are you doing on this fine day"


def _producer(heard: list[int], held: list[int]):
    """The text in words; before handing over the end of the sentence, note how much audio the listener had."""
    for i, w in enumerate(OPEN.split()):
        yield w if i == 0 else " " + w
    held.append(heard[0])
    yield " today. Bye now."


@pytest.mark.parametrize("model, layout, early", [("tiny", "streaming", True), ("tiny", "non-streaming", False),
                                                   ("demo", "streaming", False)])
def test_in_sentence_streaming_speaks_before_the_sentence_ends(model, layout, early):
    """Streaming layout on a word-level tokenizer: audio comes out while the producer still holds back the end of
    the sentence (counted in samples the listener got, not in time), and the codes and samples equal those of the
    whole text. The non-streaming layout, and a model with a phoneme front end, wait for the sentence."""
    m = tiny() if model == "tiny" else demo()
    opts = replace(m.defaults, seed=3, text_layout=layout, max_frames=6)
    heard, held, streamed = [0], [], []
    for c in m.synthesizer().stream_text(_producer(heard, held), opts):
        heard[0] += len(c.audio)
        streamed.append(c)
    whole = list(m.synthesizer().stream(OPEN + " today. Bye now.", opts))
    assert (held[0] > 0) is early  # some of the sentence's audio before its end was written
    for part in ("codes", "audio"):
        assert np.array_equal(np.concatenate([getattr(c, part) for c in streamed]),
                              np.concatenate([getattr(c, part) for c in whole]))
    assert streamed[-1].stats.stop_reasons == whole[-1].stats.stop_reasons
    assert streamed[-1].stats.sentences == 2



def test_auto_layout_starts_an_open_sentence_streaming_and_lays_out_whole_ones_as_the_official_default():
    """The default layout, `auto`, per sentence: the sentence still being written starts before its end in the
    streaming layout (its codes are the streaming layout's for that sentence), the one that arrives whole is laid out
    non-streaming; a whole text given at once is exactly the non-streaming layout (the official default)."""
    from leapvox.engine.options import SynthesisOptions

    assert SynthesisOptions().text_layout == "auto"
    m = tiny()
    synth = m.synthesizer()
    opts = replace(m.defaults, max_frames=6).greedy()  # greedy: each sentence's codes depend on it alone
    assert opts.text_layout == "auto"
    heard, held, streamed = [0], [], []
    for c in synth.stream_text(_producer(heard, held), opts):
        heard[0] += len(c.audio)
        streamed.append(c)
    assert held[0] > 0  # audio before the first sentence's end was written
    codes = lambda chunks: np.concatenate([c.codes for c in chunks])  # noqa: E731
    first = codes(synth.stream(OPEN + " today.", replace(opts, text_layout="streaming")))
    second = codes(synth.stream("Bye now.", replace(opts, text_layout="non-streaming")))
    assert np.array_equal(codes(streamed), np.concatenate([first, second]))
    sampled, whole = replace(m.defaults, max_frames=6, seed=4), OPEN + " today. Bye now."
    auto = list(synth.stream(whole, sampled))
    official = list(synth.stream(whole, replace(sampled, text_layout="non-streaming")))
    for part in ("codes", "audio"):
        assert np.array_equal(np.concatenate([getattr(c, part) for c in auto]),
                              np.concatenate([getattr(c, part) for c in official])), part


def test_a_pause_is_as_long_as_asked():
    """The text with a pause is longer than without it by the pause, within a sample: the silence makes up for the
    crossfades into and out of it (the sentences are the same: a pause draws no random numbers)."""
    model = demo()
    opts = replace(model.defaults, seed=7, max_frames=2)
    length = lambda text: sum(len(c.audio) for c in model.synthesizer().stream(text, opts))  # noqa: E731
    assert abs(length("Hi. [pause 0.25s] [pause 250ms] Bye.") - length("Hi. Bye.") - 12000) <= 1  # between two
    one = length("Hi.")
    assert abs(length("[pause 1s] Hi.") - one - 24000) <= 1 and abs(length("Hi. [pause 1s]") - one - 24000) <= 1


def test_the_runaway_guard_of_an_open_sentence_counts_its_whole_text(monkeypatch):
    """An open sentence's cap comes from all its tokens, known once it is closed: it stops where the whole text's
    utterance stops, with the same codes (a cap of tokens + 3 here, so that the tiny model reaches it)."""
    import leapvox.engine.synthesis as synthesis

    monkeypatch.setattr(synthesis, "guard_frames", lambda n, rate=None: n + 3)
    m = tiny()
    opts = replace(m.defaults, seed=5, text_layout="streaming", max_frames=500)
    text = "one two three four"
    streamed = list(m.synthesizer().stream_text(iter([w + " " for w in text.split()]), opts))
    whole = list(m.synthesizer().stream(text, opts))
    assert streamed[-1].stats.stop_reasons == whole[-1].stats.stop_reasons == ("guard",)
    n = len(m.synthesizer().text_ids(text)) - 8
    assert streamed[-1].stats.sentences == 1
    assert f"the runaway cap for {n} text tokens" in streamed[-1].stats.warnings[0]
    codes = [np.concatenate([c.codes for c in cs]) for cs in (streamed, whole)]
    assert np.array_equal(*codes) and len(codes[0]) == n + 3


def test_the_frames_made_before_the_text_runs_dry_are_handed_out():
    """When decoding waits for words, the frames it made are decoded and handed out then, not held for a chunk that
    would fill up only after more text: the producer writes the rest only once it heard all the start can give."""
    m = tiny()
    ids = m.synthesizer().text_ids("Hello there my")[3:-5]  # 6 tokens: chunks of 1, 2, then 3 of 4 frames
    opts = replace(m.defaults, seed=3, text_layout="streaming", max_frames=len(ids) + 2)
    pieces, heard, enough, waited = TextPieces(), [0], threading.Event(), []
    target = len(ids) * 1920 - int(round(0.015 * 24000))  # a frame per token, less the crossfade held back

    def produce():
        pieces.put("Hello there my ")
        waited.append(enough.wait(600))  # a hang guard: without the early hand-out, that audio never comes
        pieces.put("good day.")
        pieces.close()

    threading.Thread(target=produce, daemon=True).start()
    for c in m.synthesizer().stream_text(pieces, opts):
        assert enough.is_set() or c.stats.frames <= len(ids)  # before the rest, only what the start gives
        heard[0] += len(c.audio)
        if heard[0] >= target:
            enough.set()
    assert waited == [True] and c.stats.frames == len(ids) + 2
