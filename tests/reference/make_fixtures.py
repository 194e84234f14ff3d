#!/usr/bin/env python
"""Regenerate the official-reference fixtures under tests/fixtures/reference/.

Runs ONLY in the reference virtualenv (see tests/reference/README.md), which has the
official `qwen-tts` 0.1.1 package.  The leapvox product never imports qwen_tts.

What it does (all fp32 compute on CPU, fixed seeds, deterministic):
  1. builds a tiny byte-level BPE text tokenizer (vocab.json / merges.txt / tokenizer_config.json),
  2. builds two tiny random-weight CustomVoice checkpoints (tiny-0b6, tiny-1b7) with the
     official classes and the official on-disk layout (incl. speech_tokenizer/),
  3. loads them back with the OFFICIAL loader `Qwen3TTSModel.from_pretrained(folder)` and records
     generation cases, teacher-forced logits and codec waveforms into
     expected.json + expected.safetensors.

Usage:  PYTHONPATH=tests/reference/stubs /work/refvenv/bin/python tests/reference/make_fixtures.py
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE / "stubs"))  # empty sox / onnxruntime / torchaudio stand-ins

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSRMSNorm  # noqa: E402
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config  # noqa: E402
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    EuclideanCodebook,
    Qwen3TTSTokenizerV2ConvNeXtBlock,
    Qwen3TTSTokenizerV2DecoderLayerScale,
    Qwen3TTSTokenizerV2DecoderRMSNorm,
    Qwen3TTSTokenizerV2Model,
    SnakeBeta,
)
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = REPO / "tests" / "fixtures" / "reference"

# ----------------------------------------------------------------------------------------------
# Shipped constants (design doc §2.1-2.3); must NOT change in the tiny checkpoints.
# ----------------------------------------------------------------------------------------------
CODEC_IDS = dict(
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
    codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
)
LANGUAGE_IDS = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
SPK_IDS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
           "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
SPK_DIALECT = {"serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
               "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"}

# Code-predictor vocabulary.  The shipped value is 2048; 15 private tables [Vp,H] + 15 heads
# [Vp,Hc] at Vp=2048 would alone be ~16 MB per tiny checkpoint, far over the fixture budget,
# so the tiny checkpoints use a smaller Vp (codes 1..15 are then in 0..Vp-1; the codec
# codebooks keep 2048 rows, code 0 keeps 0..2047).
CP_VOCAB = 128
TEXT_VOCAB_SIZE = 512
TEXT_HIDDEN = 48

GENERATION_CONFIG = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}

# ----------------------------------------------------------------------------------------------
# 1. Tiny byte-level BPE text tokenizer
# ----------------------------------------------------------------------------------------------

def _load_bpe():
    """models/recipes/bpe.py, loaded by path: leapvox is not installed in the reference virtualenv."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("leapvox_bpe", REPO / "models" / "recipes" / "bpe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BPE = _load_bpe()


def bytes_to_unicode():
    """GPT-2 / Qwen2 byte -> printable unicode char table."""
    return dict(enumerate(BPE.byte_symbols()))


# Words (after GPT-2 byte->unicode mapping; "Ġ" = leading space) that must become ONE token.
# Order matters only for merge ranks.  "assistant" first: the official prompt slicing
# ([:3] / [3:-5] / [-5:]) assumes it is a single token.
BPE_WORDS = [
    "assistant", "user",
    "Ġthe", "Ġa", "Ġis", "Ġto", "Ġof", "Ġand", "Ġin", "Ġit", "Ġyou",
    "Hello", "ĠHello", "Ġhello", "Ġworld", "Ġthis", "ĠThis", "This", "Ġtest", "Ġvoice", "Ġspeak",
    "Ġslowly", "Ġhappy", "Ġmodel", "Ġsays", "Ġusers", "ĠReady", "Ġquick", "Ġbrown", "Ġfox",
    "The", "ĠThe", "Ġtoday", "Ġweather", "Ġnice", "Ġvery", "Ġwith", "Ġcalm", "Ġtone",
    "ing", "er", "ed", "ly", "Ġs", "Ġw", "Ġt", "Ġh",
    "Qwen", "TTS", "Ġi", "Phone", "Ġgood", "Ġmorning", "Ġplease", "Speak", "Ġand",
    "ĠSpeak", "Ġexcited", "Ġwhisper",
    # camel-case word kept whole by the Qwen2 split regex, but split " i" + "Phone" by the
    # Mistral regex that transformers 4.57.3 patches in for LARGE (>100k) local vocabularies.
    "ĠiPhone",
]

SPECIAL_TOKENS = [  # in id order, right after the regular vocabulary (as in the real Qwen2 layout)
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]


def _bpe(word_syms, ranks):
    syms = list(word_syms)
    while len(syms) > 1:
        best, best_rank = None, None
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best is None:
            break
        a, b = syms[best], syms[best + 1]
        out, i = [], 0
        while i < len(syms):  # merge all occurrences of the pair, left to right (HF/GPT-2 semantics)
            if i < len(syms) - 1 and syms[i] == a and syms[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(syms[i])
                i += 1
        syms = out
    return syms


def build_text_tokenizer():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}  # id == byte value
    merges = []
    ranks = {}
    for w in BPE_WORDS:
        while True:
            toks = _bpe(list(w), ranks)
            if len(toks) == 1:
                break
            pair = (toks[0], toks[1])
            ranks[pair] = len(merges)
            merges.append(pair)
            new = pair[0] + pair[1]
            if new not in vocab:
                vocab[new] = len(vocab)
    n_regular = len(vocab)
    special_ids = {t: n_regular + i for i, t in enumerate(SPECIAL_TOKENS)}
    assert max(special_ids.values()) < TEXT_VOCAB_SIZE
    added_tokens_decoder = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for t, i in special_ids.items()
    }
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return vocab, merges, tok_cfg, special_ids, n_regular


