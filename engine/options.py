"""All synthesis options in one frozen dataclass, validated in one place."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from leapvox.engine.config import TTSConfig
from leapvox.engine.errors import InputError
from leapvox.engine.markup import check_markup, strip_markup
from leapvox.engine.text import has_words

# Where the text rows sit: all in the prompt (as the official package by default), or riding on frames.
TEXT_LAYOUTS: tuple[str, ...] = ("non-streaming", "streaming")
# `auto` (the default) chooses per sentence (`layout_for`): tests/benchmarks/first_audio_producer.py measured why.
AUTO_LAYOUT = "auto"
TEXT_LAYOUT_CHOICES: tuple[str, ...] = (AUTO_LAYOUT, *TEXT_LAYOUTS)


def layout_for(text_layout: str, open_sentence: bool) -> str:
    """The layout one sentence is laid out in. `auto`: streaming for a sentence still being written when its turn
    comes (text arriving in pieces, on a model that reads text tokens: it starts a few words in), else non-streaming,
    the official package's default (a whole text gives the official codes for a seed)."""
    if text_layout != AUTO_LAYOUT:
        return text_layout
    return "streaming" if open_sentence else "non-streaming"

# The decoding modes; everything that lists modes (option validation, `leapvox compare`, the TUI selector) reads
# MODES, and `Synthesizer` turns a mode into its cache policy and predictor strategy (synthesis.decode_frames).
MODES: tuple[str, ...] = ("ar", "spec", "windowed")

# What a user may ask for: a mode, or `auto`, which leapvox's commands resolve per request before the weights load
# (models.auto: the model's tune profile here, else ar); the Synthesizer only ever sees one of MODES.
AUTO = "auto"
MODE_CHOICES: tuple[str, ...] = (AUTO, *MODES)

MODE_HELP = {
    "ar": "plain autoregressive: one talker step and 15 code-predictor calls per frame",
    "spec": "speculative: the code predictor drafts several codes per call and verifies them",
    "windowed": "windowed: the talker attends to the prompt and a ring of the last W frames (bounded cache)",
}

# --weights: the talker's and code predictor's weight formats (engine.fast.quant loads them; `auto` picks one there)
WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "bf16", "int8", "w8a8", "w4a8", "int4")

# --backend: `cpu` = the torch engine, `ane` = Core ML on macOS (coreml_runtime), `auto` = ane where it can run
# and the model has a Core ML export, else cpu. --compute-units: where Core ML may run the ane backend's functions.
BACKEND_CHOICES: tuple[str, ...] = ("auto", "cpu", "ane")
COMPUTE_UNIT_CHOICES: tuple[str, ...] = ("cpu_and_ne", "all", "cpu_only")

# The reference stops after max_new_tokens code-0 draws, i.e. at most max_new_tokens - 1 frames;
# the shipped generation_config.json sets max_new_tokens = 8192.
DEFAULT_MAX_FRAMES = 8191

# Runaway guard: a few generations in a thousand never emit EOS. Normal speech takes ~3-5 frames (80 ms each) per
# text token; the guard allows 12 frames per token plus 30, about 3x the slowest normal reading.
GUARD_BASE_FRAMES = 30
GUARD_FRAMES_PER_TOKEN = 12

# Windowed mode's default window. 48 frames = 3.84 s of speech, about an intonation phrase and its neighbour,
# the context prosody plausibly needs; a step then attends to the prompt and 48 frames, which costs no more than
# the prompt alone while the cache stays bounded (`leapvox recipe bench-window`). Quality vs W can only be measured with
# real or adapted weights; 48 is a starting point, not a tuned value.
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
    text_layout: str = AUTO_LAYOUT  # where text rows sit: all in the prompt, riding on frames, or auto (per sentence)
    talker: SamplingParams = field(default_factory=SamplingParams)  # code 0
    predictor: SamplingParams = field(default_factory=SamplingParams)  # codes 1..15
    repetition_penalty: float = 1.05  # on the distinct code-0 history
    max_frames: int = DEFAULT_MAX_FRAMES  # hard cap; official max_new_tokens = max_frames + 1
    runaway_guard: bool = True  # also cap frames by text length (guard_frames)
    seed: int | None = None  # torch CPU generator seed; None draws a fresh one
    mode: str = "ar"  # decoding mode, one of MODES
    window: int = DEFAULT_WINDOW  # windowed mode: frame rows the talker attends to besides the prompt
    # (cfg, voiced) that `validate` checked these options for; replace() and construction start unchecked
    _checked: tuple | None = field(default=None, init=False, compare=False, repr=False)

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
    "language": (lambda v: isinstance(v, str), "a language's name", "auto, or one leapvox speakers lists"),
    "instruct": (lambda v: isinstance(v, str), "text", "describe the style in words"),
}

