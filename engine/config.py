"""Dataclass configs built from a checkpoint's `config.json`.

Every id is read from the file: the shipped values differ from the defaults in the official package.
Unknown keys are ignored so that newer checkpoints still load.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _pick(cls, d: dict[str, Any], **renames: str) -> dict[str, Any]:
    """Keep the keys of `d` that are fields of `cls`; `renames` maps field name -> key in `d`."""
    names = {f.name for f in fields(cls)}
    out = {k: v for k, v in d.items() if k in names}
    for name, key in renames.items():
        if key in d:
            out[name] = d[key]
    return out


@dataclass(frozen=True)
class TransformerConfig:
    """A Qwen3 decoder stack: pre-norm blocks, per-head QK-norm, GQA, SwiGLU, rotate-half RoPE."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768


@dataclass(frozen=True)
class CodePredictorConfig(TransformerConfig):
    """The small depth transformer that emits codes 1..15 of each frame."""

    vocab_size: int = 2048
    num_code_groups: int = 16

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodePredictorConfig:
        return cls(**_pick(cls, d))


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    """The talker: text + codec embeddings in, code 0 of each frame out (`codec_head`)."""

    vocab_size: int = 3072
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_eos_token_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_language_id: dict[str, int] = field(default_factory=dict)
    spk_id: dict[str, int] = field(default_factory=dict)
    spk_is_dialect: dict[str, Any] = field(default_factory=dict)
    code_predictor: CodePredictorConfig | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TalkerConfig:
        kw = _pick(cls, d)
        kw.pop("code_predictor", None)
        cp = CodePredictorConfig.from_dict(d.get("code_predictor_config") or {})
        return cls(**kw, code_predictor=cp)

    @property
    def suppressed_ids(self) -> range:
        """Control-token range masked out of code-0 sampling (EOS is let through separately)."""
        return range(self.vocab_size - 1024, self.vocab_size)


@dataclass(frozen=True)
class TTSConfig:
    """Top level of config.json for a Qwen3-TTS 12 Hz model."""

    talker: TalkerConfig
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    assistant_token_id: int = 77091
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    tts_model_size: str = "0b6"
    tts_model_type: str = "custom_voice"
    tokenizer_type: str = "qwen3_tts_tokenizer_12hz"
    leapvox_window: int | None = None  # set by `leapvox recipe window`: the talker was adapted to this window
    # runaway guard: frames allowed per text token for this model (options.guard_frames; None: the Qwen default)
    leapvox_guard_frames_per_token: float | None = None
    leapvox_text_frontend: str | None = None  # a text -> text step before tokenizing (models/frontend.py)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TTSConfig:
        kw = _pick(cls, d)
        kw.pop("talker", None)
        return cls(talker=TalkerConfig.from_dict(d.get("talker_config") or {}), **kw)

    @property
    def supports_instruct(self) -> bool:
        """The official wrapper drops `instruct` for the 0.6B size."""
        return self.tts_model_size not in ("0b6", "demo")

    @property
    def speakers(self) -> list[str]:
        return sorted(self.talker.spk_id)

    @property
    def languages(self) -> list[str]:
        """`auto` plus every language id that is not a dialect (dialects come from the speaker)."""
        return ["auto"] + sorted(k for k in self.talker.codec_language_id if "dialect" not in k)
