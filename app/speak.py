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
from leapvox.engine.options import MODES

from .common import (
    EXIT_OK,
    UsageError,
    backend_args,
    load,
    model_args,
    precheck_speak,
    quiet_or,
    read_text,
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
    s.add_argument("-o", "--output", help="WAV file to write; '-' writes the WAV to standard output")
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
    s.add_argument("--seed", type=int, help="random seed; the same seed gives the same codes as the official package")
    s.add_argument("--temperature", type=float, help="sampling temperature for all codes (default 0.9)")
    s.add_argument("--top-k", type=int, help="keep the K most likely codes (default 50; 0 disables)")
    s.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0 = off)")
    s.add_argument("--repetition-penalty", type=float, help="penalty on repeated code-0 values (default 1.05)")
    s.add_argument("--greedy", action="store_true", help="argmax instead of sampling, for code 0 and codes 1..15")
    s.add_argument("--max-frames", type=int,
                   help="stop each sentence after N frames of 80 ms (the official max_new_tokens is N+1)")
    s.add_argument("--no-guard", action="store_true", help="disable the runaway cap derived from the text length")
    s.add_argument(
        "--text-layout", choices=["non-streaming", "streaming"], default="non-streaming",
        help="all text in the prompt (default, as the official package) or text rows riding on frames",
    )
    s.add_argument("--mode", choices=MODES, default="ar", help="decoding mode (default ar)")
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
    if not args.output and not args.play:
        raise UsageError("no output given", hint="add -o out.wav, -o - for standard output, or --play")
    if args.output and args.output != "-":
        target = Path(args.output).expanduser()
        if not target.parent.is_dir():
            raise UsageError(f"cannot write {args.output}: its folder does not exist")
        if target.is_dir():
            raise UsageError(f"cannot write {args.output}: it is a folder", hint="give a file name, e.g. out.wav")


# errno name -> what to do about it, for an output that cannot be written
_ELSEWHERE = "write somewhere else with -o"
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


def write_error(args, e: OSError) -> LeapvoxError:
    """An OSError of the output as one line with a hint (exit 1), instead of an internal error."""
    dest = "standard output" if args.output == "-" else args.output
    return LeapvoxError(f"cannot write {dest}: {e.strerror or e}", hint=_WRITE_HINTS.get(e.errno))


def _open_writer(args):
    """The WAV writer of -o, made before the model loads so that an output that cannot be written fails first."""
    from leapvox.app.audio import WavWriter

    if not args.output:
        return None
    out = sys.stdout.buffer if args.output == "-" else Path(args.output).expanduser()
    try:
        return WavWriter(out, None)
    except OSError as e:
        raise write_error(args, e) from None


def _open_player(args, sample_rate: int):
    from leapvox.app.playback import AudioUnavailable, Player, resolve_device

    try:
        return Player(sample_rate, resolve_device(args.device)).start()
    except AudioUnavailable as e:
        if not args.output:
            raise
        say(f"warning: cannot play: {e} (writing {args.output} only)")
        return None


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
    nothing, and every codec call has a fixed cost (a 1-frame call takes about 4 frames' time on the 0.6B codec)."""
    if args.play or args.output == "-" or not args.output or not getattr(model.codec, "streams_exactly", False):
        return {}
    from leapvox.engine.streaming import MAX_CHUNK_FRAMES

    return {"first_chunk": MAX_CHUNK_FRAMES}


def cmd_speak(args) -> int:
    text = read_text(args)
    _check_output(args)
    precheck_speak(args)  # a bad --temperature, --speaker or --language: one line now, not after the load
    ref_wav = _reference(args)  # a bad clip: one line now, not after the load
    writer = _open_writer(args)
    player, codes, stats = None, [], None
    progress = Progress(False)
    try:
        model = load(args, pull=True, say=quiet_or(args))
        opts = speak_options(args, model.defaults)
        voice = _voice(args, model, ref_wav)
        player = _open_player(args, model.sample_rate) if args.play else None
        progress = Progress(sys.stderr.isatty() and not args.quiet and player is None)
        if writer is not None:
            _output(args, writer.start, model.sample_rate)
        for chunk in model.synthesizer().stream(text, opts, voice=voice, **_chunking(args, model)):
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
    quiet_or(args, say)(_summary(args, stats, player))
    return EXIT_OK


def _reference(args):
    """--ref-audio's clip, read and prepared (app.voices.read_reference), or None."""
    if getattr(args, "ref_audio", None) is None:
        return None
    from leapvox.app.voices import read_reference

    return read_reference(args.ref_audio)


def _voice(args, model, ref_wav):
    """The cloned voice of --voice (saved) or --ref-audio (encoded now), or None."""
    if getattr(args, "voice", None):
        from leapvox.models.voices import load_voice, model_key

        return load_voice(model_key(model.path), args.voice, model.config.talker.hidden_size)
    if ref_wav is not None:
        return model.clone(ref_wav, " ".join(args.ref_text.split()) if args.ref_text else None)
    return None


def _write_codes(path: Path, codes: list) -> None:
    import json

    import torch

    from leapvox.models.files import write_text_atomic

    write_text_atomic(path, json.dumps(torch.cat(codes).tolist()))


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
