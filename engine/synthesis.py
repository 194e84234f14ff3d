"""Text -> audio: the one synthesis path. `Synthesizer.stream` speaks a text sentence by sentence as a stream of
`SpeechChunk`s; `synthesize` is that stream joined. Everything that speaks (speak -o, --play, the TUI, compare)
consumes the stream, so they cannot disagree.

Layering: `decode_frames` (one utterance: the mode's strategies chosen once, then the mode-agnostic frame loop)
-> `Synthesizer.frames` (prompt, guard, warnings) -> `Synthesizer.stream` (sentences, streaming codec,
crossfades, one stats record) -> `Synthesizer.synthesize` (the stream, joined).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from .backend import TorchBackend
from .config import TTSConfig
from .decode import ArCodes, DecodeStats, SpecCodes, frame_loop
from .memory import return_freed_memory
from .options import OptionError, SynthesisOptions, check_text, guard_frames, validate
from .prompt import ClonedVoice, Prompt, build_clone_prompt, build_prompt, wrap_instruct, wrap_ref_text, wrap_text
from .spec import DraftPlan
from .streaming import CROSSFADE_S, FIRST_CHUNK_FRAMES, MAX_CHUNK_FRAMES, Joiner, SpeechChunk, StreamStats, Tally
from .talker import Talker, TTSModel
from .text import split_sentences, uncovered_script


@dataclass
class Synthesis:
    codes: torch.Tensor  # [F, 16] int64
    audio: np.ndarray  # [F * samples_per_frame] float32 in [-1, 1]
    sample_rate: int
    stats: StreamStats
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def realtime_factor(self) -> float:
        """xRT: audio seconds per wall second (bigger is faster)."""
        return self.duration_s / self.elapsed_s if self.elapsed_s > 0 else float("inf")


def make_generator(seed: int | None) -> torch.Generator:
    """CPU generator: seeded like `torch.manual_seed(seed)`, or from fresh entropy when seed is None."""
    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def decode_frames(
    backend,
    talker: Talker,
    prompt: Prompt,
    opts: SynthesisOptions,
    max_frames: int,
    generator: torch.Generator | None,
    stats: DecodeStats,
    plan: DraftPlan | None = None,
) -> Iterator[torch.Tensor]:
    """Frames [16] of one utterance. The mode is decided here, once, by plain ifs: the talker cache (a ring of
    `opts.window` frames for windowed, else full) and the predictor strategy (spec's verify calls over `plan`, else
    one call per code); then the mode-agnostic frame loop runs over them."""
    window = opts.window if opts.mode == "windowed" else None
    cap = backend.setup(prompt.embeds.shape[1], max_frames, window)  # a backend may hold fewer frames
    if opts.mode == "spec":
        codes = SpecCodes(backend, plan or DraftPlan())
        stats.spec = codes.stats
    else:
        codes = ArCodes(backend)
    yield from frame_loop(backend, codes, talker, prompt, opts, cap, generator, stats)


class Synthesizer:
    """A loaded model (talker + code predictor), its codec decoder, its text tokenizer, spec mode's draft plan and
    the backend that runs the networks (default: the torch engine)."""

    def __init__(
        self,
        tts: TTSModel,
        codec,
        cfg: TTSConfig,
        tokenize: Callable[[str], list[int]],
        sample_rate: int,
        plan: DraftPlan | None = None,
        frontend: Callable[[str], str] | None = None,
        backend=None,
    ):
        self.tts, self.codec, self.cfg, self.tokenize, self.sample_rate = tts, codec, cfg, tokenize, sample_rate
        self.plan = plan or DraftPlan()  # spec mode's draft tree and offsets (None offsets: zero offsets)
        self.frontend = frontend  # text -> model text (e.g. phonemes) before the prompt template, or None
        # what runs the networks: the torch engine, or coreml_runtime.CoreMLBackend (ane)
        self.backend = backend or TorchBackend(tts.talker)
        self._said: set[str] = set()  # once-per-synthesizer warnings already given

    def text_ids(self, text: str) -> list[int]:
        """Token ids of the wrapped prompt text (after the model's front end, if it has one)."""
        return self.tokenize(wrap_text(self.frontend(text) if self.frontend else text))

    def generate_codes(
        self, text: str, opts: SynthesisOptions, voice: ClonedVoice | None = None
    ) -> tuple[torch.Tensor, DecodeStats, list[str]]:
        """Codes [F, 16] of `text` as ONE utterance (no sentence split, as the official package); also the
        decoding counters and any warnings for the user. `voice`: a cloned voice (Base models)."""
        stats, warnings = DecodeStats(), []
        frames = list(self.frames(text, opts, stats, warnings, voice=voice))
        codes = torch.stack(frames) if frames else torch.zeros((0, 16), dtype=torch.long)
        return codes, stats, warnings

    def _warn_once(self, key: str, warnings: list[str], message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            warnings.append(message)

    def _mode_warnings(self, opts: SynthesisOptions, warnings: list[str]) -> None:
        if opts.mode == "spec" and self.plan.offsets is None:
            self._warn_once("zero-offsets", warnings, "spec mode: no trained offsets for this model, drafting with "
                            "the LM heads alone (zero offsets; run leapvox train-offsets)")
        adapted = self.cfg.leapvox_window
        if opts.mode == "windowed" and opts.window != adapted:
            self._warn_once("window", warnings, (
                f"windowed mode: this model was trained with full attention, so a {opts.window}-frame window is an "
                "approximation (exact only while it holds every frame; leapvox train-window adapts a model)"
                if adapted is None else
                f"windowed mode: this model was adapted to a {adapted}-frame window; {opts.window} frames is an "
                f"approximation (drop --window to use {adapted})"
            ))

    def frames(
        self,
        text: str,
        opts: SynthesisOptions,
        stats: DecodeStats,
        warnings: list[str],
        generator: torch.Generator | None = None,
        voice: ClonedVoice | None = None,
    ) -> Iterator[torch.Tensor]:
        """Frames [16] of one utterance as the mode's loop produces them: the one loop behind `generate_codes`
        and the stream. Fills `stats` and appends to `warnings` as it goes. `generator` continues a random stream
        (several sentences); by default one is made from `opts.seed`. `voice`: the cloned voice a Base model
        speaks in (it needs one; other model types take none)."""
        opts = validate(opts, self.cfg)
        prompt = self.prompt(text, opts, warnings, voice)
        talker = self.tts.talker
        cap = opts.max_frames
        per_token = self.cfg.leapvox_guard_frames_per_token
        guard = guard_frames(prompt.n_text_tokens, per_token) if opts.runaway_guard else cap
        sampling = any((opts.talker.do_sample, opts.predictor.do_sample))
        gen = (generator or make_generator(opts.seed)) if sampling else None
        self._mode_warnings(opts, warnings)
        yield from decode_frames(self.backend, talker, prompt, opts, min(cap, guard), gen, stats, self.plan)
        if stats.stop_reason == "max_frames" and stats.frames < min(cap, guard):  # the backend holds fewer frames
            warnings.append(f"stopped at {stats.frames} frames, all that the {self.backend.name} backend's exported "
                            "context holds after this prompt (export-coreml --context sets it)")
        elif stats.stop_reason == "max_frames" and guard < cap:
            stats.stop_reason = "guard"
            warnings.append(
                f"stopped at {guard} frames ({guard * 0.08:.1f} s), the runaway cap for {prompt.n_text_tokens} "
                "text tokens, without an end of speech (--no-guard lifts this cap)"
            )

    def prompt(self, text: str, opts: SynthesisOptions, warnings: list[str], voice: ClonedVoice | None) -> Prompt:
        """The prefill rows of `text` for validated `opts`: CustomVoice / VoiceDesign (speaker, instruct) or a Base
        model's cloned voice."""
        check_voice(self.cfg, voice, opts.instruct)
        ids = self.text_ids(text)
        if voice is not None:
            ref_ids = self.tokenize(wrap_ref_text(voice.ref_text)) if voice.icl else None
            return build_clone_prompt(self.tts.talker, self.cfg, ids, voice, opts.language, opts.text_layout, ref_ids)
        instruct_ids = None
        if opts.instruct and not self.cfg.supports_instruct:
            warnings.append("this model size ignores --instruct (only 1.7B models follow instructions)")
        elif opts.instruct:
            instruct_ids = self.tokenize(wrap_instruct(opts.instruct))
        return build_prompt(self.tts.talker, self.cfg, ids, opts.speaker, opts.language, opts.text_layout,
                            instruct_ids)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, ref_codes: torch.Tensor | None = None) -> np.ndarray:
        """Codes [F, 16] -> float32 waveform, with the reference 300/25-frame chunking. With `ref_codes` (an ICL
        voice) they are decoded in front of `codes` and their audio cut off where the official package cuts it
        (`icl_cut`: the frame boundary, or a sample before it)."""
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        ref = 0 if ref_codes is None else ref_codes.shape[0]
        if ref:
            codes = torch.cat([ref_codes.to(codes.device), codes])
        wav = self.codec.chunked_decode(codes.T[None].to(self.codec_device)).reshape(-1)  # [N]
        return wav[icl_cut(ref, codes.shape[0], wav.shape[0]) :].float().cpu().numpy()

    @property
    def samples_per_frame(self) -> int:
        cfg = getattr(self.codec, "config", None)
        return getattr(cfg, "samples_per_frame", None) or getattr(cfg, "hop_length", None) or 1920

    @property
    def codec_device(self) -> torch.device:
        return next(self.codec.parameters()).device

    def stream(
        self,
        text: str,
        opts: SynthesisOptions,
        *,
        split: bool = True,
        first_chunk: int = FIRST_CHUNK_FRAMES,
        max_chunk: int = MAX_CHUNK_FRAMES,
        crossfade_s: float = CROSSFADE_S,
        cancelled: Callable[[], bool] | None = None,
        voice: ClonedVoice | None = None,
        official_cut: bool = False,
    ) -> Iterator[SpeechChunk]:
        """Speak `text` as a stream of SpeechChunks, checking `cancelled()` after every frame.

        Sentences (text.split_sentences; `split=False`: the whole text as one) are spoken in order with one
        random stream, one speaker and one set of options; the runaway guard applies to each. Chunks grow from
        `first_chunk` to `max_chunk` frames. The codec decodes with the official 300/25 chunking, so for one
        sentence the concatenated audio equals `decode(generate_codes(...))` bit for bit. Memory stays bounded
        whatever the text's length: one sentence's frames at a time. The last chunk has `final=True`.

        `voice` (Base models): every sentence is spoken in that cloned voice; with an ICL voice the codec is primed
        with the reference codes first (their audio is not handed out), so the speech continues the clip's signal
        without a seam, as the official package decodes reference + output and cuts the reference off. That cut
        (`icl_cut`) can fall a sample before the frame boundary, depending on the sentence's frame count: with
        `official_cut` each sentence's audio is held until its last frame and then starts where the official cut
        falls (as `decode`); without it audio leaves as it is decoded, from the frame boundary."""
        opts = validate(opts, self.cfg)
        check_voice(self.cfg, voice, opts.instruct)
        check_text(text)  # empty, or nothing to say ("!!! ???")
        sentences = split_sentences(text) if split else [" ".join(text.split())]
        sr = self.sample_rate
        tally = Tally(opts.mode, sentences, codes_per_frame=self.cfg.talker.num_code_groups - 1)
        script = uncovered_script(text, self.cfg.languages)
        if script:
            name = {"CJK": "Han (CJK)"}.get(script, script.title())
            tally.warnings.append(f"the text is mostly in {name} script, which this model's languages "
                                  f"({', '.join(lang for lang in self.cfg.languages if lang != 'auto')}) do not "
                                  "cover: expect letter names or noise")
        sampling = opts.talker.do_sample or opts.predictor.do_sample
        generator = make_generator(opts.seed) if sampling else None
        codec = self.codec.stream(official_chunking=True)
        primed, ref_tail = primed_codec(codec, voice.ref_codes.T[None].to(self.codec_device)) if voice and voice.icl \
            else (None, None)
        held = [] if official_cut and primed is not None else None  # the sentence's audio, until its frame count
        joiner = Joiner(int(round(crossfade_s * sr)))
        size, stop = first_chunk, False

        def emit(frames: list[torch.Tensor], index: int) -> SpeechChunk:
            codes = torch.stack(frames) if frames else torch.zeros((0, 16), dtype=torch.long)
            wav = np.zeros(0, np.float32)
            if frames:
                t = time.perf_counter()
                wav = codec.push(codes.T[None].to(self.codec_device)).reshape(-1).float().cpu().numpy()  # [1920 f]
                return_freed_memory()  # the chunk's activations: not kept by the C heap for the next
                tally.current.codec_s += time.perf_counter() - t
                tally.sentence_samples += len(wav)
            if held is not None:
                held.append(wav)
                wav = wav[:0]
            return chunk(joiner.add(wav), codes, index)

        def official_start(index: int) -> SpeechChunk:  # the held sentence, from where the official cut falls
            ref, spf = voice.ref_codes.shape[0], len(ref_tail)
            total = ref + sum(map(len, held)) // spf
            lead = ref_tail[len(ref_tail) - (ref * spf - icl_cut(ref, total, total * spf)) :]  # 0 or 1 sample
            tally.sentence_samples += len(lead)
            audio = np.concatenate([lead, *held])
            held.clear()
            return chunk(joiner.add(audio), torch.zeros((0, 16), dtype=torch.long), index)

        def chunk(audio: np.ndarray, codes: torch.Tensor, index: int, final: bool = False) -> SpeechChunk:
            tally.audio_samples += len(audio)
            if len(audio) and tally.first_audio_s is None:
                tally.first_audio_s = time.perf_counter() - tally.t0
            return SpeechChunk(audio, sr, codes, index, tally.snapshot(sr), final)

        for index, sentence in enumerate(sentences):
            if primed is None:
                codec.reset()
            else:
                setattr_all(codec, primed)
            stats = tally.begin(index)
            frames = self.frames(sentence, opts, stats, tally.warnings, generator, voice)
            pending: list[torch.Tensor] = []
            try:
                for frame in frames:
                    pending.append(frame)
                    if cancelled is not None and cancelled():
                        stop = True
                        break
                    if len(pending) >= size:
                        yield emit(pending, index)
                        pending, size = [], min(2 * size, max_chunk)
            finally:
                frames.close()
            if pending or stop:
                yield emit(pending, index)
            if held:
                yield official_start(index)
            tally.finish("cancelled" if stop else "", tally.sentence_samples / sr)
            joiner.end_sentence()
            if stop:
                break
        yield chunk(joiner.flush(), torch.zeros((0, 16), dtype=torch.long), tally.sentence, final=True)

    def synthesize(self, text: str, opts: SynthesisOptions, **stream_args) -> Synthesis:
        """The stream of `text`, joined: codes, audio and the final stats record (an ICL voice's audio starts where
        the official package cuts: nobody waits for the first chunk)."""
        stream_args.setdefault("official_cut", True)
        audio, codes, stats = [], [], None
        for c in self.stream(text, opts, **stream_args):
            audio.append(c.audio)
            codes.append(c.codes)
            stats = c.stats
        return Synthesis(torch.cat(codes), np.concatenate(audio), self.sample_rate, stats, list(stats.warnings),
                         stats.elapsed_s)


def check_voice(cfg: TTSConfig, voice: ClonedVoice | None, instruct: str | None, name=lambda key: key) -> None:
    """A Base model speaks only in a cloned voice and takes no instruction; other model types take no cloned voice.
    `name` spells a field as the entry point does (options.check_options)."""
    if cfg.tts_model_type == "base":
        if voice is None:
            raise OptionError(name("voice"), "this Base model speaks in a cloned voice", hint="give a saved voice "
                              "(leapvox voices add) or a reference clip")
        if instruct:
            raise OptionError(name("instruct"), f"a Base model takes no {name('instruct')}", hint="style "
                              "instructions need a CustomVoice 1.7B or VoiceDesign model")
    elif voice is not None:
        raise OptionError(name("voice"), f"a {cfg.tts_model_type} model cannot speak in a cloned voice (that needs a "
                          "Base model)", hint="voice cloning needs a Base model, e.g. qwen3-tts-0.6b-base")


def icl_cut(ref_frames: int, total_frames: int, samples: int) -> int:
    """Where the official package cuts the reference's audio off an ICL decode of `total_frames` frames (`samples`
    samples): a floating-point proportion, which at some lengths falls one sample before the frame boundary."""
    return int(ref_frames / max(total_frames, 1) * samples)


def primed_codec(codec, ref: torch.Tensor) -> tuple[dict, np.ndarray]:
    """The state of `codec` (a CodecStream) after decoding the reference codes `ref` [1, 16, T] from a reset: taken
    once, restored before every sentence; and the last frame of the reference's audio (the rest is discarded)."""
    import copy

    codec.reset()
    wav = codec.push(ref).reshape(-1)
    keep = {id(m): m for m in codec.decoder.modules()}  # share the network, copy the state
    state = copy.deepcopy({k: v for k, v in vars(codec).items() if k != "decoder"}, keep)
    return state, wav[len(wav) - len(wav) // ref.shape[-1] :].float().cpu().numpy()


def setattr_all(obj, state: dict) -> None:
    """Restore a `primed_codec` state (a fresh copy each time: the stream then updates it)."""
    import copy

    keep = {id(m): m for m in obj.decoder.modules()}
    for k, v in copy.deepcopy(state, keep).items():
        setattr(obj, k, v)