# The options a person sets, as every entry point's plain mapping names them (speak's flags, a request's fields
# once renamed, the TUI's state, a batch item): option -> value, None or absent = not given (`build_options`).
# SamplingParams' values (temperature, top_k, top_p) apply to code 0 and codes 1..15 alike.
SAMPLED: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams) if f.name != "do_sample")
OPTION_KEYS: tuple[str, ...] = ("speaker", "language", "instruct", "text_layout", "seed", *SAMPLED, "greedy",
                                "repetition_penalty", "max_frames", "no_guard", "mode", "window")


class OptionError(InputError):
    """A bad option or text; `param` names it as the entry point spells it (a server's error says which field)."""

    def __init__(self, param: str, message: str, hint: str | None = None):
        super().__init__(message, hint)
        self.param = param


def _shown(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v if len(v) <= 40 else v[:40] + "...") if isinstance(v, str) else str(v)


def _same(key: str) -> str:
    return key


def check_option(key: str, value, name: str | None = None) -> None:
    """`value` (None: not given) against OPTION_RULES[key]; an OptionError naming it `name` (default `key`)."""
    test, rule, hint = OPTION_RULES[key]
    if value is not None and not test(value):
        name = name or key
        raise OptionError(name, f"{name} must be {rule}, got {_shown(value)}", hint)


def check_options(given: Mapping, name=_same) -> list[str]:
    """The options a person gave (option -> value; None or False: not given), each against OPTION_RULES, named
    as the entry point spells them (`name("top_k")`: --top-k on the command line, top_k in a request): an
    OptionError for the first bad one, else a warning for each one that will have no effect. Needs no model."""
    for key, value in given.items():
        if key in OPTION_RULES:
            check_option(key, value, name(key))
    warnings, mode = [], given.get("mode") or "ar"

    def ignored(key: str, why: str) -> None:
        if given.get(key) is not None:
            warnings.append(f"{name(key)} has no effect {why}")

    if mode != "windowed":
        ignored("window", f"with {name('mode')} {mode}" + (" (auto never runs windowed)" if mode == AUTO else ""))
    if given.get("greedy") or given.get("temperature") == 0:  # argmax: nothing is sampled
        why = f"with {name('greedy')}" if given.get("greedy") else f"with {name('temperature')} 0"
        for key in SAMPLED:
            if given.get("greedy") or key != "temperature":
                ignored(key, why)
    if not given.get("play"):
        ignored("device", f"without {name('play')}")
    return warnings


def build_options(given: Mapping, defaults: SynthesisOptions = SynthesisOptions()) -> SynthesisOptions:
    """SynthesisOptions from a plain mapping of OPTION_KEYS (None or absent: not given, the default stays) over
    the model's `defaults`. Sampling values apply to code 0 and codes 1..15 alike; `greedy`, or a temperature of 0,
    makes both argmax. Builds only: `check_options` checks the values, `validate` the result."""
    g = {k: v for k, v in given.items() if k in OPTION_KEYS and v is not None}
    greedy = bool(g.pop("greedy", False)) or g.get("temperature") == 0
    if g.get("temperature") == 0:
        del g["temperature"]  # greedy: not used, and the model's own stays valid
    if "no_guard" in g:
        g["runaway_guard"] = not g.pop("no_guard")
    sampled = {k: g.pop(k) for k in SAMPLED if k in g}

    def sampling(p: SamplingParams) -> SamplingParams:
        return replace(p, **sampled, do_sample=p.do_sample and not greedy)

    return replace(defaults, talker=sampling(defaults.talker), predictor=sampling(defaults.predictor), **g)


def check_text(text: str, name: str = "the text") -> None:
    """What makes a text speakable, for every entry point (`text` already cleaned of control characters): not
    empty, its pause tags well formed (markup.py), and something to say besides them (a letter or a digit: "!!! ???"
    has none)."""
    if not text.strip():
        raise OptionError(name, f"{name} is empty", hint="give some words to speak")
    try:
        check_markup(text)
    except InputError as e:
        raise OptionError(name, f"{name}: {e}", hint=e.hint) from None
    if not has_words(strip_markup(text)):
        what = "no letter or digit" if has_words(text) is has_words(strip_markup(text)) else "only pause tags"
        raise OptionError(name, f"{name} has nothing to say: {_shown(text)} holds {what}",
                          hint="give some words to speak")


