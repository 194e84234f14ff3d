"""CustomVoice prompt: text template, control-token prefix and the talker's prefill rows.

Rows (each = text track + codec track):
  [instruct rows]  T(instruct tokens)                                   (only when instruct is given)
  role rows        T(<|im_start|>), T(assistant), T(\\n)
  control rows     PAD + C(k) for the prefix k = think/nothink, think_bos, [language], think_eos, [speaker];
                   BOS + C(codec_pad)
  non-streaming    T(t_j) + C(codec_pad) for every text token, EOS_T + C(codec_pad), PAD + C(codec_bos);
                   every decode step then adds PAD
  streaming        T(t_1) + C(codec_bos); decode step k adds T(t_{k+2}), then EOS_T, then PAD
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import TTSConfig
from .errors import InputError
from .options import TEXT_LAYOUTS
from .talker import Talker


def wrap_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def wrap_instruct(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@dataclass
class Prompt:
    embeds: torch.Tensor  # [1, L, H] prefill rows
    trailing: torch.Tensor  # [1, Tt, H] text rows added to decode steps 0..Tt-1
    pad: torch.Tensor  # [1, 1, H] added to every later decode step
    n_text_tokens: int

    def step_text(self, k: int) -> torch.Tensor:
        """Text row added to the input of decode step k, [1, 1, H]."""
        return self.trailing[:, k : k + 1] if k < self.trailing.shape[1] else self.pad


def language_id(cfg: TTSConfig, speaker: str | None, language: str) -> int | None:
    """Codec language id, or None for `auto`; dialect speakers force their dialect for chinese/auto."""
    tc = cfg.talker
    lang = language.lower()
    lang_id = None if lang == "auto" else tc.codec_language_id[lang]
    dialect = tc.spk_is_dialect.get(speaker.lower(), False) if speaker else False
    if lang in ("chinese", "auto") and dialect:
        lang_id = tc.codec_language_id[dialect]
    return lang_id


def control_prefix(cfg: TTSConfig, speaker: str | None, language: str) -> list[int]:
    """Codec ids of the control rows, ending with codec_pad and codec_bos."""
    tc = cfg.talker
    lang_id = language_id(cfg, speaker, language)
    if lang_id is None:
        ids = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
    else:
        ids = [tc.codec_think_id, tc.codec_think_bos_id, lang_id, tc.codec_think_eos_id]
    if speaker:
        ids.append(tc.spk_id[speaker.lower()])
    return ids + [tc.codec_pad_id, tc.codec_bos_id]


@torch.inference_mode()
def build_prompt(
    talker: Talker,
    cfg: TTSConfig,
    text_ids: list[int],
    speaker: str | None,
    language: str,
    text_layout: str = "non-streaming",
    instruct_ids: list[int] | None = None,
) -> Prompt:
    """Prefill rows and trailing text for the wrapped-text token ids (see `wrap_text`)."""
    if len(text_ids) < 9:
        raise InputError("there is no text to speak", hint="give some words, e.g. leapvox speak \"Hello\"")
    dev = talker.device
    ids = torch.tensor([text_ids], device=dev)  # [1, n]
    special = torch.tensor([[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]], device=dev)
    bos, eos, pad = talker.embed_text(special).chunk(3, dim=1)  # 3 x [1, 1, H]
    codec = talker.embed_codec(torch.tensor([control_prefix(cfg, speaker, language)], device=dev))  # [1, P, H]
    control = torch.cat([pad.expand(-1, codec.shape[1] - 2, -1), bos], dim=1) + codec[:, :-1]
    rows = [talker.embed_text(ids[:, :3]), control]
    if instruct_ids:
        rows.insert(0, talker.embed_text(torch.tensor([instruct_ids], device=dev)))
    body = ids[:, 3:-5]  # [1, N]
    if text_layout == "non-streaming":
        pad_codes = torch.full((1, body.shape[1] + 1), cfg.talker.codec_pad_id, device=dev)
        rows.append(torch.cat([talker.embed_text(body), eos], dim=1) + talker.embed_codec(pad_codes))
        rows.append(pad + talker.embed_codec(torch.tensor([[cfg.talker.codec_bos_id]], device=dev)))
        trailing = pad
    elif text_layout == "streaming":
        rows.append(talker.embed_text(ids[:, 3:4]) + codec[:, -1:])
        trailing = torch.cat([talker.embed_text(ids[:, 4:-5]), eos], dim=1)
    else:
        raise InputError(f"unknown text layout {text_layout!r}", hint=f"use one of {', '.join(TEXT_LAYOUTS)}")
    return Prompt(torch.cat(rows, dim=1), trailing, pad, body.shape[1])
