"""All synthesis options in one frozen dataclass, validated in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .config import TTSConfig
from .errors import InputError

# Where the text rows sit: all in the prompt (as the official package by default), or riding on frames.
TEXT_LAYOUTS: tuple[str, ...] = ("non-streaming", "streaming")

# The decoding modes; everything that lists modes (option validation, `leapvox compare`, the TUI selector) reads
# MODES, and `Synthesizer` turns a mode into its cache policy and predictor strategy (synthesis.decode_frames).
MODES: tuple[str, ...] = ("ar", "spec", "windowed")

MODE_HELP = {
    "ar": "plain autoregressive: one talker step and 15 code-predictor calls per frame",
    "spec": "speculative: the code predictor drafts several codes per call and verifies them",
    "windowed": "windowed: the talker attends to the prompt and a ring of the last W frames (bounded cache)",
}

# --backend: `cpu` = the torch engine, `ane` = Core ML on macOS (coreml_runtime), `auto` = ane where it can run
# and the model has a Core ML export, else cpu. --compute-units: where Core ML may run the ane backend's functions.
BACKEND_CHOICES: tuple[str, ...] = ("auto", "cpu", "ane")
COMPUTE_UNIT_CHOICES: tuple[str, ...] = ("cpu_and_ne", "all", "cpu_only")

# The reference stops after max_new_tokens code-0 draws, i.e. at most max_new_tokens - 1 frames;
# the shipped generation_config.json sets max_new_tokens = 8192.
DEFAULT_MAX_FRAMES = 8191

# Runaway guard: 0.3-0.5% of generations never emit EOS. Normal speech takes ~3-5 frames (80 ms each) per
# text token; the guard allows 12 frames (~1 s) per token plus 2.4 s, about 3x the slowest normal reading.
GUARD_BASE_FRAMES = 30
GUARD_FRAMES_PER_TOKEN = 12

# Windowed mode's default window. 48 frames = 3.84 s of speech, about an intonation phrase and its neighbour,
# the context prosody plausibly needs; the ring then holds about as many rows as a typical prompt (30-100), so a
# step attends to ~L + 48 keys. Cost does not argue for a smaller W: on a random-weight 0.6B talker (CPU, fp32)
# a step is dominated by weight reads, and L + 48 keys costs the same as the prompt alone within noise, while
# the cache stays at (L + 48) x 0.22 MiB instead of growing 0.22 MiB per frame (`leapvox bench-window`).
# Quality vs W can only be measured with real or adapted weights; 48 is a starting point, not a tuned value.
DEFAULT_WINDOW = 48


@dataclass(frozen=True)
class SamplingParams:
    """One sampling switch and its warpers. `top_k` 0 and `top_p` 1.0 disable those warpers."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0


def guard_frames(n_text_tokens: int, per_token: float | None = None) -> int:
    """Frame cap derived from the text length (see GUARD_* above); `per_token` is the model's own rate when its
    config.json sets one (`leapvox_guard_frames_per_token`: its text tokens are not Qwen's BPE tokens)."""
    rate = GUARD_FRAMES_PER_TOKEN if per_token is None else per_token
    return GUARD_BASE_FRAMES + math.ceil(rate * n_text_tokens)


@dataclass(frozen=True)
class SynthesisOptions:
    speaker: str | None = None  # None: the model's first speaker
    language: str = "auto"  # `auto` or one of the model's languages
    instruct: str | None = None  # style instruction; only 1.7B models use it
    text_layout: str = "non-streaming"  # where text rows sit: all in the prompt, or riding on frames
    talker: SamplingParams = field(default_factory=SamplingParams)  # code 0
    predictor: SamplingParams = field(default_factory=SamplingParams)  # codes 1..15
    repetition_penalty: float = 1.05  # on the distinct code-0 history
    max_frames: int = DEFAULT_MAX_FRAMES  # hard cap; official max_new_tokens = max_frames + 1
    runaway_guard: bool = True  # also cap frames by text length (guard_frames)
    seed: int | None = None  # torch CPU generator seed; None draws a fresh one
    mode: str = "ar"  # decoding mode, one of MODES
    window: int = DEFAULT_WINDOW  # windowed mode: frame rows the talker attends to besides the prompt

    def greedy(self) -> SynthesisOptions:
        """Argmax for code 0 and for codes 1..15."""
        return replace(
            self, talker=replace(self.talker, do_sample=False), predictor=replace(self.predictor, do_sample=False)
        )


def _check_sampling(name: str, p: SamplingParams) -> None:
    if not (p.temperature > 0 and math.isfinite(p.temperature)):
        raise InputError(f"{name} temperature must be > 0, got {p.temperature}", hint="try 0.9, or --greedy")
    if p.top_k < 0:
        raise InputError(f"{name} top-k must be >= 0 (0 disables it), got {p.top_k}")
    if not 0.0 < p.top_p <= 1.0:
        raise InputError(f"{name} top-p must be in (0, 1], got {p.top_p}")


def validate(opts: SynthesisOptions, cfg: TTSConfig) -> SynthesisOptions:
    """Check options against the model; returns them with the speaker resolved and names lowercased."""
    speaker = (opts.speaker or next(iter(cfg.talker.spk_id), "")).lower() or None
    if speaker is not None and speaker not in cfg.talker.spk_id:
        raise InputError(f"unknown speaker {opts.speaker!r}", hint=f"speakers: {', '.join(cfg.speakers)}")
    language = opts.language.lower()
    if language != "auto" and language not in cfg.talker.codec_language_id:
        raise InputError(f"unknown language {opts.language!r}", hint=f"languages: {', '.join(cfg.languages)}")
    if opts.text_layout not in TEXT_LAYOUTS:
        raise InputError(f"unknown text layout {opts.text_layout!r}", hint=f"use one of {', '.join(TEXT_LAYOUTS)}")
    _check_sampling("talker", opts.talker)
    _check_sampling("code-predictor", opts.predictor)
    if not (opts.repetition_penalty > 0 and math.isfinite(opts.repetition_penalty)):
        raise InputError(f"repetition penalty must be > 0, got {opts.repetition_penalty}", hint="1.0 disables it")
    if opts.mode not in MODES:
        raise InputError(f"unknown decoding mode {opts.mode!r}", hint=f"this build offers: {', '.join(MODES)}")
    if opts.window < 1:
        raise InputError(f"window must be >= 1 frame, got {opts.window}", hint=f"the default is {DEFAULT_WINDOW}")
    if opts.max_frames < 1:
        raise InputError(f"max frames must be >= 1, got {opts.max_frames}")
    instruct = opts.instruct or None
    return replace(opts, speaker=speaker, language=language, instruct=instruct)
