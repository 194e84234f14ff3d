"""The Qwen3-TTS geometry, written once: config.json of the official 12 Hz CustomVoice models (talker, code
predictor, codec), and the 0.6B layer sizes that the random-weight benchmarks build (`leapvox recipe bench-window`,
`leapvox recipe bench-spec --cost-only`, tests/benchmarks/bench.py). Data only: nothing here imports torch."""

from __future__ import annotations

import copy

# config.json of Qwen3-TTS-12Hz-0.6B-CustomVoice (design tables); 1.7B differs in the talker width only.
CODE_PREDICTOR = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 65536,
    "model_type": "qwen3_tts_talker_code_predictor",
    "num_attention_heads": 16,
    "num_code_groups": 16,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
}
TALKER = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "code_predictor_config": CODE_PREDICTOR,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_pad_id": 2148,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_language_id": {
        "chinese": 2055,
        "english": 2050,
        "german": 2053,
        "italian": 2070,
        "portuguese": 2071,
        "spanish": 2054,
        "japanese": 2058,
        "korean": 2064,
        "french": 2061,
        "russian": 2069,
        "beijing_dialect": 2074,
        "sichuan_dialect": 2062,
    },
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "model_type": "qwen3_tts_talker",
    "num_attention_heads": 16,
    "num_code_groups": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "position_id_per_seconds": 13,
    "rms_norm_eps": 1e-6,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000,
    "sliding_window": None,
    "spk_id": {
        "serena": 3066,
        "vivian": 3065,
        "uncle_fu": 3010,
        "ryan": 3061,
        "aiden": 2861,
        "ono_anna": 2873,
        "sohee": 2864,
        "eric": 2875,
        "dylan": 2878,
    },
    "spk_is_dialect": {
        "serena": False,
        "vivian": False,
        "uncle_fu": False,
        "ryan": False,
        "aiden": False,
        "ono_anna": False,
        "sohee": False,
        "eric": "sichuan_dialect",
        "dylan": "beijing_dialect",
    },
    "text_hidden_size": 2048,
    "text_vocab_size": 151936,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 3072,
    "tie_word_embeddings": False,
}
TOP = {
    "architectures": ["Qwen3TTSForConditionalGeneration"],
    "model_type": "qwen3_tts",
    "assistant_token_id": 77091,
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
    "tokenizer_type": "qwen3_tts_tokenizer_12hz",
    "tts_model_size": "0b6",
    "tts_model_type": "custom_voice",
    "tie_word_embeddings": False,
}
SPEECH_TOKENIZER = {
    "architectures": ["Qwen3TTSTokenizerV2Model"],
    "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
    "encoder_config": {  # the official loader builds the (unused) encoder too; its weights stay random there
        "audio_channels": 1,
        "num_filters": 64,
        "kernel_size": 7,
        "residual_kernel_size": 3,
        "last_kernel_size": 3,
        "num_residual_layers": 1,
        "compress": 2,
        "dilation_growth_rate": 2,
        "upsampling_ratios": [8, 6, 5, 4],
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2048,
        "hidden_act": "gelu",
        "norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01,
        "rope_theta": 10000,
        "max_position_embeddings": 8000,
        "sliding_window": 250,
        "num_quantizers": 32,
        "num_semantic_quantizers": 1,
        "codebook_size": 2048,
        "codebook_dim": 256,
        "vector_quantization_hidden_dimension": 256,
        "pad_mode": "constant",
        "use_causal_conv": True,
        "frame_rate": 12.5,
        "sampling_rate": 24000,
    },
    "decoder_config": {
        "attention_bias": False,
        "latent_dim": 1024,
        "codebook_dim": 512,
        "codebook_size": 2048,
        "decoder_dim": 1536,
        "hidden_act": "silu",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "head_dim": 64,
        "num_attention_heads": 16,
        "num_hidden_layers": 8,
        "num_key_value_heads": 16,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "semantic_codebook_size": 4096,
        "sliding_window": 72,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "vector_quantization_hidden_dimension": 512,
    },
}

SIZES = {
    "0.6b": {"tts_model_size": "0b6"},
    "1.7b": {"tts_model_size": "1b7", "talker": {"hidden_size": 2048, "intermediate_size": 6144}},
}


def model_config(size: str) -> dict:
    """config.json of the official `size` ("0.6b" or "1.7b") CustomVoice model."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {', '.join(SIZES)}")
    spec = SIZES[size]
    talker = copy.deepcopy(TALKER)
    talker.update(spec.get("talker", {}))
    return {**copy.deepcopy(TOP), "tts_model_size": spec["tts_model_size"], "talker_config": talker}


# The layer sizes of the 0.6B talker and code predictor (the TransformerConfig fields that set the cost of a call).
_DIMS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "head_dim", "vocab_size")
TALKER_0_6B = {k: TALKER[k] for k in _DIMS}
PREDICTOR_0_6B = {**{k: CODE_PREDICTOR[k] for k in _DIMS}, "num_code_groups": CODE_PREDICTOR["num_code_groups"]}
