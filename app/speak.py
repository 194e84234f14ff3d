"""`leapvox speak`, `leapvox speakers`, `leapvox devices`. Data on stdout, messages on stderr.

`speak` has one path whatever the output: the model's synthesis stream (sentence by sentence, engine/synthesis.py)
goes to the speakers (--play), to a WAV file written as it arrives (-o FILE) or to standard output (-o -), in
bounded memory, so `-o` and `--play` of the same text and seed give the same samples."""

from __future__ import annotations

import argparse
import errno
import sys
import time
from pathlib import Path

from leapvox.engine.errors import LeapvoxError
from leapvox.engine.options import AUTO_LAYOUT, MODE_CHOICES, TEXT_LAYOUT_CHOICES

from .common import (
    DEFAULT_MODE,
    EXIT_OK,
    MODE_AUTO_HELP,
    UsageError,
    backend_args,
    check_speak,
    choose,
    load,
    model_args,
    open_model,
    quiet_or,
    read_text_stream,
    require_model,
    say,
    speak_options,
    tell,
)


def add_commands(sub) -> None:
    s = sub.add_parser(
        "speak",
        help="synthesise text to a WAV file, standard output or the speakers",
        description="Synthesise TEXT to a 24 kHz mono WAV file (or play it), sentence by sentence.",
        epilog='examples:\n  leapvox speak "Hello there." -o hello.wav\n'
        "  echo 'Hi.' | leapvox speak - -o - > hi.wav\n"
        "  leapvox speak -f story.txt -o story.wav --model qwen3-tts-0.6b\n"
        '  leapvox speak "Hello." --play\n'
        '  leapvox speak --voice me "Hello." -o x.wav --model qwen3-tts-0.6b-base   (see leapvox voices)\n'
        '  leapvox speak --instruct "A warm, low voice." "Hello." -o x.wav --model qwen3-tts-1.7b-voicedesign',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("text", nargs="?", help="text to speak; '-' reads standard input")
    s.add_argument("-f", "--file", type=Path, help="read the text from FILE")
    s.add_argument("-o", "--output", help="file to write: a WAV, or by its extension FLAC (.flac), MP3 (.mp3) or Ogg "
                   "Opus (.ogg, .opus); '-' writes a WAV to standard output (a pipe or file, not a terminal)")
    s.add_argument("--play", action="store_true", help="play through the speakers while synthesising (-o optional)")
    s.add_argument("--device", help="output device number or name for --play (see 'leapvox devices')")
    model_args(s)
    s.add_argument("--speaker", help="voice to use (see 'leapvox speakers'); default: the model's first")
    s.add_argument("--language", default="auto", help="language of the text, or 'auto' (default)")
    s.add_argument("--instruct", help="style instruction (1.7B CustomVoice models; 0.6B ignores it with a warning), "
                   "or the voice described in words (VoiceDesign models)")
    s.add_argument("--voice", help="Base models: a saved cloned voice (see 'leapvox voices')")
    s.add_argument("--ref-audio", type=Path, metavar="CLIP",
                   help="Base models: clone the voice of this clip (wav, flac, ogg, mp3; 1-30 s) for this run")
    s.add_argument("--ref-text", help="with --ref-audio: what the clip says (ICL, closest to the clip); without it "
                   "the voice is cloned from the speaker embedding alone")
    s.add_argument("--ref-clean", action="store_true", help="with --ref-audio: trim the clip's leading and trailing "
                   "silence (20 ms frames 40 dB below the loudest), level it to -20 dBFS RMS (peaks at most 0.95) and "
                   "append 0.5 s of silence before encoding; by default the clip is used as the official package uses "
                   "it: channels averaged, resampled to 24 kHz, nothing else")
    s.add_argument("--seed", type=int, help="random seed, 0..2^64-1 (default: a fresh one each run); the same seed "
                   "gives the same codes as the official package after torch.manual_seed(SEED)")
    s.add_argument("--temperature", type=float, help="sampling temperature for all codes (default 0.9)")
    s.add_argument("--top-k", type=int, help="keep the K most likely codes (default 50; 0 disables)")
    s.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0 = off)")
    s.add_argument("--repetition-penalty", type=float, help="penalty on repeated code-0 values (default 1.05)")
    s.add_argument("--greedy", action="store_true", help="argmax instead of sampling, for code 0 and codes 1..15")
    s.add_argument("--max-frames", type=int,
                   help="stop each sentence after N frames of 80 ms (the official max_new_tokens is N+1)")
    s.add_argument("--no-guard", action="store_true", help="disable the runaway cap derived from the text length")
    s.add_argument(
        "--text-layout", choices=TEXT_LAYOUT_CHOICES, default=AUTO_LAYOUT,
        help="non-streaming: all of a sentence's text in the prompt (the official package's default); streaming: "
        "text rows riding on frames, so a sentence can start before its end is written; auto (default): streaming "
        "for a sentence still being written when its turn comes (speak -, a FIFO), non-streaming for whole text",
    )
    s.add_argument("--mode", choices=MODE_CHOICES, default=DEFAULT_MODE,
                   help="decoding mode: ar (the reference: the official package's codes for a seed), spec (the "
                   "same distribution, faster where the model has trained offsets), windowed (bounded memory, an "
                   f"approximation), or {MODE_AUTO_HELP} (default {DEFAULT_MODE}; the summary line says what it "
                   "chose and why)")
    s.add_argument(
        "--window", type=int, metavar="W", help="windowed mode: frames the talker attends to besides the prompt "
        "(default 48); an approximation on a full-attention model until an adapted checkpoint exists"
    )
    s.add_argument("--codes", type=Path, help="also write the generated codes [frames x 16] as JSON to this file")
    backend_args(s)
    s.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    s.set_defaults(func=cmd_speak)

    k = sub.add_parser("speakers", help="list a model's speakers and languages")
    model_args(k)
    k.set_defaults(func=cmd_speakers)

    d = sub.add_parser("devices", help="list audio output devices (for --device)")
    d.set_defaults(func=cmd_devices)


