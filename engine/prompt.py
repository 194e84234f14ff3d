"""CustomVoice prompt: text template, control-token prefix and the talker's prefill rows.

Rows (each = text track + codec track):
  [instruct rows]  T(instruct tokens)                                   (only when instruct is given)
  role rows        T(<|im_start|>), T(assistant), T(\\n)
  control rows     PAD + C(k) for the prefix k = think/nothink, think_bos, [language], think_eos, [speaker];
                   BOS + C(codec_pad)
  non-streaming    T(t_j) + C(codec_pad) for every text token, EOS_T + C(codec_pad), PAD + C(codec_bos);
                   every decode step then adds PAD
  streaming        T(t_1) + C(codec_bos); decode step k adds T(t_{k+2}), then EOS_T, then PAD; for a sentence still
                   being written (`pull`), the rows t_{k+2}... are pulled as the steps reach them, waiting for more
                   text rather than padding, so the codes are those of the whole sentence's prompt
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from leapvox.engine.config import TTSConfig
from leapvox.engine.errors import InputError
from leapvox.engine.nets.talker import Talker
from leapvox.engine.options import TEXT_LAYOUT_CHOICES, TEXT_LAYOUTS, layout_for


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
    grow: Callable[[], tuple[torch.Tensor, int, bool]] | None = None  # an open sentence: (rows, tokens, closed)

    def step_text(self, k: int) -> torch.Tensor:
        """Text row added to the input of decode step k, [1, 1, H]; a sentence still being written first waits for
        its next tokens here (`grow`; closed: the rest and EOS_T)."""
        while k >= self.trailing.shape[1] and self.grow is not None:
            rows, n, closed = self.grow()
            self.trailing, self.n_text_tokens = torch.cat([self.trailing, rows], dim=1), self.n_text_tokens + n
            self.grow = None if closed else self.grow
        return self.trailing[:, k : k + 1] if k < self.trailing.shape[1] else self.pad

    def waits(self, k: int) -> bool:
        """Whether decode step k's text row is not there yet (it will be pulled, maybe waited for)."""
        return self.grow is not None and k >= self.trailing.shape[1]


def _grower(talker: Talker, eos: torch.Tensor, pull: Callable[[], tuple[list[int], bool]]):
    """`Prompt.grow` over `pull() -> (new text token ids, closed)`: their rows, and EOS_T once closed."""

    @torch.inference_mode()
    def grow() -> tuple[torch.Tensor, int, bool]:
        ids, closed = pull()
        rows = talker.embed_text(torch.tensor([ids], dtype=torch.long, device=talker.device)) if ids else eos[:, :0]
        return (torch.cat([rows, eos], dim=1) if closed else rows), len(ids), closed

    return grow


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


def _text_start(talker, cfg, text_ids: list[int]):
    """The device, the wrapped text's ids [1, n] and the embedded tts_bos, tts_eos, tts_pad rows (3 x [1, 1, H]);
    an empty text is a one-line InputError."""
    if len(text_ids) < 9:
        raise InputError("there is no text to speak", hint="give some words, e.g. leapvox speak \"Hello\"")
    dev = talker.device
    ids = torch.tensor([text_ids], device=dev)  # [1, n]
    special = torch.tensor([[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]], device=dev)
    return dev, ids, talker.embed_text(special).chunk(3, dim=1)


@torch.inference_mode()
def build_prompt(
    talker: Talker,
    cfg: TTSConfig,
    text_ids: list[int],
    speaker: str | None,
    language: str,
    text_layout: str = "non-streaming",
    instruct_ids: list[int] | None = None,
    pull: Callable[[], tuple[list[int], bool]] | None = None,
) -> Prompt:
    """Prefill rows and trailing text for the wrapped-text token ids (see `wrap_text`). `pull` (streaming layout):
    the ids are a sentence's start, and `pull()` gives its next tokens as decoding needs them (see `Prompt.grow`)."""
    dev, ids, (bos, eos, pad) = _text_start(talker, cfg, text_ids)
    codec = talker.embed_codec(torch.tensor([control_prefix(cfg, speaker, language)], device=dev))  # [1, P, H]
    control = torch.cat([pad.expand(-1, codec.shape[1] - 2, -1), bos], dim=1) + codec[:, :-1]
    rows = [talker.embed_text(ids[:, :3]), control]
    if instruct_ids:
        rows.insert(0, talker.embed_text(torch.tensor([instruct_ids], device=dev)))
    body = ids[:, 3:-5]  # [1, N]
    embeds, trailing = _text_rows(talker, cfg, ids, codec[:, -1:], eos, pad, text_layout, pull)
    return Prompt(torch.cat(rows + [embeds], dim=1), trailing, pad, body.shape[1], pull and _grower(talker, eos, pull))


