"""Text -> audio: the one synthesis path. `Synthesizer.stream` speaks a text sentence by sentence as a stream of
`SpeechChunk`s; `synthesize` is that stream joined. Everything that speaks (speak -o, --play, the TUI, compare)
consumes the stream, so they cannot disagree.

Layering: `decode_frames` (one utterance: the mode's strategies chosen once, then the mode-agnostic frame loop)
-> `Synthesizer.frames` (prompt, guard; a Step per frame, the last with the finish reason and warnings)
-> `Synthesizer.stream` (sentences, streaming codec, crossfades; a SpeechChunk per chunk with the stats so far;
   `stream_text`: the same loop over text arriving in pieces)
-> `Synthesizer.synthesize` (the stream, joined).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from leapvox.engine.backend import TorchBackend
from leapvox.engine.config import TTSConfig
from leapvox.engine.decode import ArCodes, DecodeStats, SpecCodes, frame_loop
from leapvox.engine.errors import InputError
from leapvox.engine.markup import Pause, Segment, segments
from leapvox.engine.memory import return_freed_memory
from leapvox.engine.nets.talker import Talker, TTSModel
from leapvox.engine.options import SynthesisOptions, check_text, guard_frames, layout_for, validate
from leapvox.engine.prompt import (
    ClonedVoice,
    Prompt,
    build_clone_prompt,
    build_prompt,
    wrap_instruct,
    wrap_ref_text,
    wrap_text,
)
from leapvox.engine.spec import DraftPlan
from leapvox.engine.streaming import (
    CROSSFADE_S,
    FIRST_CHUNK_FRAMES,
    MAX_CHUNK_FRAMES,
    DecoderStream,
    Joiner,
    SpeechChunk,
    StreamingCodec,
    StreamStats,
    total_estimate,
)
from leapvox.engine.text import estimate_audio_s, script_warnings
from leapvox.engine.textfeed import FLUSH, TextFeed


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


@dataclass(frozen=True)
class Step:
    """What `Synthesizer.frames` yields: a frame, or last, none and why the utterance stopped."""

    frame: torch.Tensor | None  # [16] codes 0..15; None on the last step
    stats: DecodeStats  # the utterance's counters so far (one record, advanced by the loop)
    warnings: tuple[str, ...] = ()  # the utterance's so far, for the user
    finish_reason: str | None = None  # the last step: eos, max_frames or guard (the stream adds cancelled)
    waits: bool = False  # the next frame waits for text still being written (hand out what is decoded)


class Synthesizer:
    """A loaded model (talker + code predictor), its codec decoder, its text tokenizer, spec mode's draft plan and
    the backend that runs the networks (default: the torch engine)."""

    def __init__(
        self,
        tts: TTSModel,
        codec: StreamingCodec,
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
        # what runs the networks: the torch engine, or coreml.runtime.CoreMLBackend (ane)
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
        steps = list(self.frames(text, opts, voice=voice))
        frames = [s.frame for s in steps[:-1]]
        codes = torch.stack(frames) if frames else torch.zeros((0, 16), dtype=torch.long)
        return codes, steps[-1].stats, list(steps[-1].warnings)

    def _mode_warnings(self, opts: SynthesisOptions) -> tuple[str, ...]:
        """What the mode's options approximate, each kind once per synthesizer."""
        found, adapted = {}, self.cfg.leapvox_window
        if opts.mode == "spec" and self.plan.offsets is None:
            found["zero-offsets"] = ("spec mode: no trained offsets for this model, drafting with the LM heads alone "
                                     "(zero offsets; run leapvox recipe offsets)")
        if opts.mode == "windowed" and opts.window != adapted:
            found["window"] = (
                f"windowed mode: this model was trained with full attention, so a {opts.window}-frame window is an "
                "approximation (exact only while it holds every frame; leapvox recipe window adapts a model)"
                if adapted is None else
                f"windowed mode: this model was adapted to a {adapted}-frame window; {opts.window} frames is an "
                f"approximation (drop --window to use {adapted})"
            )
        new = tuple(message for key, message in found.items() if key not in self._said)
        self._said.update(found)
        return new

    def frames(
        self,
        text: str | OpenSentence,
        opts: SynthesisOptions,
        generator: torch.Generator | None = None,
        voice: ClonedVoice | None = None,
    ) -> Iterator[Step]:
        """One utterance as the mode's loop produces it, the one loop behind `generate_codes` and the stream: a Step
        per frame, then a last Step without one that says why it stopped. `generator` continues a random stream
        (several sentences); by default one is made from `opts.seed`. `voice`: the cloned voice a Base model speaks
        in (it needs one; other model types take none). An `OpenSentence` (streaming layout) starts from the words
        written so far and takes in the rest as the steps reach it; the runaway guard then counts the tokens of the
        whole sentence, known once it is closed."""
        opts = validate(opts, self.cfg, voice)
        prompt, warnings = self.prompt(text, opts, voice)
        warnings += self._mode_warnings(opts)
        cap, stats, rate = opts.max_frames, DecodeStats(), self.cfg.leapvox_guard_frames_per_token
        capped = lambda: min(cap, guard_frames(prompt.n_text_tokens, rate)) if opts.runaway_guard else cap  # noqa: E731
        sampling = any((opts.talker.do_sample, opts.predictor.do_sample))
        gen = (generator or make_generator(opts.seed)) if sampling else None
        starved = text.starved if isinstance(text, OpenSentence) else lambda: False
        loop = decode_frames(self.backend, self.tts.talker, prompt, opts, cap if prompt.grow else capped(), gen, stats,
                             self.plan)
        with contextlib.closing(loop):
            for frame in loop:
                yield Step(frame, stats, warnings, waits=prompt.waits(stats.frames - 1) and starved())
                if prompt.grow is None and stats.frames >= capped():  # an open sentence's cap, known once closed
                    stats.stop_reason = "max_frames"
                    break
        most = capped()
        if stats.stop_reason == "max_frames" and stats.frames < most:  # the backend holds fewer frames
            warnings += (f"stopped at {stats.frames} frames, all that the {self.backend.name} backend's exported "
                         "context holds after this prompt (leapvox recipe coreml --context sets it)",)
        elif stats.stop_reason == "max_frames" and most < cap:
            stats.stop_reason = "guard"
            warnings += (f"stopped at {most} frames ({most * 0.08:.1f} s), the runaway cap for "
                         f"{prompt.n_text_tokens} text tokens, without an end of speech (--no-guard lifts this cap)",)
        yield Step(None, stats, warnings, stats.stop_reason)

    def prompt(self, text: str | OpenSentence, opts: SynthesisOptions,
               voice: ClonedVoice | None) -> tuple[Prompt, tuple[str, ...]]:
        """The prefill rows of `text` (or of an open sentence's start, the rest pulled as decoding needs it) for
        validated `opts`: CustomVoice / VoiceDesign (speaker, instruct) or a Base model's cloned voice; and any
        warnings for the user."""
        pull = text.pull if isinstance(text, OpenSentence) else None
        ids = text.start if pull else self.text_ids(text)
        if voice is not None:
            ref_ids = self.tokenize(wrap_ref_text(voice.ref_text)) if voice.icl else None
            return build_clone_prompt(self.tts.talker, self.cfg, ids, voice, opts.language, opts.text_layout,
                                      ref_ids, pull), ()
        instruct_ids, warnings = None, ()
        if opts.instruct and not self.cfg.supports_instruct:
            warnings = ("this model size ignores --instruct (only 1.7B models follow instructions)",)
        elif opts.instruct:
            instruct_ids = self.tokenize(wrap_instruct(opts.instruct))
        return build_prompt(self.tts.talker, self.cfg, ids, opts.speaker, opts.language, opts.text_layout,
                            instruct_ids, pull), warnings

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

        Sentences and pauses (markup.segments: a pause is silence, crossfaded in and out; `split=False`: the whole
        text as one sentence) are spoken in order with one random stream, one speaker and one set of options; the
        runaway guard applies to each. Chunks grow from `first_chunk` to `max_chunk` frames. The codec decodes with
        the official 300/25 chunking, so for one sentence the concatenated audio equals `decode(generate_codes(...))`
        bit for bit. Memory stays bounded
        whatever the text's length: one sentence's frames at a time. Every chunk carries the stats so far; the last
        one also the finish reason (`final`).

        `voice` (Base models): every sentence is spoken in that cloned voice; with an ICL voice the codec is primed
        with the reference codes first (their audio is not handed out), so the speech continues the clip's signal
        without a seam, as the official package decodes reference + output and cuts the reference off. That cut
        (`icl_cut`) can fall a sample before the frame boundary, depending on the sentence's frame count: with
        `official_cut` each sentence's audio is held until its last frame and then starts where the official cut
        falls (as `decode`); without it audio leaves as it is decoded, from the frame boundary."""
        opts = validate(opts, self.cfg, voice)
        check_text(text)  # empty, a malformed pause tag, or nothing to say ("!!! ???")
        said = segments(text) if split else [" ".join(text.split())]
        yield from self._speak(iter(said), said, opts, first_chunk=first_chunk, max_chunk=max_chunk,
                               crossfade_s=crossfade_s, cancelled=cancelled, voice=voice, official_cut=official_cut)

    def stream_text(self, pieces: Iterable[str | object], opts: SynthesisOptions,
                    **stream_args) -> Iterator[SpeechChunk]:
        """Speak text that arrives in pieces (a pipe, an LLM's tokens): `stream`'s chunks, each sentence spoken as
        soon as it is sure (textfeed.TextFeed: a sentence end and the next word, a paragraph break, a closed pause
        tag; a `textfeed.FLUSH` piece, the producer pausing, speaks the open sentence as it stands), pulling pieces
        only when the previous sentence is spoken. The same text given whole or in any pieces gives the same
        segments, so, flushes aside, the same samples as `stream(text)` for a seed. `pieces`: any iterable of str
        (and FLUSH), e.g. a `textfeed.TextPieces` that other threads (an event loop) put text into. The statistics'
        sentence count, audio estimate and script warnings cover the text arrived so far. Keywords: `stream`'s,
        `split` aside. A text without anything to say is an InputError once the pieces end.

        With the streaming text layout, or `auto` (options.layout_for: a sentence still being written when its
        turn comes is laid out streaming, a whole one non-streaming), and not for a model with a text front end
        (whose phonemes of a word depend on the words around it) nor an ICL voice (whose prompt holds the whole
        text), a sentence starts while it is still being written, once OPEN_LOOKAHEAD tokens of its sure start are
        there (`TextFeed.opening`), and its decoding waits for the next words rather than padding: the same codes as
        the whole sentence in the streaming layout, first audio before its end."""
        opts = validate(opts, self.cfg, stream_args.get("voice"))
        voice, arrived = stream_args.get("voice"), []
        reader = _Reader(pieces, arrived)
        early = layout_for(opts.text_layout, True) == "streaming" and self.frontend is None \
            and not (voice is not None and voice.icl)

        def pull() -> Iterator[Segment | OpenSentence]:
            while True:  # lazily: a piece is read when a sentence is wanted
                if reader.queue:
                    yield reader.queue.popleft()
                    continue
                if early and not reader.ready():  # all there is read: a sentence may begin
                    pauses, start = reader.feed.opening()
                    reader.add(pauses)  # sure now: a sentence follows
                    sentence = OpenSentence(reader, self.text_ids, start) if start and not pauses else None
                    if sentence and len(sentence.ids) >= OPEN_LOOKAHEAD:
                        yield sentence
                        sentence.finish()  # decoding may have ended (EOS) before its text did
                        continue
                    if pauses:
                        continue
                if not reader.read():
                    return

        yield from self._speak(pull(), arrived, opts, **stream_args)

    def _speak(
        self,
        segs: Iterator[Segment],
        arrived: list[Segment],
        opts: SynthesisOptions,
        *,
        first_chunk: int = FIRST_CHUNK_FRAMES,
        max_chunk: int = MAX_CHUNK_FRAMES,
        crossfade_s: float = CROSSFADE_S,
        cancelled: Callable[[], bool] | None = None,
        voice: ClonedVoice | None = None,
        official_cut: bool = False,
    ) -> Iterator[SpeechChunk]:
        """The one sentence loop behind `stream` and `stream_text`: `segs` (sentences and pauses, pulled one at a
        time) spoken in order, with one random stream and one set of options; `arrived`, the segments known so far
        (it may grow while `segs` is pulled), sizes the statistics."""
        sr, t0, spoken, finished = self.sample_rate, time.perf_counter(), 0.0, 0
        generator = make_generator(opts.seed) if opts.talker.do_sample or opts.predictor.do_sample else None
        codec = self.codec.stream(official_chunking=True)
        ref = self._prime(codec, voice) if voice is not None and voice.icl else None
        start, joiner, size = codec.state(), Joiner(int(round(crossfade_s * sr))), first_chunk
        per_frame, index, empty = self.cfg.talker.num_code_groups - 1, -1, torch.zeros((0, 16), dtype=torch.long)
        known, est, text_warnings = 0, [0.0], ()  # arrived[:known] are in `est` and the warnings
        done = stats = StreamStats(opts.mode)

        def learn(done: StreamStats) -> StreamStats:
            """New text: the estimate, the sentence count and the script warnings grow."""
            nonlocal known, text_warnings
            if known == len(arrived):
                return done
            for x in arrived[known:]:
                est.append(est[-1] + (x.seconds if isinstance(x, Pause) else estimate_audio_s(x)))
            known, sentences = len(arrived), [x for x in arrived if not isinstance(x, Pause)]
            new = tuple(w for w in script_warnings(" ".join(sentences), self.cfg.languages) if w not in text_warnings)
            text_warnings += new
            return replace(done, sentences=len(sentences), warnings=done.warnings + new)

        def total() -> float:  # a sentence still being written is in `est` once it is handed out
            return total_estimate(est + est[-1:] * (finished + 1 - len(est)), finished, spoken)

        for seg in segs:
            done = learn(done)
            if isinstance(seg, Pause):  # silence, joined as a sentence is (crossfaded: no click; the overlap of
                silence = np.zeros(int(round(seg.seconds * sr)) + joiner.n, np.float32)  # one join is added back)
                out, spoken, finished = joiner.add(silence), spoken + seg.seconds, finished + 1
                joiner.end_sentence()
                stats = done = done.handed_out(stats, len(out), sr, time.perf_counter() - t0, total())
                yield SpeechChunk(out, sr, empty, max(index, 0), stats)
                continue
            index += 1
            codec.restore(start)  # fresh, or primed with the voice's reference
            steps = self.frames(seg, opts, generator, voice)
            decoded = 0  # the sentence's samples
            for codes, audio, step, codec_s, grown in self._chunks(steps, codec, size, max_chunk, cancelled,
                                                                   ref if official_cut else None):
                out, decoded, size = joiner.add(audio), decoded + len(audio), grown  # chunks grow across sentences
                now = done.plus(step.stats, codec_s, per_frame, sentence=index + 1,
                                warnings=done.warnings + step.warnings)  # done: the finished sentences' totals
                stats = now.handed_out(stats, len(out), sr, time.perf_counter() - t0, total())
                if len(codes) or len(audio):  # else the last step, after a full chunk: its stats alone
                    yield SpeechChunk(out, sr, codes, index, stats)
            spoken, finished = spoken + decoded / sr, finished + 1
            done = replace(stats, stop_reasons=stats.stop_reasons + (step.finish_reason,))
            joiner.end_sentence()
            if step.finish_reason == "cancelled":
                break
        if index < 0:
            raise InputError("there is no text to speak", hint="give some words, e.g. leapvox speak \"Hello\"")
        out, done = joiner.flush(), learn(done)
        stats = done.handed_out(done, len(out), sr, time.perf_counter() - t0, total())
        yield SpeechChunk(out, sr, empty, index, stats, stats.stop_reason)

    def _prime(self, codec: DecoderStream, voice: ClonedVoice) -> tuple[int, np.ndarray]:
        """Decode an ICL voice's reference codes into `codec` (the speech then continues their signal); the reference's
        frames and the last frame of its audio (the rest is discarded)."""
        wav, _ = self._push(codec, voice.ref_codes)
        return voice.ref_codes.shape[0], wav[len(wav) - self.codec.samples_per_frame :]

    def _push(self, codec: DecoderStream, codes: torch.Tensor) -> tuple[np.ndarray, float]:
        """Codes [f, 16] through `codec`: the audio [f * samples_per_frame] and the seconds it took."""
        t = time.perf_counter()
        wav = codec.push(codes.T[None].to(self.codec_device)).reshape(-1).float().cpu().numpy()
        return_freed_memory()  # the chunk's activations: not kept by the C heap for the next
        return wav, time.perf_counter() - t

    def _chunks(
        self,
        steps: Iterator[Step],
        codec: DecoderStream,
        size: int,
        most: int,
        cancelled: Callable[[], bool] | None,
        ref: tuple[int, np.ndarray] | None,
    ) -> Iterator[tuple[torch.Tensor, np.ndarray, Step, float, int]]:
        """(codes [f, 16], audio, latest step, codec seconds so far) per chunk of one utterance: its frames in chunks
        growing from `size` to `most` (doubling after each full chunk; the next sentence goes on from the size
        yielded last), decoded through `codec`, and the last step (its chunk maybe empty). After the
        frame where `cancelled()` turns true the step says "cancelled". With `ref` (an ICL voice's reference frames
        and last frame of audio, `_prime`) the audio is held until the last frame and handed out, codes aside, from
        where the official cut falls."""
        pending, held, codec_s = [], [], 0.0
        with contextlib.closing(steps):
            for step in steps:
                if step.frame is not None:
                    pending.append(step.frame)
                    step = replace(step, finish_reason="cancelled") if cancelled and cancelled() else step
                if len(pending) < size and not step.finish_reason and not step.waits:
                    continue
                codes = torch.stack(pending) if pending else torch.zeros((0, 16), dtype=torch.long)
                audio, seconds = self._push(codec, codes) if pending else (np.zeros(0, np.float32), 0.0)
                codec_s, size = codec_s + seconds, min(2 * size, most) if len(pending) >= size else size
                pending = []
                if ref is not None:
                    held.append(audio)
                yield codes, audio[:0] if ref is not None else audio, step, codec_s, size
                if step.finish_reason:
                    break
        if held:
            (frames, tail), spf = ref, len(ref[1])
            total = frames + sum(map(len, held)) // spf
            lead = tail[spf - (frames * spf - icl_cut(frames, total, total * spf)) :]  # 0 or 1 samples
            yield torch.zeros((0, 16), dtype=torch.long), np.concatenate([lead, *held]), step, codec_s, size

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


# ---- text still being written -----------------------------------------------------------------------------------

OPEN_LOOKAHEAD = 4  # text tokens of a sentence's sure start before it is begun (the prompt's and 3 frames')


class _Reader:
    """stream_text's reading: pieces into a TextFeed one at a time; the segments handed out wait in `queue`."""

    def __init__(self, pieces: Iterable[str | object], arrived: list[Segment]):
        self.pieces, self.feed, self.queue, self.arrived = iter(pieces), TextFeed(), deque(), arrived
        self.ended, self._ready = False, getattr(pieces, "ready", None)  # textfeed.TextPieces can say

    def read(self) -> bool:
        """One piece into the feed (waiting for it); False when the pieces had already ended."""
        if self.ended:
            return False
        piece = next(self.pieces, None)
        self.ended = piece is None
        self.add(self.feed.close() if piece is None else self.feed.flush() if piece is FLUSH else self.feed.feed(piece))
        return True

    def add(self, segs: list[Segment]) -> None:
        self.arrived.extend(segs)
        self.queue.extend(segs)

    def ready(self) -> bool:
        """Whether another piece is there already (known only for pieces that can say: TextPieces)."""
        return not self.ended and self._ready is not None and self._ready()


class OpenSentence:
    """A sentence still being written (`Synthesizer.stream_text`, streaming layout): the wrapped ids of its sure
    start (`start`), its next sure token ids as decoding pulls them, then the sentence the feed hands out for it
    (`text`), whose ids extend those pulled (word-level BPE: `TextFeed.opening` gives whole words)."""

    def __init__(self, reader: _Reader, text_ids: Callable[[str], list[int]], start: str):
        self.reader, self.text_ids, self.text = reader, text_ids, None
        self.start = text_ids(start)
        self.ids = self.start[3:-5]  # the text tokens taken so far

    def pull(self) -> tuple[list[int], bool]:
        """The next text tokens (waiting for words if need be), and whether the sentence is closed."""
        r = self.reader
        while True:
            if r.queue:
                return self._close()
            ids = self._sure()
            if len(ids) > len(self.ids):
                new, self.ids = ids[len(self.ids) :], ids
                return new, False
            r.read()
            while not r.queue and r.ready():  # all that is there: one tokenization, not one a piece
                r.read()

    def _sure(self) -> list[int]:
        pauses, start = self.reader.feed.opening()
        assert not pauses, "a pause inside an open sentence"
        ids = self.text_ids(start)[3:-5] if start else []
        return ids if ids[: len(self.ids)] == self.ids else self.ids  # an overlong start stops growing

    def _close(self) -> tuple[list[int], bool]:
        self.text = self.reader.queue.popleft()
        ids = self.text_ids(self.text)[3:-5] if isinstance(self.text, str) else []
        if ids[: len(self.ids)] != self.ids:
            raise RuntimeError(f"the sentence handed out ({self.text!r}) does not begin with the words spoken")
        new, self.ids = ids[len(self.ids) :], ids
        return new, True

    def starved(self) -> bool:
        """Whether the next words are not there (pulling would wait for the producer)."""
        return not self.reader.queue and not self.reader.ready() and not self.reader.ended

    def finish(self) -> None:
        """Read on to the end of the sentence (decoding may have stopped before it)."""
        while self.text is None:
            self.pull()


def icl_cut(ref_frames: int, total_frames: int, samples: int) -> int:
    """Where the official package cuts the reference's audio off an ICL decode of `total_frames` frames (`samples`
    samples): a floating-point proportion, which at some lengths falls one sample before the frame boundary."""
    return int(ref_frames / max(total_frames, 1) * samples)