def write_text_tokenizer(folder: Path, vocab, merges, tok_cfg):
    BPE.write_tokenizer_files(folder, vocab, merges, tok_cfg, indent=2)
    with open(folder / "preprocessor_config.json", "w", encoding="utf-8") as f:
        f.write('{"padding_side":"left","padding_value":0.0,"processor_class":"Qwen3TTSProcessor","return_attention_mask":true}')


# ----------------------------------------------------------------------------------------------
# 2. Configs
# ----------------------------------------------------------------------------------------------
CKPTS = {
    "tiny-0b6": dict(size="0b6", hidden=64, inter=128, layers=2),
    "tiny-1b7": dict(size="1b7", hidden=96, inter=192, layers=2),
}
PRED = dict(hidden=64, inter=128, layers=2)


def model_config_dict(spec, special_ids, assistant_id):
    talker = dict(
        attention_bias=False, attention_dropout=0.0,
        code_predictor_config=dict(
            attention_bias=False, attention_dropout=0.0, head_dim=16, hidden_act="silu",
            hidden_size=PRED["hidden"], initializer_range=0.02, intermediate_size=PRED["inter"],
            max_position_embeddings=65536, model_type="qwen3_tts_talker_code_predictor",
            num_attention_heads=4, num_code_groups=16, num_hidden_layers=PRED["layers"],
            num_key_value_heads=2, rms_norm_eps=1e-6, rope_scaling=None, rope_theta=1000000,
            sliding_window=None, use_cache=True, use_sliding_window=False, vocab_size=CP_VOCAB,
            tie_word_embeddings=False,
        ),
        codec_language_id=dict(LANGUAGE_IDS),
        head_dim=16, hidden_act="silu", hidden_size=spec["hidden"], initializer_range=0.02,
        intermediate_size=spec["inter"], max_position_embeddings=32768, model_type="qwen3_tts_talker",
        num_attention_heads=4, num_code_groups=16, num_hidden_layers=spec["layers"], num_key_value_heads=2,
        position_id_per_seconds=13, rms_norm_eps=1e-6,
        # mrope_section must sum to head_dim/2 = 8 (shipped [24,20,20] sums to 64 = 128/2).
        # The three position rows are always identical, so this is plain 1-D RoPE either way.
        rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default", "type": "default"},
        rope_theta=1000000, sliding_window=None, spk_id=dict(SPK_IDS), spk_is_dialect=dict(SPK_DIALECT),
        text_hidden_size=TEXT_HIDDEN, text_vocab_size=TEXT_VOCAB_SIZE, use_cache=True,
        use_sliding_window=False, vocab_size=3072, tie_word_embeddings=False,
        **CODEC_IDS,
    )
    return dict(
        architectures=["Qwen3TTSForConditionalGeneration"],
        assistant_token_id=assistant_id,
        im_start_token_id=special_ids["<|im_start|>"],
        im_end_token_id=special_ids["<|im_end|>"],
        tts_pad_token_id=special_ids["<tts_pad>"],
        tts_bos_token_id=special_ids["<tts_text_bos>"],
        tts_eos_token_id=special_ids["<tts_text_eod>"],
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=spec["size"],
        tts_model_type="custom_voice",
        talker_config=talker,
        tie_word_embeddings=False,
    )


def speech_tokenizer_config():
    decoder = dict(
        attention_bias=False, latent_dim=64, codebook_dim=8, codebook_size=2048, decoder_dim=64,
        hidden_act="silu", hidden_size=32, intermediate_size=64, layer_scale_initial_scale=0.01,
        max_position_embeddings=8000, head_dim=8, num_attention_heads=4, num_hidden_layers=2,
        num_key_value_heads=4, num_quantizers=16, num_semantic_quantizers=1, rms_norm_eps=1e-5,
        rope_theta=10000, semantic_codebook_size=4096, sliding_window=72, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2], vector_quantization_hidden_dimension=8,
    )
    encoder = dict(  # Mimi encoder, only used for encoding (Base / ICL); tiny, random.
        audio_channels=1, num_filters=4, kernel_size=7, residual_kernel_size=3, last_kernel_size=3,
        num_residual_layers=1, compress=2, dilation_growth_rate=2, upsampling_ratios=[8, 6, 5, 4],
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
        intermediate_size=32, hidden_act="gelu", norm_eps=1e-5, layer_scale_initial_scale=0.01,
        rope_theta=10000, max_position_embeddings=8000, sliding_window=250, num_quantizers=16,
        num_semantic_quantizers=1, codebook_size=64, codebook_dim=4, vector_quantization_hidden_dimension=4,
        upsample_groups=16, pad_mode="constant", use_causal_conv=True, frame_rate=12.5, sampling_rate=24000,
    )
    return dict(
        architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
        encoder_valid_num_quantizers=16, input_sample_rate=24000, output_sample_rate=24000,
        decode_upsample_rate=1920, encode_downsample_rate=1920,
        encoder_config=encoder, decoder_config=decoder,
    )


