"""Streaming synthesis: stream == one-shot (bit-exact, fp32), sentence splitting, joins, stats, cancellation."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapvox.engine.errors import InputError
from leapvox.engine.options import MODES, SynthesisOptions
from leapvox.engine.streaming import CROSSFADE_S, Joiner
from leapvox.engine.text import split_sentences
from leapvox.models.load import load_model

from .conftest import FIXTURES


@functools.cache
def model():
    return load_model(FIXTURES / "tiny-0b6")


def opts(**kw) -> SynthesisOptions:
    return replace(model().defaults, seed=3, **kw)


def collect(text, o, **kw):
    chunks = list(model().synthesizer().stream(text, o, **kw))
    return np.concatenate([c.audio for c in chunks]), chunks


@pytest.mark.parametrize(
    ("sampled", "first", "most", "sizes"), [(True, 2, 16, [2, 4, 8, 3]), (False, 1, 4, [1, 2, 4, 4, 4, 2])]
)
def test_stream_equals_one_shot_bit_exact(sampled, first, most, sizes):
    o = opts(max_frames=17)
    o = o if sampled else o.greedy()
    text = "Hello there, how are you today"
    one_shot = model().synthesizer().synthesize(text, o)
    audio, chunks = collect(text, o, first_chunk=first, max_chunk=most)
    assert audio.dtype == np.float32 and one_shot.audio.dtype == np.float32
    assert np.array_equal(audio, one_shot.audio)  # bit for bit
    codes = np.concatenate([c.codes.numpy() for c in chunks])
    assert np.array_equal(codes, one_shot.codes.numpy())
    assert [len(c.codes) for c in chunks if len(c.codes)] == sizes  # small first chunk, larger later
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])


def test_chunks_keep_growing_across_sentences():
    """The chunk size grows over the whole text, not anew per sentence: a later sentence leaves in one chunk where
    its frames fit (fewer codec pushes, and playback's pre-buffer sees the audio it was sized for)."""
    audio, chunks = collect("One. Two.", opts(max_frames=3), first_chunk=1, max_chunk=16)
    assert chunks[-1].stats.stop_reasons == ("max_frames", "max_frames")
    assert [(c.sentence, len(c.codes)) for c in chunks if len(c.codes)] == [(0, 1), (0, 2), (1, 3)]


def test_stats_record():
    audio, chunks = collect("Hello there.", opts(max_frames=6))
    s = chunks[-1].stats
    assert s.mode == "ar" and s.frames == 6 and s.talker_calls == 6 and s.predictor_calls == 6 * 15
    assert s.tok_per_call == 1.0  # ar: one code per code-predictor call
    assert s.audio_s == pytest.approx(len(audio) / 24000) and s.xrt == pytest.approx(s.audio_s / s.elapsed_s)
    assert 0 < s.first_audio_s <= s.elapsed_s and s.kv_bytes > 0 and s.kv_mb == s.kv_bytes / 2**20
    assert s.steps_per_s == pytest.approx(s.talker_calls / s.elapsed_s)
    assert set(s.stage_ms()) == {"talker", "predictor", "codec"} and all(v > 0 for v in s.stage_ms().values())
    assert s.stop_reasons == ("max_frames",) and s.sentences == 1
    d = s.as_dict()
    assert {"xrt", "tok_per_call", "steps_per_s", "predictor_calls_per_s", "kv_mb", "codec_ms_per_frame"} <= set(d)
    elapsed = [c.stats.elapsed_s for c in chunks]
    assert elapsed == sorted(elapsed)


def test_the_finish_reason_rides_on_the_last_record():
    """mlx-lm's GenerationResponse: every chunk carries the stats so far, the last one also why the stream finished;
    below the stream, `frames` yields a step per frame and a last one with the utterance's finish reason."""
    synth = model().synthesizer()
    chunks = list(synth.stream("Hello there. Bye now.", opts(max_frames=3)))
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["max_frames"]
    assert chunks[-1].stats.stop_reasons == ("max_frames",) * 2
    steps = list(synth.frames("Hello there.", opts(max_frames=3)))
    assert [s.frame is None for s in steps] == [False] * 3 + [True] and steps[-1].finish_reason == "max_frames"
    assert steps[-1].stats.frames == 3 and all(s.finish_reason is None for s in steps[:-1])


def test_sentences_in_order_with_crossfades():
    text = "Dr. Smith is here. It costs 3.14 dollars! Is that right?"
    o = opts(max_frames=4)
    audio, chunks = collect(text, o)
    n, joins = round(CROSSFADE_S * 24000), 2
    assert len(audio) == 3 * 4 * 1920 - joins * n
    s = chunks[-1].stats
    assert s.sentences == 3 and s.frames == 12 and s.stop_reasons == ("max_frames",) * 3
    assert [c.sentence for c in chunks] == sorted(c.sentence for c in chunks)
    # the first sentence is exactly its own one-shot synthesis, up to where the crossfade begins
    first = model().synthesizer().synthesize("Dr. Smith is here.", o).audio
    assert np.array_equal(audio[: len(first) - n], first[:-n])
    assert np.abs(audio).max() <= 1.0


def test_cancel_stops_within_a_frame():
    frames = {"n": 0}

    def cancelled():
        frames["n"] += 1
        return frames["n"] >= 3

    text = "A long text. With several sentences. That would take a while."
    audio, chunks = collect(text, opts(), cancelled=cancelled)
    s = chunks[-1].stats  # the frame count proves the stop; no wall-clock bound (a shared box is no clock)
    assert s.frames == 3 and s.stop_reasons == ("cancelled",) and len(audio) == 3 * 1920 and frames["n"] == 3


def test_mode_option_validated_against_available_modes():
    assert MODES[0] == "ar" and SynthesisOptions().mode == "ar"
    with pytest.raises(InputError) as e:
        next(model().synthesizer().stream("Hi.", opts(mode="turbo")))
    assert "turbo" in str(e.value) and ", ".join(MODES) in e.value.hint


def test_empty_text_is_an_input_error():
    with pytest.raises(InputError):
        next(model().synthesizer().stream("  \n ", opts()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dr. Smith went home. He was tired.", ["Dr. Smith went home.", "He was tired."]),
        ("Pi is 3.14 and e is 2.718. Nice!", ["Pi is 3.14 and e is 2.718.", "Nice!"]),
        ("no punctuation at all in this one", ["no punctuation at all in this one"]),
        ("Fruit, e.g. apples, is good. Mr. J. R. Tolkien wrote.", ["Fruit, e.g. apples, is good.",
                                                                  "Mr. J. R. Tolkien wrote."]),
        ('He said "Stop." Then he left... Really?! Yes.', ['He said "Stop."', "Then he left...", "Really?!", "Yes."]),
        ("你好。今天天气很好！我们走吧", ["你好。", "今天天气很好！", "我们走吧"]),
        ("  Spaces\n\n and   newlines.  Second line ", ["Spaces and newlines.", "Second line"]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "bb", "hello", "wonderful", "x" * 15, "你好", "字字字", "，", "、", "。", ",",
                                 ".", "!", "?"]), max_size=30),
       st.lists(st.booleans(), max_size=30), st.sampled_from([8, 12, 30, 300]))
