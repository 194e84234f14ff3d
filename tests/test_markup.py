"""Pause markup ([pause 500ms], [pause 1.5s], paragraph breaks): what the stream speaks, and the one-line errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapvox.engine.markup import PARAGRAPH_PAUSE_S, Pause, segments, strip_markup
from leapvox.engine.options import OptionError, check_text


def test_tags_and_paragraphs_become_pauses():
    text = "Hello there. [pause 500ms] How are you?\n\n  Second paragraph. [PAUSE 1.5 s][pause .5s]"
    assert segments(text) == ["Hello there.", Pause(0.5), "How are you?", Pause(PARAGRAPH_PAUSE_S),
                              "Second paragraph.", Pause(2.0)]


def test_paragraph_breaks_only_between_sentences_and_other_brackets_are_text():
    assert segments("\n\nHi.\n\n\n***\n\nBye.\n\n") == ["Hi.", Pause(PARAGRAPH_PAUSE_S), "Bye."]
    assert segments("[pause 1s] He [paused] [laughs]. ") == [Pause(1.0), "He [paused] [laughs]."]


@pytest.mark.parametrize("text, says", [
    ("a [pause] b", "malformed pause tag '[pause]' at character 3"),
    ("a [pause 2] b", "malformed pause tag '[pause 2]'"),
    ("a [pause two s] b", "malformed pause tag"),
    ("a [pause 500ms b", "unclosed pause tag '[pause 500ms b' at character 3"),
    ("a [pause 61s] b", "longer than 60 s"),
    (" [pause 1s] ", "has nothing to say: ' [pause 1s] ' holds only pause tags"),
])
def test_malformed_tags_are_one_line_errors(text, says):
    with pytest.raises(OptionError) as e:
        check_text(text)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert e.value.hint


_word = st.sampled_from(["alpha", "Beta", "gamma.", "delta!", "Dr.", "3.14", "e.g.", "zeta?"])
_tag = st.sampled_from(["[pause 250ms]", "[pause 1s]", "[Pause 0.5 s]"])
_gap = st.sampled_from([" ", "\n", "\n\n", " \n \n "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_word, _tag), max_size=30), st.data())
def test_words_pauses_and_their_sum_are_kept(parts, data):
    """Whatever the mix: the words come out in order, no two pauses are next to each other, and the silence is the
    tags' sum plus one paragraph pause per break between two stretches that say something."""
    gaps = [data.draw(_gap) for _ in parts]
    text = "".join(p + g for p, g in zip(parts, gaps, strict=True))
    segs = segments(text)
    said = [s for s in segs if isinstance(s, str)]
    assert " ".join(said).split() == strip_markup(text).split()
    assert not any(isinstance(a, Pause) and isinstance(b, Pause) for a, b in zip(segs, segs[1:], strict=False))
    tags = sum({"[pause 250ms]": 0.25, "[pause 1s]": 1.0, "[Pause 0.5 s]": 0.5}[p] for p in parts if p.startswith("["))
    # a paragraph break counts when some word came before it and some word comes after it
    words_before = [any(not p.startswith("[") for p in parts[: i + 1]) for i in range(len(parts))]
    words_after = [any(not p.startswith("[") for p in parts[i + 1 :]) for i in range(len(parts))]
    breaks = 0
    for i, g in enumerate(gaps):
        if g.count("\n") >= 2 and words_before[i] and words_after[i]:
            # breaks with only tags between them are one break
            nxt = next(j for j in range(i + 1, len(parts)) if not parts[j].startswith("["))
            if not any(gaps[k].count("\n") >= 2 for k in range(i + 1, nxt)):
                breaks += 1
    total = sum(s.seconds for s in segs if isinstance(s, Pause))
    assert total == pytest.approx(tags + breaks * PARAGRAPH_PAUSE_S)