# ----------------------------------------------------------------------------------------------
# 3. Weight initialisation
# ----------------------------------------------------------------------------------------------
LOGIT_GAIN = 2.5      # codec_head / predictor heads: logit std ≈ 2.5 for a unit-RMS hidden state
# codec_head row 2150 (EOS): a larger random row, so that EOS wins on some steps.  Tuned per checkpoint
# so that some cases stop by EOS (2..26 frames) while others run to max_new_tokens.
EOS_GAIN = {"tiny-0b6": 4.55, "tiny-1b7": 3.5}


def _normal_(t, std, g):
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=g) * std)


@torch.no_grad()
def init_tts_model(model, seed, eos_gain):
    g = torch.Generator().manual_seed(seed)
    talker = model.talker
    for _name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            fan_in = mod.weight.shape[1]
            _normal_(mod.weight, 1.0 / math.sqrt(fan_in), g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.05, g)
        elif isinstance(mod, torch.nn.Embedding):
            _normal_(mod.weight, 1.0, g)
        elif isinstance(mod, Qwen3TTSRMSNorm):
            mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=g))
    # predictor private tables: smaller so that the 16-code sum does not swamp the text track
    for emb in talker.code_predictor.model.codec_embedding:
        _normal_(emb.weight, 0.5, g)
    H = talker.config.hidden_size
    _normal_(talker.codec_head.weight, LOGIT_GAIN / math.sqrt(H), g)
    _normal_(talker.codec_head.weight[2150], eos_gain / math.sqrt(H), g)
    Hc = talker.code_predictor.config.hidden_size
    for head in talker.code_predictor.lm_head:
        _normal_(head.weight, LOGIT_GAIN / math.sqrt(Hc), g)


@torch.no_grad()
def init_speech_tokenizer(st, seed):
    g = torch.Generator().manual_seed(seed)
    for _name, mod in st.named_modules():
        if isinstance(mod, (torch.nn.Conv1d,)):
            fan_in = mod.weight.shape[1] * mod.weight.shape[2]
            _normal_(mod.weight, 1.0 / math.sqrt(fan_in), g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.01, g)
        elif isinstance(mod, torch.nn.ConvTranspose1d):
            cin, cout, k = mod.weight.shape
            stride = mod.stride[0]
            _normal_(mod.weight, 1.0 / math.sqrt(cin * k / stride), g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.01, g)
        elif isinstance(mod, torch.nn.Linear):
            _normal_(mod.weight, 1.0 / math.sqrt(mod.weight.shape[1]), g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.01, g)
        elif isinstance(mod, torch.nn.LayerNorm):
            mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=g))
            mod.bias.copy_(0.01 * torch.randn(mod.bias.shape, generator=g))
        elif isinstance(mod, Qwen3TTSTokenizerV2DecoderRMSNorm):
            mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=g))
        elif isinstance(mod, Qwen3TTSTokenizerV2DecoderLayerScale):
            mod.scale.copy_(0.3 + 0.05 * torch.randn(mod.scale.shape, generator=g))
        elif isinstance(mod, SnakeBeta):
            # log-space parameters: alpha = exp(a) ≈ 1, beta = exp(b) ≈ 2
            mod.alpha.copy_(0.1 * torch.randn(mod.alpha.shape, generator=g))
            mod.beta.copy_(math.log(2.0) + 0.05 * torch.randn(mod.beta.shape, generator=g))
        elif isinstance(mod, EuclideanCodebook):
            usage = 0.5 + 1.5 * torch.rand(mod.cluster_usage.shape, generator=g)
            mod.cluster_usage.copy_(usage)
            mod.embedding_sum.copy_(torch.randn(mod.embedding_sum.shape, generator=g) * usage[:, None])
        elif isinstance(mod, Qwen3TTSTokenizerV2ConvNeXtBlock):
            mod.gamma.copy_(0.5 + 0.05 * torch.randn(mod.gamma.shape, generator=g))
    # Mimi (encoder) has its own codebook class with the same field names; give it random tables too.
    for name, p in st.encoder.named_parameters():
        if name.endswith("embed_sum") or name.endswith("embedding_sum"):
            p.copy_(torch.randn(p.shape, generator=g))
    # Scale the last conv so that the (pre-clamp) waveform RMS is ~0.3: audio depends on codes, rarely clips.
    dec = st.decoder
    codes = torch.randint(0, 2048, (1, 16, 40), generator=g)
    last = dec.decoder[-1].conv
    with torch.inference_mode():
        h = dec.quantizer.decode(codes)
        h = dec.pre_conv(h).transpose(1, 2)
        h = dec.pre_transformer(inputs_embeds=h).last_hidden_state.permute(0, 2, 1)
        for blocks in dec.upsample:
            for b in blocks:
                h = b(h)
        for b in dec.decoder:
            h = b(h)
    pre = h - last.bias.view(1, -1, 1)
    rms = pre.pow(2).mean().sqrt().item()
    last.weight.mul_(0.3 / rms)
    last.bias.zero_()


# ----------------------------------------------------------------------------------------------
# 4. Build checkpoints
# ----------------------------------------------------------------------------------------------

