"""The WER judge: each transcription is independent of what the decoder heard before (pocketsphinx is the
`demo` extra, which CI does not install; this test runs where it is)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("pocketsphinx", reason="pocketsphinx (pip install 'leapvox[demo]') is not installed")
pytest.importorskip("scipy", reason="scipy (pip install 'leapvox[demo]') is not installed")

SENTENCES = [
    "Money will buy a fine dog, but only kindness will make him wag his tail.",
    "In fact, most people are not very good at telling the truth.",
    "You never know how many friends you have until you rent a house on the beach.",
    "The trouble with doing something right the first time is that nobody appreciates how difficult it was.",
    "A closed mouth gathers no foot.",
]


def test_a_transcription_does_not_depend_on_the_ones_before():
    import shutil

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng (the demo model's text front end) is not installed")
    from leapvox.models.catalog import DEMO_DIR
    from leapvox.models.load import load_model
    from leapvox.models.recipes.demo import quality as q

    m = load_model(DEMO_DIR, "fp32")
    synth = m.synthesizer()
    pcm = []
    for i, text in enumerate(SENTENCES):
        r = synth.synthesize(text, replace(m.defaults, seed=i))
        pcm.append(q.asr_input(r.audio, r.sample_rate, i))
    alone = []
    for x in pcm:
        q._init_asr()
        alone.append(q._transcribe(x))
    q._init_asr()
    in_order = [q._transcribe(x) for x in pcm]
    q._init_asr()
    reversed_order = [q._transcribe(x) for x in pcm[::-1]][::-1]
    assert in_order == alone and reversed_order == alone
