"""All synthesis options in one frozen dataclass, validated in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .config import TTSConfig
from .errors import InputError
from .text import has_words

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


# torch.Generator.manual_seed takes a uint64 (a negative seed s there is 2**64 + s, an alias of one in range), and
# the official package is seeded with torch.manual_seed: every seed it can be given, each spelled one way.
SEED_MAX = 2**64 - 1


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    return _int(v) or isinstance(v, float) and math.isfinite(v)


# What each option a person sets must be: field -> (test, rule, hint). The one set of rules behind the command line,
# the server, the TUI and `validate`; each names an option as its user spells it (--top-k, top_k). A temperature
# of 0 means greedy (as in OpenAI's clients); SamplingParams itself holds a temperature > 0.
OPTION_RULES = {
    "seed": (lambda v: _int(v) and 0 <= v <= SEED_MAX, "an integer in 0..2^64-1", "leave it out for a random seed"),
    "temperature": (lambda v: _real(v) and v >= 0, ">= 0", "try 0.9; 0 (or --greedy) picks the most likely code"),
    "top_k": (lambda v: _int(v) and v >= 0, ">= 0 (0 disables it)", "try 50"),
    "top_p": (lambda v: _real(v) and 0 < v <= 1, "in (0, 1]", "1.0 disables it"),
    "repetition_penalty": (lambda v: _real(v) and v > 0, "> 0", "1.0 disables it"),
    "max_frames": (lambda v: _int(v) and v >= 1, ">= 1", f"frames are 80 ms; the default is {DEFAULT_MAX_FRAMES}"),
    "window": (lambda v: _int(v) and v >= 1, ">= 1 frame", f"the default is {DEFAULT_WINDOW}"),
    "speaker": (lambda v: isinstance(v, str) and v.strip() != "", "a speaker's name", "leave it out for the "
                "model's first; leapvox speakers lists them"),
}


class OptionError(InputError):
    """A bad option or text; `param` names it as the entry point spells it (a server's error says which field)."""

    def __init__(self, param: str, message: str, hint: str | None = None):
        super().__init__(message, hint)
        self.param = param


def _shown(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v if len(v) <= 40 else v[:40] + "...") if isinstance(v, str) else str(v)


def check_option(key: str, value, name: str | None = None) -> None:
    """`value` (None: not given) against OPTION_RULES[key]; an OptionError naming it `name` (default `key`)."""
    test, rule, hint = OPTION_RULES[key]
    if value is not None and not test(value):
        name = name or key
        raise OptionError(name, f"{name} must be {rule}, got {_shown(value)}", hint)


def check_options(given: dict, name=lambda key: key) -> list[str]:
    """The options a person gave (option -> value; None or False: not given), each against OPTION_RULES, named
    as the entry point spells them (`name("top_k")`: --top-k on the command line, top_k in a request): an
    OptionError for the first bad one, else a warning for each one that will have no effect."""
    for key, value in given.items():
        if key in OPTION_RULES:
            check_option(key, value, name(key))
    warnings, mode = [], given.get("mode") or "ar"

    def ignored(key: str, why: str) -> None:
        if given.get(key) is not None:
            warnings.append(f"{name(key)} has no effect {why}")

    if mode != "windowed":
        ignored("window", f"with {name('mode')} {mode}")
    if given.get("greedy") or given.get("temperature") == 0:  # argmax: nothing is sampled
        why = f"with {name('greedy')}" if given.get("greedy") else f"with {name('temperature')} 0"
        for key in ("temperature", "top_k", "top_p") if given.get("greedy") else ("top_k", "top_p"):
            ignored(key, why)
    if not given.get("play"):
        ignored("device", f"without {name('play')}")
    return warnings


def check_text(text: str, name: str = "the text") -> None:
    """What makes a text speakable, for every entry point (`text` already cleaned of control characters): not
    empty, and something to say (a letter or a digit: "!!! ???" has none)."""
    if not text.strip():
        raise OptionError(name, f"{name} is empty", hint="give some words to speak")
    if not has_words(text):
        raise OptionError(name, f"{name} has nothing to say: {_shown(text)} holds no letter or digit",
                          hint="give some words to speak")


def _check_sampling(name: str, p: SamplingParams) -> None:
    if not (p.temperature > 0 and math.isfinite(p.temperature)):
        raise InputError(f"{name} temperature must be > 0, got {p.temperature}", hint="try 0.9, or --greedy")
    check_option("top_k", p.top_k, f"{name} top-k")
    check_option("top_p", p.top_p, f"{name} top-p")


def validate(opts: SynthesisOptions, cfg: TTSConfig) -> SynthesisOptions:
    """Check options against the model; returns them with the speaker resolved and names lowercased."""
    speaker = (opts.speaker or next(iter(cfg.talker.spk_id), "")).strip().lower() or None
    if speaker is not None and speaker not in cfg.talker.spk_id:
        raise InputError(f"unknown speaker {opts.speaker!r}", hint=f"speakers: {', '.join(cfg.speakers)}")
    language = opts.language.lower()
    if language not in cfg.languages:  # as the official package: auto and the languages, not the dialects
        raise InputError(f"unknown language {opts.language!r}", hint=f"languages: {', '.join(cfg.languages)}")
    if opts.text_layout not in TEXT_LAYOUTS:
        raise InputError(f"unknown text layout {opts.text_layout!r}", hint=f"use one of {', '.join(TEXT_LAYOUTS)}")
    _check_sampling("talker", opts.talker)
    _check_sampling("code-predictor", opts.predictor)
    if opts.mode not in MODES:
        raise InputError(f"unknown decoding mode {opts.mode!r}", hint=f"this build offers: {', '.join(MODES)}")
    for key in ("seed", "repetition_penalty", "window", "max_frames"):
        check_option(key, getattr(opts, key))
    instruct = opts.instruct or None
    return replace(opts, speaker=speaker, language=language, instruct=instruct)