def test_every_piece_is_a_stretch_of_the_text(words, spaced, max_chars):
    """However a sentence is cut (sentence ends, clauses, words, hard cuts) and packed again, a piece is a stretch of
    the text: no space dropped between a CJK and a Latin word ('你好 Hello' was packed as '你好Hello', whose
    tokens differ), none added after a CJK clause mark."""
    text = "".join(w + (" " if i < len(spaced) and spaced[i] else "") for i, w in enumerate(words))
    text = " ".join(text.split())
    pieces = split_sentences(text, max_chars)
    assert all(len(p) <= max_chars and p in text for p in pieces), pieces
    assert split_sentences("你好 HelloHello", 12) == ["你好", "HelloHello"]


def test_split_long_sentence_at_clauses_then_words():
    clauses = ", ".join(f"clause number {i} goes on for a while" for i in range(30)) + "."
    parts = split_sentences(clauses, max_chars=120)
    assert len(parts) > 1 and all(len(p) <= 120 for p in parts)
    assert all(p.endswith(",") or p.endswith(".") for p in parts)  # cut at clause ends
    assert " ".join(parts) == clauses


def test_split_10k_characters_lossless():
    text = ("word " * 2000).strip()  # 10k characters, no punctuation at all
    parts = split_sentences(text)
    assert all(len(p) <= 300 for p in parts) and " ".join(parts) == text
    prose = " ".join(f"Sentence {i} says Dr. No paid 3.50 for it." for i in range(250))
    assert len(prose) > 10_000
    parts = split_sentences(prose)
    assert len(parts) == 250 and " ".join(parts) == prose
    cjk = "字" * 10_000
    parts = split_sentences(cjk)
    assert all(len(p) <= 300 for p in parts) and "".join(parts) == cjk


def test_joiner_crossfade_is_equal_power_and_keeps_sentences_intact():
    j = Joiner(4)
    a, b = np.ones(10, np.float32), -np.ones(10, np.float32)
    out = [j.add(a)]
    j.end_sentence()
    out += [j.add(b), j.flush()]
    y = np.concatenate(out)
    assert len(y) == 16 and np.all(y[:6] == 1) and np.all(y[-6:] == -1)
    assert np.allclose(j.fade_in**2 + j.fade_out**2, 1.0)  # equal power
    assert np.all(np.diff(y[5:11]) < 0)  # a smooth monotone transition