def build_checkpoints(tok):
    vocab, merges, tok_cfg, special_ids, n_regular = tok
    assistant_id = vocab["assistant"]
    for ci, (name, spec) in enumerate(CKPTS.items()):
        folder = OUT / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        cfg_dict = model_config_dict(spec, special_ids, assistant_id)
        config = Qwen3TTSConfig(**cfg_dict)
        torch.manual_seed(100 + ci)
        model = Qwen3TTSForConditionalGeneration(config).eval()
        init_tts_model(model, seed=1000 + ci, eos_gain=EOS_GAIN[name])
        # The real checkpoints store talker + predictor in BF16 (design §1.1, [K-intake]); so do we.
        # The official loader (no dtype given) upcasts to fp32; all reference numbers are fp32 compute
        # over these bf16-representable weights.
        model = model.to(torch.bfloat16)
        model.save_pretrained(folder, safe_serialization=True)
        with open(folder / "config.json") as f:
            saved = json.load(f)
        saved.pop("speaker_encoder_config", None)  # official loader rejects it (model_type key); CustomVoice ships none
        with open(folder / "config.json", "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
        with open(folder / "generation_config.json", "w") as f:
            json.dump(GENERATION_CONFIG, f, indent=2)
        write_text_tokenizer(folder, vocab, merges, tok_cfg)

        st_dir = folder / "speech_tokenizer"
        st_dir.mkdir()
        st_cfg = Qwen3TTSTokenizerV2Config(**speech_tokenizer_config())
        torch.manual_seed(200)
        st = Qwen3TTSTokenizerV2Model(st_cfg).eval()
        init_speech_tokenizer(st, seed=2000)  # SAME codec in both checkpoints
        st.save_pretrained(st_dir, safe_serialization=True)
        from transformers import EncodecFeatureExtractor
        EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0,
                                return_attention_mask=True).save_pretrained(st_dir)
    return assistant_id



# ----------------------------------------------------------------------------------------------
# 5. Reference runs through the OFFICIAL loader / wrapper
# ----------------------------------------------------------------------------------------------
SAMPLING_DEFAULTS = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
                         subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0,
                         subtalker_temperature=0.9)
GREEDY = dict(SAMPLING_DEFAULTS, do_sample=False, subtalker_dosample=False)

T_HELLO = "Hello world, this is a test."
T_CAMEL = "The QwenTTS model says: hello, iPhone users! Ready?"
T_ZH = "你好，世界。今天天气很好。"
T_MORNING = "Good morning, the weather is very nice today."
T_FOX = "The quick brown fox."
INSTRUCT = "Speak slowly and happily, with a calm tone."


def C(name, ckpt, text, speaker, language, params, seed, max_new_tokens=30, instruct=None,
      non_streaming_mode=True, keep_wav=False, note=""):
    d = dict(name=name, checkpoint=ckpt, text=text, speaker=speaker, language=language, instruct=instruct,
             non_streaming_mode=non_streaming_mode, max_new_tokens=max_new_tokens, seed=seed, note=note)
    d.update(params)
    d["_keep_wav"] = keep_wav
    return d


CASES = [
    C("greedy_ns_0b6", "tiny-0b6", T_HELLO, "vivian", "english", GREEDY, 0,
      note="do_sample=False and subtalker_dosample=False; non-streaming (wrapper default). Teacher-forcing prompt for tiny-0b6."),
    C("greedy_st_0b6", "tiny-0b6", T_HELLO, "vivian", "english", GREEDY, 0, non_streaming_mode=False,
      note="greedy, simulated-streaming text layout"),
    C("sample_ns_0b6", "tiny-0b6", T_HELLO, "vivian", "english", SAMPLING_DEFAULTS, 1234, keep_wav=True,
      note="official sampling defaults, non-streaming"),
    C("sample_st_0b6", "tiny-0b6", T_HELLO, "vivian", "english", SAMPLING_DEFAULTS, 1234, non_streaming_mode=False,
      keep_wav=True, note="official sampling defaults, streaming"),
    C("auto_lang_0b6", "tiny-0b6", T_MORNING, "ryan", "auto", SAMPLING_DEFAULTS, 7,
      note="language auto -> [nothink, think_bos, think_eos] prefix (shorter prompt)"),
    C("dialect_eric_chinese_0b6", "tiny-0b6", T_ZH, "eric", "chinese", SAMPLING_DEFAULTS, 11,
      note="dialect override: eric + chinese -> sichuan_dialect 2062"),
    C("dialect_dylan_auto_0b6", "tiny-0b6", T_ZH, "dylan", "auto", SAMPLING_DEFAULTS, 12,
      note="dialect override: dylan + auto -> beijing_dialect 2074 with the THINK form"),
    C("eric_english_0b6", "tiny-0b6", T_HELLO, "Eric", "English", SAMPLING_DEFAULTS, 13,
      note="eric + english keeps english 2050 (no dialect override); mixed-case names are lowercased"),
    C("topp_rep_0b6", "tiny-0b6", T_FOX, "aiden", "english",
      dict(SAMPLING_DEFAULTS, top_p=0.8, repetition_penalty=1.3, subtalker_top_k=20, subtalker_top_p=0.8,
           subtalker_temperature=0.7), 21, keep_wav=False,
      note="top_p 0.8, repetition_penalty 1.3; sub-talker top_k 20 / top_p 0.8 / temperature 0.7"),
    C("greedy_talker_sampled_subtalker_0b6", "tiny-0b6", T_FOX, "serena", "english",
      dict(SAMPLING_DEFAULTS, do_sample=False), 31,
      note="do_sample=False but subtalker_dosample=True: code 0 greedy, codes 1..15 sampled"),
    C("max_tokens_0b6", "tiny-0b6", T_MORNING, "uncle_fu", "chinese", SAMPLING_DEFAULTS, 41, max_new_tokens=12,
      note="expected to run to the limit: frames = max_new_tokens - 1"),
    C("instruct_dropped_0b6", "tiny-0b6", T_HELLO, "vivian", "english", SAMPLING_DEFAULTS, 51, instruct=INSTRUCT,
      note="0b6: the wrapper silently drops instruct (identical to the same call without instruct)"),
    C("camel_punct_0b6", "tiny-0b6", T_CAMEL, "sohee", "korean", SAMPLING_DEFAULTS, 61,
      note="camel-case words + punctuation in the text"),
    C("camel_punct_st_0b6", "tiny-0b6", T_CAMEL, "ono_anna", "japanese", GREEDY, 0, non_streaming_mode=False,
      note="camel-case text, greedy streaming (trailing text longer than some runs)"),
    C("greedy_ns_1b7", "tiny-1b7", T_HELLO, "vivian", "english", GREEDY, 0,
      note="greedy non-streaming on 1b7 (small_to_mtp_projection present). Teacher-forcing prompt for tiny-1b7."),
    C("instruct_1b7", "tiny-1b7", T_HELLO, "vivian", "english", SAMPLING_DEFAULTS, 51, instruct=INSTRUCT,
      note="instruct rows (text only) prepended on 1b7; same call as instruct_dropped_0b6"),
    C("instruct_greedy_st_1b7", "tiny-1b7", T_CAMEL, "dylan", "auto", GREEDY, 0, instruct=INSTRUCT,
      non_streaming_mode=False, note="instruct + dialect(auto) + streaming, greedy"),
    C("sample_st_1b7", "tiny-1b7", T_MORNING, "aiden", "english", SAMPLING_DEFAULTS, 1234, non_streaming_mode=False,
      note="sampling, streaming on 1b7"),
    C("auto_lang_1b7", "tiny-1b7", T_FOX, "ryan", "auto", SAMPLING_DEFAULTS, 8),
]

