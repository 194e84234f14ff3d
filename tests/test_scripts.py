"""Text mostly in a script that none of the model's languages is written in gets one warning (the demo, English
only, reads Chinese and Hebrew as letter names)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leapvox.engine.text import uncovered_script
from leapvox.models.load import load_model

from .conftest import FIXTURES

EN = ["auto", "english"]


@pytest.mark.parametrize(("text", "languages", "script"), [
    ("שלום עולם", EN, "HEBREW"), ("你好，世界。", EN, "CJK"), ("Привет, мир.", EN, "CYRILLIC"),
    ("Hello there.", EN, None), ("Ça va très bien, merci.", EN, None), ("Hello 你好 there friend.", EN, None),
    ("1234, 5678.", EN, None), ("你好，世界。", ["auto", "chinese", "english"], None),
    ("こんにちは、世界。", ["auto", "japanese"], None), ("Привет, мир.", ["auto", "russian"], None),
    ("שלום", ["auto", "klingon"], None),  # a language whose script is not known here covers anything
])
def test_uncovered_script(text, languages, script):
    assert uncovered_script(text, languages) == script


def test_the_demo_warns_once_on_chinese_and_not_on_english():
    m = load_model("demo", "fp32")
    opts = replace(m.defaults, seed=0, max_frames=2)
    result = m.synthesizer().synthesize("你好，世界。今天天气很好。", opts)
    assert [w for w in result.warnings if "script" in w] == [
        "the text is mostly in Han (CJK) script, which this model's languages (english) do not cover: expect "
        "letter names or noise"]
    assert not [w for w in m.synthesizer().synthesize("Hello there.", opts).warnings if "script" in w]


def test_a_model_with_chinese_does_not_warn():
    m = load_model(FIXTURES / "tiny-0b6")
    result = m.synthesizer().synthesize("你好，世界。", replace(m.defaults, seed=0, max_frames=2))
    assert not [w for w in result.warnings if "script" in w]