class Progress:
    """One self-rewriting line on a terminal's stderr: sentences done, audio so far, xRT. Silent elsewhere."""

    EVERY_S = 0.5

    def __init__(self, enabled: bool):
        self.enabled, self.last, self.shown = enabled, 0.0, False

    def __call__(self, stats) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.EVERY_S:
            return
        self.last, self.shown = now, True
        sys.stderr.write(f"\rleapvox: {len(stats.stop_reasons)}/{stats.sentences} sentences done, "
                         f"{stats.audio_s:.1f} s of audio, xRT {stats.xrt:.2f} \x1b[K")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _check_output(args) -> None:
    """-o and --codes, before the model loads: a place that can be written (a file, a device, a FIFO), a format the
    extension names, neither the -f text file nor each other, and no audio into a terminal."""
    from leapvox.app.audio import file_format
    from leapvox.models.files import output_problem, path_kind, same_file

    if not args.output and not args.play:
        raise UsageError("no output given", hint="add -o out.wav, -o - for standard output, or --play")
    if args.output == "-" and sys.stdout.isatty():
        raise _terminal("standard output")
    paths = [(flag, Path(p).expanduser()) for flag, p in (("-o", args.output), ("--codes", args.codes))
             if p is not None and p != "-"]
    for flag, path in paths:
        problem = output_problem(path)
        if problem:
            raise UsageError(f"cannot write {path}: {problem}",
                             hint="give a file name, e.g. out.wav" if problem == "it is a folder" else None)
        if path_kind(path) not in ("new", "file"):
            continue  # a device or FIFO is written into, never replaced
        if args.file is not None and same_file(path, args.file):
            raise UsageError(f"{flag} {path} is the text file (-f): writing it would replace the text",
                             hint=f"give {flag} another file name")
        if flag == "--codes" and args.output not in (None, "-") and same_file(path, Path(args.output).expanduser()):
            raise UsageError(f"--codes {path} is the -o file", hint="give the codes another file name, e.g. codes.json")
    if args.output and args.output != "-":
        try:
            file_format(args.output)
        except ValueError as e:
            raise UsageError(f"cannot write {args.output}: {Path(args.output).suffix!r} is not an audio format "
                             "leapvox writes", hint=str(e)) from None


def _terminal(dest: str) -> UsageError:
    return UsageError(f"not writing audio into the terminal ({dest})",
                      hint="redirect it (-o - > out.wav), pipe it (-o - | aplay), or give a file name")


# errno name -> what to do about it, for an output that cannot be written
_ELSEWHERE = "write somewhere else with {flag}"
_WRITE_HINTS = {
    getattr(errno, name, None): hint for name, hint in (
        ("EROFS", f"the file system is read-only; {_ELSEWHERE}"),
        ("EACCES", f"no permission to write there; {_ELSEWHERE}"),
        ("EPERM", f"no permission to write there; {_ELSEWHERE}"),
        ("ENOSPC", f"the disk is full; free some space or {_ELSEWHERE}"),
        ("EDQUOT", f"the disk quota is used up; free some space or {_ELSEWHERE}"),
        ("EFBIG", f"the file is too large for this file system; {_ELSEWHERE}"),
    )
}
_WRITE_HINTS.pop(None, None)


