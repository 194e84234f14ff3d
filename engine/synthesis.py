"""Text -> codes -> waveform for one utterance, composed from the prompt, decoding loop and codec."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import TTSConfig
from .generate import DecodeStats, generate_frames
from .options import SynthesisOptions, guard_frames, validate
from .prompt import build_prompt, wrap_instruct, wrap_text
from .spec import SpecDecoder
from .talker import TTSModel
from .windowed import generate_frames_windowed


@dataclass
class Synthesis:
    codes: torch.Tensor  # [F, 16] int64
    audio: np.ndarray  # [F * samples_per_frame] float32 in [-1, 1]
    sample_rate: int
    stats: DecodeStats
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def realtime_factor(self) -> float:
        """xRT: audio seconds per wall second (bigger is faster)."""
        return self.duration_s / self.elapsed_s if self.elapsed_s > 0 else float("inf")


# The frame loop of each decoding mode in engine.modes.MODES; a new mode adds its line here.
FRAME_LOOPS = {"ar": generate_frames, "spec": generate_frames, "windowed": generate_frames_windowed}


def make_generator(seed: int | None) -> torch.Generator:
    """CPU generator: seeded like `torch.manual_seed(seed)`, or from fresh entropy when seed is None."""
    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


class Synthesizer:
    """Holds a loaded model (talker + code predictor), its codec decoder and its text tokenizer."""

    def __init__(
        self,
        tts: TTSModel,
        codec,
        cfg: TTSConfig,
        tokenize: Callable[[str], list[int]],
        sample_rate: int,
        spec: SpecDecoder | None = None,
        frontend: Callable[[str], str] | None = None,
    ):
        self.tts, self.codec, self.cfg, self.tokenize, self.sample_rate = tts, codec, cfg, tokenize, sample_rate
        self.spec = spec or SpecDecoder()  # spec mode's draft tree and offsets (None offsets: zero offsets)
        self._said_zero_offsets = False
        self._said_window_approx = False
        self.backend = None  # what runs the networks: None = the torch engine; coreml_runtime.CoreMLBackend (ane)
        self.frontend = frontend  # text -> model text (e.g. phonemes) before the prompt template, or None

    def text_ids(self, text: str) -> list[int]:
        """Token ids of the wrapped prompt text (after the model's front end, if it has one)."""
        return self.tokenize(wrap_text(self.frontend(text) if self.frontend else text))

    def generate_codes(self, text: str, opts: SynthesisOptions) -> tuple[torch.Tensor, DecodeStats, list[str]]:
        """Codes [F, 16] for `text`; also the decoding counters and any warnings for the user."""
        stats, warnings = DecodeStats(), []
        frames = list(self.frames(text, opts, stats, warnings))
        codes = torch.stack(frames) if frames else torch.zeros((0, 16), dtype=torch.long)
        return codes, stats, warnings

    def frames(
        self,
        text: str,
        opts: SynthesisOptions,
        stats: DecodeStats,
        warnings: list[str],
        generator: torch.Generator | None = None,
    ) -> Iterator[torch.Tensor]:
        """Frames [16] of one utterance as the mode's loop produces them: the one loop behind `generate_codes`
        and streaming. Fills `stats` and appends to `warnings` as it goes. `generator` continues a random stream
        (streaming several sentences); by default one is made from `opts.seed`."""
        opts = validate(opts, self.cfg)
        instruct_ids = None
        if opts.instruct and not self.cfg.supports_instruct:
            warnings.append("this model size ignores --instruct (only 1.7B models follow instructions)")
        elif opts.instruct:
            instruct_ids = self.tokenize(wrap_instruct(opts.instruct))
        ids = self.text_ids(text)
        talker = self.tts.talker
        prompt = build_prompt(talker, self.cfg, ids, opts.speaker, opts.language, opts.text_layout, instruct_ids)
        cap = opts.max_frames
        guard = guard_frames(prompt.n_text_tokens) if opts.runaway_guard else cap
        sampling = any((opts.talker.do_sample, opts.predictor.do_sample))
        gen = (generator or make_generator(opts.seed)) if sampling else None
        extra = {}
        if opts.mode == "spec":
            extra["spec"] = self.spec
            if self.spec.offsets is None and not self._said_zero_offsets:
                self._said_zero_offsets = True
                warnings.append("spec mode: no trained offsets for this model, drafting with the LM heads alone "
                                "(zero offsets; run leapvox train-offsets)")
        if opts.mode == "windowed" and not self._said_window_approx and opts.window != self.cfg.leapvox_window:
            self._said_window_approx = True
            adapted = self.cfg.leapvox_window
            warnings.append(
                f"windowed mode: this model was trained with full attention, so a {opts.window}-frame window is an "
                "approximation (exact only while it holds every frame; leapvox train-window adapts a model)"
                if adapted is None else
                f"windowed mode: this model was adapted to a {adapted}-frame window; {opts.window} frames is an "
                f"approximation (drop --window to use {adapted})"
            )
        if self.backend is not None:
            extra["backend"] = self.backend
        yield from FRAME_LOOPS[opts.mode](talker, prompt, opts, min(cap, guard), gen, stats, **extra)
        if stats.stop_reason == "max_frames" and stats.frames < min(cap, guard):  # the backend holds fewer frames
            warnings.append(f"stopped at {stats.frames} frames, all that the {self.backend.name} backend's exported "
                            "context holds after this prompt (export-coreml --context sets it)")
        elif stats.stop_reason == "max_frames" and guard < cap:
            stats.stop_reason = "guard"
            warnings.append(
                f"stopped at {guard} frames ({guard * 0.08:.1f} s), the runaway cap for {prompt.n_text_tokens} "
                "text tokens, without an end of speech (--no-guard lifts this cap)"
            )

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """Codes [F, 16] -> float32 waveform, with the reference 300/25-frame chunking."""
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.codec.chunked_decode(codes.T[None].to(self.codec_device))  # [1, 1, N]
        return wav.reshape(-1).float().cpu().numpy()

    @property
    def codec_device(self) -> torch.device:
        return next(self.codec.parameters()).device

    def synthesize(self, text: str, opts: SynthesisOptions) -> Synthesis:
        t0 = time.perf_counter()
        codes, stats, warnings = self.generate_codes(text, opts)
        t1 = time.perf_counter()
        audio = self.decode(codes)
        stats.codec_s += time.perf_counter() - t1
        return Synthesis(codes, audio, self.sample_rate, stats, warnings, time.perf_counter() - t0)
