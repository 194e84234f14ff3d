"""The text front ends a model's config.json can name (models/frontend.py): graphemes, hibari-g2p, and refusing
a name this leapvox does not have."""

from __future__ import annotations

import sys

import pytest

from leapvox.engine.errors import LeapvoxError
from leapvox.models.frontend import FRONTEND_NEEDS, FRONTENDS, graphemes, hibari_phonemes, ipa, text_frontend


def test_config_names_pick_the_front_end_and_an_unknown_name_is_refused():
    assert text_frontend({}) is None
    assert text_frontend({"leapvox_text_frontend": "espeak-ng-ipa"}) is ipa
    assert text_frontend({"leapvox_text_frontend": "hibari-g2p"}) is hibari_phonemes
    assert text_frontend({"leapvox_text_frontend": "graphemes"}) is graphemes
    with pytest.raises(LeapvoxError, match="front end 'klatt'"):
        text_frontend({"leapvox_text_frontend": "klatt"})
    assert set(FRONTEND_NEEDS) == {"espeak-ng-ipa", "hibari-g2p"}  # graphemes needs nothing
    assert set(FRONTENDS) == {"espeak-ng-ipa", "hibari-g2p", "graphemes"}


def test_graphemes_lower_case_plain_punctuation_and_one_space():
    assert graphemes("  \u201cDon\u2019t\u201d\u2014STOP   now.\n") == '"don\'t" - stop now.'
    assert graphemes("Hello,\tWorld!") == "hello, world!"
    assert graphemes("") == ""


def test_hibari_g2p_is_the_string_its_synthesiser_reads():
    pytest.importorskip("hibari", reason="hibari-tts (pip install 'leapvox[hibari]') is not installed: its front end "
                                        "is not verified")
    from hibari.tts import Hibari

    text = "Hello there. I paid $5 for 3 apples!\nA new line"
    assert hibari_phonemes(text) == " ".join(Hibari().phonemize(text.replace("\n", " ")))
    assert hibari_phonemes("Hello there.") == "həlˈO ðˈɛɹ."
    assert hibari_phonemes("") == ""


def test_hibari_g2p_missing_is_a_one_line_error_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "hibari", None)  # import hibari now raises ImportError
    monkeypatch.setitem(sys.modules, "hibari.g2p", None)
    monkeypatch.setitem(sys.modules, "hibari.tts", None)
    with pytest.raises(LeapvoxError, match="hibari-tts") as e:
        hibari_phonemes("Hello.")
    assert "pip install" in e.value.hint