def write_error(args, e: OSError, dest=None, flag: str = "-o") -> LeapvoxError:
    """An OSError of the output (or of `dest`, given with `flag`) as one line with a hint (exit 1), instead of an
    internal error."""
    from leapvox.models.files import path_kind

    dest = dest or ("standard output" if args.output == "-" else args.output)
    hint = _WRITE_HINTS.get(e.errno)
    if e.errno == errno.ENOSPC and dest != "standard output" and path_kind(dest) == "device":
        hint = f"the device is full; {_ELSEWHERE}"  # /dev/full, say
    return LeapvoxError(f"cannot write {dest}: {e.strerror or e}", hint=hint and hint.format(flag=flag))


def _open_writer(args):
    """The writer of -o, made (a temp file, a device or FIFO opened) before the model loads so that an output that
    cannot be written fails first; the format follows the file's extension (standard output: WAV)."""
    from leapvox.app.audio import WavWriter, file_format

    if not args.output:
        return None
    out = sys.stdout.buffer if args.output == "-" else Path(args.output).expanduser()
    try:
        writer = WavWriter(out, None, "wav" if args.output == "-" else file_format(args.output))
    except OSError as e:
        raise write_error(args, e) from None
    if writer.out.isatty():  # -o /dev/tty, -o /dev/stdout on a terminal
        writer.abort()
        raise _terminal(args.output)
    return writer


def _audio_device(args) -> tuple[int | None, bool]:
    """(--device's index, True) where --play can play, known before the model loads: no output device (exit 1) or
    a --device that names none (exit 2) is one line now; with -o as well, no sound is a warning and (None, False)."""
    from leapvox.app.playback import AudioUnavailable, check_device

    try:
        return check_device(args.device), True
    except AudioUnavailable as e:
        if not args.output:
            raise
        say(f"warning: cannot play: {e} (writing {args.output} only)")
        return None, False


def _open_player(args, sample_rate: int, device: int | None):
    from leapvox.app.playback import AudioUnavailable, Player

    try:
        return Player(sample_rate, device).start()
    except AudioUnavailable as e:  # the device refused the stream
        if not args.output:
            raise
        say(f"warning: cannot play: {e} (writing {args.output} only)")
        return None


def _check_codes(args) -> None:
    """--codes where a new file can be made (its folder writable), known before the model loads: the codes are
    written last, after the whole synthesis. A device or FIFO is opened when they are written."""
    import os
    import tempfile

    from leapvox.models.files import path_kind

    if args.codes is None or path_kind(Path(args.codes).expanduser()) not in ("new", "file"):
        return
    try:
        with tempfile.TemporaryFile(dir=Path(os.path.realpath(Path(args.codes).expanduser())).parent):
            pass
    except OSError as e:
        raise write_error(args, e, args.codes, "--codes") from None


def _output(args, fn, *a):
    """fn(*a) on the writer, its OSErrors reported as the output's (not, say, the model's files)."""
    try:
        return fn(*a)
    except BrokenPipeError:
        raise
    except OSError as e:  # cmd_speak aborts the writer: no temp file is left
        raise write_error(args, e) from None


def _chunking(args, model) -> dict:
    """Codec chunk sizes: the first chunk small (audio after one frame) where someone may be listening as it arrives
    (--play, -o -); into a file, the steady size from the start, when the codec's samples do not depend on the
    chunking (`streams_exactly`: Qwen's codec, not the demo's Griffin-Lim one): an early first chunk gains a file
    nothing, and every codec call has a fixed cost."""
    if args.play or args.output == "-" or not args.output or not model.codec.streams_exactly:
        return {}
    from leapvox.engine.streaming import MAX_CHUNK_FRAMES

    return {"first_chunk": MAX_CHUNK_FRAMES}


def cmd_speak(args) -> int:
    text, pieces = read_text_stream(args)  # pieces: text still arriving (a pipe, a FIFO), spoken as it comes
    _check_output(args)
    check_speak(args, text)  # "!!! ???", a bad --seed or --top-p: one line now, not after the load
    _check_codes(args)
    device, play = _audio_device(args) if args.play else (None, False)  # no sound here: one line now
    ref_wav = _reference(args)  # a bad clip: one line now, not after the load
    folder = open_model(args, pull=True, say=quiet_or(args))  # resolved once: its config.json read once
    choice = choose(args, folder)  # --mode auto, --weights auto: by the tune profile, once, before the load
    # validated once, before the load (a bad --speaker or --language, --voice on a model that takes none)
    opts = speak_options(args, folder, args.voice if args.voice else ref_wav, choice)
    voice = _saved_voice(args, folder)
    writer = _open_writer(args)
    player, codes, stats = None, [], None
    progress = Progress(False)
    try:
        model = load(args, folder, say=quiet_or(args), weights=choice.weights)
        if ref_wav is not None:  # encoded now, with the model's encoders
            voice = model.clone(ref_wav, " ".join(args.ref_text.split()) if args.ref_text else None)
        player = _open_player(args, model.sample_rate, device) if play else None
        progress = Progress(sys.stderr.isatty() and not args.quiet and player is None)
        if writer is not None:
            _output(args, writer.start, model.sample_rate)
        synth, how = model.synthesizer(), dict(voice=voice, official_cut=not args.play, **_chunking(args, model))
        for chunk in synth.stream(text, opts, **how) if pieces is None else synth.stream_text(pieces, opts, **how):
            if player is not None:
                player.feed(chunk.audio, chunk.stats.xrt, chunk.stats.est_remaining_s)
            if writer is not None:
                _output(args, writer.write, chunk.audio)
            if args.codes:
                codes.append(chunk.codes)
            stats = chunk.stats
            progress(stats)
        progress.clear()
        if player is not None:
            player.end()
            player.wait()
        if writer is not None:
            _output(args, writer.close)
    except BaseException:
        progress.clear()
        if writer is not None:
            writer.abort()
        raise
    finally:
        if player is not None:
            player.close()
    for w in stats.warnings:
        say(f"warning: {w}")
    if args.codes:
        _write_codes(args.codes, codes)
    quiet_or(args, say)(_summary(args, stats, player) + (f"; {choice.line()}" if choice.line() else ""))
    return EXIT_OK