def check_voice(cfg: TTSConfig, voice, instruct: str | None, name=_same, speaker: str | None = None) -> None:
    """A Base model speaks only in a cloned voice and takes no instruction or built-in speaker; other model types
    take no cloned voice. Only whether there is a `voice` matters (see `validate`); `name` spells a field as the
    entry point does (check_options)."""
    if cfg.tts_model_type == "base":
        if speaker:
            raise OptionError(name("speaker"), f"a Base model has no built-in speakers ({name('speaker')})",
                              hint="it speaks in a cloned voice: a saved one (leapvox voices add) or a reference clip")
        if voice is None:
            raise OptionError(name("voice"), "this Base model speaks in a cloned voice", hint="give a saved voice "
                              "(leapvox voices add) or a reference clip")
        if instruct:
            raise OptionError(name("instruct"), f"a Base model takes no {name('instruct')}", hint="style "
                              "instructions need a CustomVoice 1.7B or VoiceDesign model")
    elif voice is not None:
        raise OptionError(name("voice"), f"a cloned voice needs a Base model; this is a {cfg.tts_model_type} model",
                          hint="voice cloning needs a Base model, e.g. qwen3-tts-0.6b-base")


def _check_sampling(which: str, p: SamplingParams, name) -> None:
    if not (_real(p.temperature) and p.temperature > 0):
        raise OptionError(name("temperature"), f"{which} temperature must be > 0, got {_shown(p.temperature)}",
                          hint="try 0.9, or --greedy")
    check_option("top_k", p.top_k, f"{which} top-k")
    check_option("top_p", p.top_p, f"{which} top-p")


def validate(opts: SynthesisOptions, cfg: TTSConfig, voice=None, name=_same) -> SynthesisOptions:
    """Check options against the model (`cfg`) and the cloned `voice` (Base models) once per request: returns
    them with the speaker resolved and names lowercased, marked as checked for this cfg and voice, so that given
    them again (the stream does) it returns them at once. Only whether there is a voice matters, so an entry point
    may pass what stands for one it has yet to encode (a saved voice's name, a clip). `name` spells an option as
    the entry point does (check_options); every error is an OptionError naming it."""
    voiced = voice is not None
    if opts._checked is not None and opts._checked[0] is cfg and opts._checked[1] == voiced:
        return opts
    checked = _checked_options(opts, cfg, voiced, name)
    object.__setattr__(checked, "_checked", (cfg, voiced))
    return checked


def _checked_options(opts: SynthesisOptions, cfg: TTSConfig, voiced: bool, name) -> SynthesisOptions:
    for key in ("seed", "repetition_penalty", "window", "max_frames", "language", "instruct"):
        check_option(key, getattr(opts, key), name(key))
    check_voice(cfg, True if voiced else None, opts.instruct, name, opts.speaker)
    speaker = (opts.speaker or next(iter(cfg.talker.spk_id), "")).strip().lower() or None
    if speaker is not None and speaker not in cfg.talker.spk_id:
        raise OptionError(name("speaker"), f"unknown speaker {opts.speaker!r}",
                          hint=f"speakers: {', '.join(cfg.speakers)}")
    language = opts.language.lower()
    if language not in cfg.languages:  # as the official package: auto and the languages, not the dialects
        raise OptionError(name("language"), f"unknown language {opts.language!r}",
                          hint=f"languages: {', '.join(cfg.languages)}")
    if opts.text_layout not in TEXT_LAYOUT_CHOICES:
        raise OptionError(name("text_layout"), f"unknown text layout {opts.text_layout!r}",
                          hint=f"use one of {', '.join(TEXT_LAYOUT_CHOICES)}")
    _check_sampling("talker", opts.talker, name)
    _check_sampling("code-predictor", opts.predictor, name)
    if opts.mode not in MODES:
        hint = "auto is chosen before synthesis (leapvox.models.auto.choose); " if opts.mode == AUTO else ""
        raise OptionError(name("mode"), f"unknown decoding mode {opts.mode!r}",
                          hint=f"{hint}this build offers: {', '.join(MODES)}")
    return replace(opts, speaker=speaker, language=language, instruct=opts.instruct or None)