PARAM_KEYS = ["do_sample", "top_k", "top_p", "temperature", "repetition_penalty", "subtalker_dosample",
              "subtalker_top_k", "subtalker_top_p", "subtalker_temperature", "max_new_tokens"]


def run_case(tts, case):
    m = tts.model
    cap = {}
    orig_generate = m.generate
    orig_talker_generate = m.talker.generate

    def gen_wrap(**kw):
        cap["gen_kwargs"] = kw
        out = orig_generate(**kw)
        cap["codes"] = [c.clone() for c in out[0]]
        return out

    def talker_wrap(**kw):
        cap["prompt_embeds"] = kw["inputs_embeds"].detach().clone()
        cap["trailing"] = kw["trailing_text_hidden"].detach().clone()
        cap["tts_pad"] = kw["tts_pad_embed"].detach().clone()
        res = orig_talker_generate(**kw)
        cap["sequences"] = res.sequences.detach().clone()
        return res

    m.generate = gen_wrap
    m.talker.generate = talker_wrap
    try:
        torch.manual_seed(case["seed"])
        wavs, sr = tts.generate_custom_voice(
            text=case["text"], speaker=case["speaker"], language=case["language"], instruct=case["instruct"],
            non_streaming_mode=case["non_streaming_mode"], **{k: case[k] for k in PARAM_KEYS})
    finally:
        del m.generate
        del m.talker.generate
    cap["wav"] = torch.from_numpy(np.asarray(wavs[0], dtype=np.float32))
    cap["sr"] = sr
    return cap


@torch.no_grad()
def teacher_forced(tts, cap, tf_codes):
    talker = tts.model.talker
    prompt = cap["prompt_embeds"]          # [1, L, H]
    trailing = cap["trailing"]             # [1, Nt, H]
    pad = cap["tts_pad"]                   # [1, 1, H]
    rows = []
    for k in range(tf_codes.shape[0]):
        c = tf_codes[k].view(1, 16)
        last_id_hidden = talker.get_input_embeddings()(c[:, :1])
        hid = torch.cat([last_id_hidden] + [talker.code_predictor.get_input_embeddings()[i](c[:, i + 1:i + 2])
                                            for i in range(15)], dim=1)
        e = hid.sum(1, keepdim=True)
        e = e + (trailing[:, k].unsqueeze(1) if k < trailing.shape[1] else pad)
        rows.append(e)
    dec = torch.cat(rows, dim=1)
    x = torch.cat([prompt, dec], dim=1)
    talker.rope_deltas = None
    out = talker(inputs_embeds=x, attention_mask=torch.ones(1, x.shape[1], dtype=torch.long),
                 use_cache=False, output_hidden_states=True)
    talker.rope_deltas = None
    hidden = out.hidden_states[0][-1][0]   # final-normed hidden, [L+F, H]
    logits = out.logits[0]                  # [L+F, 3072]
    assert torch.allclose(logits, talker.codec_head(hidden), atol=1e-5)
    L = prompt.shape[1]
    h_frames = hidden[L - 1:L - 1 + tf_codes.shape[0]]
    cp_logits, _ = talker.forward_sub_talker_finetune(tf_codes, h_frames)
    return dict(prompt_embeds=prompt[0], decode_embeds=dec[0], talker_logits=logits, talker_hidden=hidden,
                cp_logits=cp_logits, tf_codes=tf_codes)