def _reference(args):
    """--ref-audio's clip, read as the official package reads it (with --ref-clean: also trimmed, levelled, padded;
    app.voices.read_reference), or None."""
    if getattr(args, "ref_audio", None) is None:
        if getattr(args, "ref_clean", False):
            raise UsageError("--ref-clean goes with --ref-audio", hint="a saved voice's clip was read when it was "
                             "added (leapvox voices add --ref-clean)")
        return None
    from leapvox.app.voices import read_reference

    return read_reference(args.ref_audio, getattr(args, "ref_clean", False))


def _saved_voice(args, folder):
    """The saved voice --voice names (missing or damaged: one line before the load), or None."""
    if not args.voice:
        return None
    from leapvox.models.voices import load_voice, model_key

    return load_voice(model_key(folder.path), args.voice, folder.config.talker.hidden_size)


def _write_codes(path: Path, codes: list) -> None:
    import json

    import torch

    from leapvox.models.files import write_text_atomic

    try:
        write_text_atomic(path, json.dumps(torch.cat(codes).tolist()))
    except OSError as e:
        raise write_error(None, e, path, "--codes") from None


def _summary(args, s, player) -> str:
    if args.play:
        played = f", {player.stats.underruns} underruns (pre-buffer {player.stats.prebuffer_s:.2f} s)" if player else ""
        return (f"leapvox: {'played' if player else 'synthesised'} {s.audio_s:.2f} s of audio, {s.sentences} "
                f"sentence(s), {s.frames} frames, {s.elapsed_s:.2f} s, xRT {s.xrt:.2f}, first audio "
                f"{s.first_audio_s or 0:.2f} s{played}")
    dest = "standard output" if args.output == "-" else args.output
    return (f"wrote {dest}: {s.audio_s:.2f} s of audio, {s.sentences} sentence(s), {s.frames} frames "
            f"({s.stop_reason}), {s.elapsed_s:.2f} s, xRT {s.xrt:.2f}")


def cmd_speakers(args) -> int:
    from leapvox.models.checkpoint import load_config
    from leapvox.models.hub import resolve_model_path

    folder = resolve_model_path(require_model(args), pull=False)
    cfg = load_config(folder)
    tc = cfg.talker
    print("speakers:")
    if cfg.tts_model_type == "base":
        from leapvox.models.voices import list_voices, model_key

        saved = list_voices(model_key(folder))
        print("  (a Base model speaks in cloned voices; saved ones: "
              f"{', '.join(v.name for v in saved) or 'none yet, see leapvox voices add'})")
    elif cfg.tts_model_type == "voice_design":
        print("  (none: a VoiceDesign model takes the voice described in words, --instruct \"...\")")
    for name in tc.spk_id:
        dialect = tc.spk_is_dialect.get(name)
        print(f"  {name}" + (f"  (speaks {dialect} for chinese/auto)" if dialect else ""))
    print("languages:")
    for lang in cfg.languages:
        print(f"  {lang}")
    instruct = "no (ignored by this model size)" if not cfg.supports_instruct else "yes"
    print(f"instruct: {'no (Base models take none)' if cfg.tts_model_type == 'base' else instruct}")
    return EXIT_OK


def cmd_devices(args) -> int:
    from leapvox.app.playback import output_devices

    devices = output_devices()
    if not devices:
        tell("no audio output devices (hint: on a headless machine write WAVs with -o)")
        return 1
    for d in devices:
        mark = "*" if d.is_default else " "
        print(f"{mark} {d.index:3d}  {d.name}  ({d.channels} ch, {d.default_samplerate:.0f} Hz)")
    return 0