def _text_rows(talker: Talker, cfg: TTSConfig, ids: torch.Tensor, bos_row: torch.Tensor, eos: torch.Tensor,
               pad: torch.Tensor, text_layout: str, pull=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows after the control rows for the wrapped text `ids` [1, n], and the trailing text rows (with `pull`,
    an open sentence's: no EOS_T yet)."""
    dev = ids.device
    text_layout = layout_for(text_layout, pull is not None)
    if pull is not None and text_layout != "streaming":
        raise ValueError("only the streaming text layout speaks a sentence still being written")
    body = ids[:, 3:-5]  # [1, N]
    if text_layout == "non-streaming":
        pad_codes = torch.full((1, body.shape[1] + 1), cfg.talker.codec_pad_id, device=dev)
        text = torch.cat([talker.embed_text(body), eos], dim=1) + talker.embed_codec(pad_codes)
        last = pad + talker.embed_codec(torch.tensor([[cfg.talker.codec_bos_id]], device=dev))
        return torch.cat([text, last], dim=1), pad
    if text_layout == "streaming":
        return talker.embed_text(ids[:, 3:4]) + bos_row, torch.cat([talker.embed_text(ids[:, 4:-5])]
                                                                   + ([eos] if pull is None else []), dim=1)
    raise InputError(f"unknown text layout {text_layout!r}", hint=f"use one of {', '.join(TEXT_LAYOUT_CHOICES)}")


# ---- Base models: a cloned voice ---------------------------------------------------------------------------------


def wrap_ref_text(text: str) -> str:
    """The reference clip's transcript, as an assistant turn (ICL prompts)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


@dataclass(frozen=True)
class ClonedVoice:
    """A voice cloned from a reference clip: its x-vector, and for ICL its codes and what the clip says."""

    xvector: torch.Tensor  # [H] speaker-encoder output, at talker width
    ref_codes: torch.Tensor | None = None  # [T, 16] int64 codes of the clip; None: x-vector only
    ref_text: str | None = None  # the clip's transcript (ICL); None: x-vector only

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None and bool(self.ref_text)


@torch.inference_mode()
def build_clone_prompt(
    talker: Talker,
    cfg: TTSConfig,
    text_ids: list[int],
    voice: ClonedVoice,
    language: str,
    text_layout: str = "non-streaming",
    ref_ids: list[int] | None = None,
    pull: Callable[[], tuple[list[int], bool]] | None = None,
) -> Prompt:
    """Prefill rows of a Base model speaking `text_ids` (see `wrap_text`) in `voice`.

    The x-vector takes the speaker slot of the control rows. x-vector only: the text rows follow as for
    CustomVoice. ICL (`ref_ids`: tokens of `wrap_ref_text(voice.ref_text)`): reference + target text tokens and
    EOS_T on the text track, codec_bos + the reference frames (16 code embeddings summed) on the codec track;
    non-streaming puts the text (over codec_pad) before the frames (over PAD), streaming adds the two tracks row by
    row, the longer track's rest trailing (text) or PAD. `pull`: as for `build_prompt` (x-vector only)."""
    dev, ids, (bos, eos, pad) = _text_start(talker, cfg, text_ids)
    prefix = talker.embed_codec(torch.tensor([control_prefix(cfg, None, language)], device=dev))  # [1, P, H]
    xvec = voice.xvector.to(dev, prefix.dtype).view(1, 1, -1)
    codec = torch.cat([prefix[:, :-2], xvec, prefix[:, -2:]], dim=1)  # [1, P + 1, H]
    control = torch.cat([pad.expand(-1, codec.shape[1] - 2, -1), bos], dim=1) + codec[:, :-1]
    rows = [talker.embed_text(ids[:, :3]), control]
    n_text = ids.shape[1] - 8
    if not (voice.icl and ref_ids):
        embeds, trailing = _text_rows(talker, cfg, ids, codec[:, -1:], eos, pad, text_layout, pull)
        return Prompt(torch.cat(rows + [embeds], dim=1), trailing, pad, n_text, pull and _grower(talker, eos, pull))
    if pull is not None:
        raise ValueError("an ICL voice's prompt holds the whole text: it cannot speak a sentence still being written")
    text_layout = layout_for(text_layout, False)
    if text_layout not in TEXT_LAYOUTS:
        raise InputError(f"unknown text layout {text_layout!r}", hint=f"use one of {', '.join(TEXT_LAYOUT_CHOICES)}")
    ref = torch.tensor([ref_ids], device=dev)[:, 3:-2]
    text = torch.cat([talker.embed_text(torch.cat([ref, ids[:, 3:-5]], dim=1)), eos], dim=1)  # [1, Nt, H]
    frames = talker.embed_frame(voice.ref_codes.to(dev)).transpose(0, 1)  # [1, T, H]
    codes = torch.cat([talker.embed_codec(torch.tensor([[cfg.talker.codec_bos_id]], device=dev)), frames], dim=1)
    nt, nc = text.shape[1], codes.shape[1]
    if text_layout == "non-streaming":
        pad_codes = talker.embed_codec(torch.full((1, nt), cfg.talker.codec_pad_id, device=dev))
        icl, trailing = torch.cat([text + pad_codes, codes + pad], dim=1), pad
    elif nt > nc:
        icl, trailing = text[:, :nc] + codes, text[:, nc:]
    else:
        icl, trailing = torch.cat([text] + [pad] * (nc - nt), dim=1) + codes, pad
    return Prompt(torch.cat(rows + [icl], dim=1), trailing, pad, n_text)
