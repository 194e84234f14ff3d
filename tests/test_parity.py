"""Parity with the official qwen-tts 0.1.1 package, through fixtures it produced (tests/reference/).

Codes must be identical; logits, hidden states and waveforms within 1e-5 (fp32, CPU).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leapvox.engine.options import SynthesisOptions
from leapvox.engine.prompt import build_prompt, wrap_instruct, wrap_text
from leapvox.engine.sampling import SamplingParams
from leapvox.models.load import load_model

from .conftest import FIXTURES

TOL = 1e-5
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CASES = {c["name"]: c for c in EXPECTED["cases"]}


@functools.cache
def tensors() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "expected.safetensors")


@functools.cache
def model(name: str):
    return load_model(FIXTURES / name)


def options(case: dict) -> SynthesisOptions:
    return SynthesisOptions(
        speaker=case["speaker"],
        language=case["language"],
        instruct=case["instruct"],
        text_layout="non-streaming" if case["non_streaming_mode"] else "streaming",
        talker=SamplingParams(case["do_sample"], case["temperature"], case["top_k"], case["top_p"]),
        predictor=SamplingParams(
            case["subtalker_dosample"], case["subtalker_temperature"], case["subtalker_top_k"], case["subtalker_top_p"]
        ),
        repetition_penalty=case["repetition_penalty"],
        max_frames=case["max_new_tokens"] - 1,
        seed=case["seed"],
    )


def max_diff(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def test_fixtures_cover_the_required_cases():
    stops = {c["stop_reason"] for c in CASES.values()}
    assert stops == {"eos", "max_new_tokens"}
    assert any(not c["do_sample"] for c in CASES.values()) and any(c["do_sample"] for c in CASES.values())
    assert {c["language"] for c in CASES.values()} >= {"auto", "chinese", "english"}
    assert {"eric", "dylan"} <= {c["speaker"] for c in CASES.values()}
    assert {c["non_streaming_mode"] for c in CASES.values()} == {True, False}


@pytest.mark.parametrize("check", range(len(EXPECTED["tokenizer_checks"])))
def test_tokenizer_gives_the_official_ids_and_pieces(check):
    """The chat-wrapped texts the official package tokenized (special tokens, camel case, instructions)."""
    c = EXPECTED["tokenizer_checks"][check]
    tok = model("tiny-0b6").tokenizer
    assert tok(c["text"]) == c["input_ids"]
    assert [tok._tok.id_to_token(i) for i in c["input_ids"]] == c["pieces"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_tokenizer_and_prompt_match(name):
    case = CASES[name]
    m = model(case["checkpoint"])
    ids = m.tokenizer(wrap_text(case["text"]))
    assert ids == case["input_ids"]
    opts = options(case)
    instruct_ids = None
    if case["instruct_used"]:
        instruct_ids = m.tokenizer(wrap_instruct(case["instruct"]))
        assert instruct_ids == case["instruct_ids"]
    prompt = build_prompt(
        m.tts.talker, m.config, ids, opts.speaker, opts.language, opts.text_layout, instruct_ids
    )
    ref = tensors()[case["prompt_embeds_key"]]
    assert prompt.embeds.shape[1:] == ref.shape
    assert max_diff(prompt.embeds[0], ref) < TOL


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_codes_identical(name):
    case = CASES[name]
    codes, stats, _ = model(case["checkpoint"]).synthesizer().generate_codes(case["text"], options(case))
    assert codes.tolist() == case["codes"]
    assert stats.stop_reason == {"eos": "eos", "max_new_tokens": "max_frames"}[case["stop_reason"]]


@pytest.mark.parametrize("ckpt", sorted(k for k in EXPECTED["teacher_forced"] if k in EXPECTED["checkpoints"]))
def test_teacher_forced_logits(ckpt):
    t, m = tensors(), model(ckpt)
    talker, cp = m.tts.talker, m.tts.talker.code_predictor
    codes = t[f"tf/{ckpt}/tf_codes"]  # [F, 16]
    prompt = t[f"tf/{ckpt}/prompt_embeds"][None]  # [1, L, H]
    case = CASES[EXPECTED["teacher_forced"][ckpt]["prompt_from_case"]]
    pad = talker.embed_text(torch.tensor([[m.config.tts_pad_token_id]]))
    assert case["non_streaming_mode"]  # decode steps add PAD
    with torch.inference_mode():  # the caches were made by generation, which runs in inference mode
        decode = torch.cat([talker.embed_frame(codes[k : k + 1]) + pad for k in range(codes.shape[0])], dim=1)
        assert max_diff(decode[0], t[f"tf/{ckpt}/decode_embeds"]) < TOL
        x = torch.cat([prompt, t[f"tf/{ckpt}/decode_embeds"][None]], dim=1)
        talker.model.setup_cache(x.shape[1])
        hidden, logits = talker(x, 0)
        assert max_diff(hidden[0], t[f"tf/{ckpt}/talker_hidden"]) < TOL
        assert max_diff(logits[0], t[f"tf/{ckpt}/talker_logits"]) < TOL
        L = prompt.shape[1]
        cp.model.setup_cache(16)
        for k in range(codes.shape[0]):
            h = hidden[:, L - 1 + k : L + k]  # the hidden that produced code 0 of frame k
            rows = [cp.prefill_rows(h, talker.embed_codec(codes[k : k + 1, :1]))]
            rows += [cp.embed(g, codes[k : k + 1, g : g + 1]) for g in range(1, 15)]
            hc = cp.model(torch.cat(rows, dim=1), 0)  # [1, 16, Hc]
            got = torch.stack([cp.lm_head[g](hc[0, g + 1]) for g in range(15)])  # [15, Vp]
            assert max_diff(got, t[f"tf/{ckpt}/cp_logits"][k]) < TOL


@pytest.mark.parametrize("name", ["sample_ns_0b6", "sample_st_0b6"])
def test_pipeline_audio_equals_official(name):
    case = CASES[name]
    result = model(case["checkpoint"]).synthesizer().synthesize(case["text"], options(case))
    ref = tensors()[f"wav/{name}"].numpy()
    assert result.sample_rate == 24000 and result.audio.shape == ref.shape
    assert float(np.abs(result.audio - ref).max()) < TOL