def mistral_patched_ids(folder, text):
    """Token ids under the Mistral split regex that transformers 4.57.3 patches into LOCAL Qwen2
    tokenizers with vocab > 100000 when fix_mistral_regex=True (design §9.3).  The tiny vocab is below
    that threshold, so the official loader does NOT patch it; recorded for reference only."""
    import tokenizers
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.backend_tokenizer.pre_tokenizer[0] = tokenizers.pre_tokenizers.Split(
        pattern=tokenizers.Regex(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        behavior="isolated",
    )
    return tok(text)["input_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-build", action="store_true", help="reuse the existing tiny checkpoints")
    ap.add_argument("--only", choices=["all", "custom-voice", "clone", "clone-files"], default="all",
                    help="custom-voice: the CustomVoice fixtures (expected.*); clone: the Base / VoiceDesign fixtures "
                    "(expected_clone.*, clone_fixtures.py); clone-files: only the clone cases from clip files, added "
                    "to the existing expected_clone.* (the other entries are kept as they are); all: both")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    tok = build_text_tokenizer()
    if args.only in ("all", "custom-voice"):
        make_custom_voice(tok, args.skip_build)
    if args.only in ("all", "clone"):
        import clone_fixtures

        clone_fixtures.make(sys.modules[__name__], tok, args.skip_build)
    if args.only == "clone-files":
        import clone_fixtures

        clone_fixtures.make_files_only(sys.modules[__name__])


def make_custom_voice(tok, skip_build):
    vocab, merges, tok_cfg, special_ids, n_regular = tok
    if not skip_build:
        build_checkpoints(tok)

    tensors = {}
    expected = {
        "format_version": 1,
        "generated_by": "tests/reference/make_fixtures.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "qwen_tts": "0.1.1", "python": sys.version.split()[0]},
        "torch_num_threads": torch.get_num_threads(),
        "compute_dtype": "float32",
        "device": "cpu",
        "notes": [],
        "checkpoints": {},
        "cases": [],
        "teacher_forced": {},
        "codec": {},
        "tokenizer_checks": [],
    }

    loaded = {}
    for name in CKPTS:
        folder = OUT / name
        tts = Qwen3TTSModel.from_pretrained(str(folder))   # OFFICIAL loader, default kwargs
        tts.model.eval()
        loaded[name] = tts
        m = tts.model
        tc = m.config.talker_config
        expected["checkpoints"][name] = {
            "folder": name,
            "tts_model_size": m.config.tts_model_size,
            "talker_hidden_size": tc.hidden_size,
            "code_predictor_hidden_size": tc.code_predictor_config.hidden_size,
            "code_predictor_vocab_size": tc.code_predictor_config.vocab_size,
            "small_to_mtp_projection": type(m.talker.code_predictor.small_to_mtp_projection).__name__,
            "model_safetensors_dtype": "bfloat16",
            "speech_tokenizer_safetensors_dtype": "float32",
            "loaded_dtype": str(m.dtype).replace("torch.", ""),
            "speech_tokenizer_loaded_dtype": str(m.speech_tokenizer.model.dtype).replace("torch.", ""),
            "attn_implementation": {
                "talker": m.talker.config._attn_implementation,
                "code_predictor": m.talker.code_predictor.config._attn_implementation,
                "speech_tokenizer_decoder": m.speech_tokenizer.model.decoder.config._attn_implementation,
            },
            "text_token_ids": {t: i for t, i in special_ids.items()},
            "assistant_token_id": vocab["assistant"],
            "newline_token_id": vocab["Ċ"],
            "text_regular_vocab_size": n_regular,
            "text_vocab_size": TEXT_VOCAB_SIZE,
            "pretokenizer_regex": "qwen2 (NOT mistral-patched: vocab < 100000)",
        }

    # ---- generation cases -------------------------------------------------------------------
    caps = {}
    for case in CASES:
        tts = loaded[case["checkpoint"]]
        cap = run_case(tts, case)
        caps[case["name"]] = cap
        codes = cap["codes"][0]
        gk = cap["gen_kwargs"]
        seq = cap["sequences"][0].tolist()
        n_frames = int(codes.shape[0])
        if seq[-1] == 2150:
            stop = "eos"
            assert n_frames == len(seq) - 1
        else:
            stop = "max_new_tokens"
            assert len(seq) == case["max_new_tokens"] and n_frames == case["max_new_tokens"] - 1
        rec = {k: v for k, v in case.items() if not k.startswith("_")}
        instr_ids = gk["instruct_ids"][0]
        rec.update(
            wrapped_text=tts._build_assistant_text(case["text"]),
            input_ids=gk["input_ids"][0][0].tolist(),
            instruct_used=instr_ids is not None,
            wrapped_instruct=(tts._build_instruct_text(case["instruct"]) if instr_ids is not None else None),
            instruct_ids=(instr_ids[0].tolist() if instr_ids is not None else None),
            prompt_len=int(cap["prompt_embeds"].shape[1]),
            trailing_len=int(cap["trailing"].shape[1]),
            code0_tokens=seq,
            stop_reason=stop,
            num_frames=n_frames,
            codes=codes.tolist(),
            prompt_embeds_key=f"case/{case['name']}/prompt_embeds",
            wav_key=None,
            wav_num_samples=int(cap["wav"].shape[0]),
            sample_rate=cap["sr"],
        )
        tensors[f"case/{case['name']}/prompt_embeds"] = cap["prompt_embeds"][0].float().clone().contiguous()
        if case["_keep_wav"]:
            rec["wav_key"] = f"wav/{case['name']}"
            tensors[rec["wav_key"]] = cap["wav"].contiguous()
        expected["cases"].append(rec)
        print(f"{case['name']:40s} L={rec['prompt_len']:3d} frames={n_frames:3d} stop={stop}", flush=True)

    # sanity: 0b6 drops instruct -> identical to the same call without it
    # ---- teacher-forced logits --------------------------------------------------------------
    g = torch.Generator().manual_seed(4242)
    for name, case_name in [("tiny-0b6", "greedy_ns_0b6"), ("tiny-1b7", "greedy_ns_1b7")]:
        tts = loaded[name]
        vp = tts.model.config.talker_config.code_predictor_config.vocab_size
        F = 6
        tf_codes = torch.cat([torch.randint(0, 2048, (F, 1), generator=g),
                              torch.randint(0, vp, (F, 15), generator=g)], dim=1)
        tf = teacher_forced(tts, caps[case_name], tf_codes)
        L = tf["prompt_embeds"].shape[0]
        for k, v in tf.items():
            tensors[f"tf/{name}/{k}"] = v.clone().contiguous() if v.dtype == torch.int64 else v.float().clone().contiguous()
        expected["teacher_forced"][name] = {
            "prompt_from_case": case_name,
            "L": int(L), "F": F,
            "keys": {
                "prompt_embeds": f"tf/{name}/prompt_embeds  [L,H] talker prefill input rows exactly as official generate builds them (non-streaming)",
                "decode_embeds": f"tf/{name}/decode_embeds  [F,H] decode-step input for frame k = C(code0_k) + sum_g cp_table[g-1](code_g,k) + (trailing[k] if k < len(trailing) else PAD); non-streaming trailing = [PAD]",
                "talker_hidden": f"tf/{name}/talker_hidden  [L+F,H] final-RMSNormed talker hidden state of every input row of concat(prompt_embeds, decode_embeds), one causal forward, positions 0..L+F-1",
                "talker_logits": f"tf/{name}/talker_logits  [L+F,3072] codec_head(talker_hidden); row i = code-0 logits predicted AFTER input row i: row L-1+k predicts code0 of frame k (k=0..F-1), row L+F-1 predicts code0 of frame F. Raw logits (no penalty / suppression).",
                "cp_logits": f"tf/{name}/cp_logits  [F,15,Vp] frame k: code-predictor fed [talker_hidden[L-1+k], C(code0_k)] then cp_table[0..13](codes 1..14) (16 rows, positions 0..15, fresh cache); [k,j] = lm_head[j] at row j+1 = logits for code j+1",
                "tf_codes": f"tf/{name}/tf_codes  [F,16] int64 teacher-forced frames (code0 in 0..2047, codes 1..15 in 0..Vp-1)",
            },
        }

    # ---- codec waveforms ----------------------------------------------------------------------
    st = loaded["tiny-0b6"].model.speech_tokenizer
    g = torch.Generator().manual_seed(777)
    codec_info = {"checkpoint": "tiny-0b6 (tiny-1b7/speech_tokenizer is byte-identical)",
                  "samples_per_frame": 1920, "sample_rate": 24000,
                  "path": "Qwen3TTSTokenizer.decode([{'audio_codes': codes}]) -> Qwen3TTSTokenizerV2Model.decode -> decoder.chunked_decode(chunk_size=300, left_context_size=25)"}
    for T in (37, 350):
        codes = torch.randint(0, 2048, (T, 16), generator=g)
        wavs, sr = st.decode([{"audio_codes": codes}])
        wav = torch.from_numpy(np.asarray(wavs[0], dtype=np.float32))
        assert wav.shape[0] == T * 1920
        tensors[f"codec/T{T}/codes"] = codes.contiguous()
        tensors[f"codec/T{T}/wav"] = wav.contiguous()
        info = {"codes": f"codec/T{T}/codes [T,16] int64 (all groups 0..2047)",
                "wav": f"codec/T{T}/wav [{T * 1920}] float32, official chunked decode",
                "wav_rms": float(wav.pow(2).mean().sqrt()), "wav_abs_max": float(wav.abs().max()),
                "wav_frac_clipped": float((wav.abs() >= 1.0).float().mean())}
        if T == 350:
            with torch.inference_mode():
                one = st.model.decoder(codes.T.unsqueeze(0))[0, 0].float()
            head = 300 * 1920
            tensors["codec/T350/wav_oneshot_tail"] = one[head:].contiguous()
            info["wav_oneshot_tail"] = (f"codec/T350/wav_oneshot_tail [{(T - 300) * 1920}] float32 = samples "
                                        f"[{head}:{T * 1920}] of the ONE-SHOT decoder forward over all {T} frames")
            info["oneshot_head_vs_chunked_max_abs_diff"] = float((one[:head] - wav[:head]).abs().max())
            info["oneshot_tail_vs_chunked_max_abs_diff"] = float((one[head:] - wav[head:]).abs().max())
            info["oneshot_note"] = ("Samples [0:576000] of the one-shot output are not stored: by causality they equal "
                                    "codec/T350/wav[0:576000] (chunk 0) up to oneshot_head_vs_chunked_max_abs_diff.")
        codec_info[f"T{T}"] = info
    expected["codec"] = codec_info

    # ---- tokenizer checks ---------------------------------------------------------------------
    tts = loaded["tiny-0b6"]
    for s in ["<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>assistant\n",
              tts._build_assistant_text(T_CAMEL), tts._build_instruct_text(INSTRUCT),
              tts._build_assistant_text(T_ZH)]:
        ids = tts._tokenize_texts([s])[0][0].tolist()
        expected["tokenizer_checks"].append({
            "text": s, "input_ids": ids,
            "pieces": [tts.processor.tokenizer.convert_ids_to_tokens(i) for i in ids],
            "role_prefix_ids[:3]": ids[:3], "body_ids[3:-5]": ids[3:-5], "suffix_ids[-5:]": ids[-5:],
            "mistral_regex_input_ids": mistral_patched_ids(OUT / "tiny-0b6", s),
        })
    chk = expected["tokenizer_checks"][0]
    assert chk["pieces"][:3] == ["<|im_start|>", "assistant", "Ċ"], chk["pieces"]
    assert chk["suffix_ids[-5:]"] == [special_ids["<|im_end|>"], vocab["Ċ"], special_ids["<|im_start|>"],
                                      vocab["assistant"], vocab["Ċ"]]

    # ---- checks on the recorded cases ----------------------------------------------------------
    by = {c["name"]: c for c in expected["cases"]}
    a = by["instruct_dropped_0b6"]
    assert not a["instruct_used"]
    # 0b6 drops instruct: the same call without instruct gives the same codes
    c2 = dict(next(c for c in CASES if c["name"] == "instruct_dropped_0b6"), instruct=None)
    again = run_case(loaded["tiny-0b6"], c2)["codes"][0].tolist()
    assert again == a["codes"], "0b6 instruct was not dropped?"
    assert by["instruct_1b7"]["instruct_used"]
    # determinism: rerunning a sampled case with the same seed reproduces it
    c3 = next(c for c in CASES if c["name"] == "sample_ns_0b6")
    assert run_case(loaded["tiny-0b6"], c3)["codes"][0].tolist() == by["sample_ns_0b6"]["codes"]
    # teacher-forcing definition matches generation: teacher-force the greedy cases with their OWN codes,
    # apply the official greedy chain (rep. penalty on distinct code-0 history, min_new_tokens, suppression)
    # and argmax -> must reproduce the generated code 0 / codes 1..15.
    selfcheck = {}
    for name, case_name in [("tiny-0b6", "greedy_ns_0b6"), ("tiny-1b7", "greedy_ns_1b7")]:
        rec = by[case_name]
        own = torch.tensor(rec["codes"], dtype=torch.long)
        tf = teacher_forced(loaded[name], caps[case_name], own)
        L, F = rec["prompt_len"], own.shape[0]
        c0_pred = []
        for k in range(F):  # row L-1+k predicts code 0 of frame k
            lg = tf["talker_logits"][L - 1 + k].clone()
            for t in set(rec["code0_tokens"][:k]):
                lg[t] = lg[t] / rec["repetition_penalty"] if lg[t] > 0 else lg[t] * rec["repetition_penalty"]
            if k < 2:
                lg[2150] = -float("inf")
            lg[2048:] = torch.where(torch.arange(2048, 3072) == 2150, lg[2048:], torch.tensor(-float("inf")))
            c0_pred.append(int(lg.argmax()))
        if rec["stop_reason"] == "eos":  # the row after the last frame must pick EOS
            lg = tf["talker_logits"][L - 1 + F].clone()
            for t in set(rec["code0_tokens"][:F]):
                lg[t] = lg[t] / rec["repetition_penalty"] if lg[t] > 0 else lg[t] * rec["repetition_penalty"]
            lg[2048:] = torch.where(torch.arange(2048, 3072) == 2150, lg[2048:], torch.tensor(-float("inf")))
            assert int(lg.argmax()) == 2150
        cp_pred = tf["cp_logits"].argmax(-1)
        selfcheck[case_name] = {
            "code0_match": c0_pred == own[:, 0].tolist(),
            "codes1_15_match": bool((cp_pred == own[:, 1:]).all()),
        }
        assert selfcheck[case_name]["code0_match"] and selfcheck[case_name]["codes1_15_match"], selfcheck
    expected["teacher_forced"]["self_check"] = {
        "what": "teacher-forcing each greedy case with its own generated codes and applying the greedy chain "
                "reproduces its code 0 and codes 1..15 exactly",
        "result": selfcheck,
    }
    stops = {c["name"]: (c["stop_reason"], c["num_frames"]) for c in expected["cases"]}
    expected["notes"] += [
        "All reference numbers: official qwen-tts 0.1.1 code, fp32 compute on CPU, official loader defaults "
        "(Qwen3TTSModel.from_pretrained(folder) with no kwargs -> fp32, attn_implementation sdpa for talker, "
        "code predictor and codec).",
        "model.safetensors is stored in bfloat16 (like the real checkpoints); the loader upcasts to fp32.",
        f"code_predictor vocab_size is {CP_VOCAB} in the tiny checkpoints (shipped: 2048) to keep the fixtures small.",
        "Generation: torch.manual_seed(seed) immediately before Qwen3TTSModel.generate_custom_voice(...); "
        "codes captured from the return value of Qwen3TTSForConditionalGeneration.generate.",
        "Compare floats with a tolerance (~1e-5); fp32 results are bit-exact only at the same thread count.",
    ]
    expected["summary"] = {"stops": stops}

    save_file(tensors, str(OUT / "expected.safetensors"), metadata={"format": "pt"})
    with open(OUT / "expected.json", "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
    print(json.dumps(stops, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
