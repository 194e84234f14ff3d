"""`leapvox voices add/list/show/rm`: cloned voices of a Base model, encoded once and saved (models/voices.py); and
reading a reference clip for `voices add` and `speak --ref-audio`.

A reference clip: any file soundfile reads (wav, flac, ogg, mp3), any sample rate, read as the official package
reads the same file (librosa.load, then librosa.resample), bit for bit: channels averaged, resampled to 24 kHz by
soxr's HQ setting on the float32 samples and cut or zero-padded to ceil(n * 24000 / rate) samples, nothing else.
--ref-clean also trims leading and trailing silence, levels the speech and appends 0.5 s of silence (leapvox's
earlier processing: the voice then differs from the official one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import EXIT_OK, UsageError, load, model_args, open_model, quiet_or, say, tell

SAMPLE_RATE = 24000
MIN_S, MAX_S = 1.0, 30.0  # the clip's length (with --ref-clean: of its sound, after trimming)
SILENT_DBFS = -60.0  # a clip whose loudest 20 ms is below this is silence
TAIL_S = 0.5  # --ref-clean: silence appended
TRIM_DB = 40.0  # --ref-clean: leading/trailing 20 ms frames this far below the loudest frame are trimmed
TARGET_DBFS, PEAK = -20.0, 0.95  # --ref-clean: level, the RMS of the speech, but no sample above PEAK
CLEAN_HELP = (f"trim the clip's leading and trailing silence (20 ms frames {TRIM_DB:g} dB below the loudest), level it "
              f"to {TARGET_DBFS:g} dBFS RMS (peaks at most {PEAK:g}) and append {TAIL_S:g} s of silence before "
              "encoding; by default the clip is used as the official package uses it: channels averaged, resampled to "
              "24 kHz, nothing else")


def add_commands(sub) -> None:
    v = sub.add_parser(
        "voices", help="cloned voices of a Base model: add from a clip, list, show, remove",
        description="Clone a voice from a few seconds of audio with a Base model, save it once, then speak with "
        "'leapvox speak --voice NAME'. With --text (what the clip says) the voice is an ICL prompt (the clip's codes "
        "and transcript lead the speech: closest to the clip); without it, x-vector only (speaker embedding alone).",
        epilog="examples:\n"
        "  leapvox voices add me clip.wav --text \"What the clip says.\" --model qwen3-tts-0.6b-base\n"
        "  leapvox voices list --model qwen3-tts-0.6b-base\n"
        "  leapvox speak --voice me \"Hello.\" -o hello.wav --model qwen3-tts-0.6b-base",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vs = v.add_subparsers(dest="voices_command", metavar="ACTION")
    a = vs.add_parser("add", help="encode a clip once and save it as a voice")
    a.add_argument("name", help="voice name: letters, digits, '-' and '_'")
    a.add_argument("clip", type=Path, help=f"reference audio (wav, flac, ogg, mp3), {MIN_S:g}-{MAX_S:g} s of speech")
    a.add_argument("--text", help="what the clip says (ICL voice, closest to the clip); omit for x-vector only")
    a.add_argument("--ref-clean", action="store_true", help=CLEAN_HELP)
    a.add_argument("--force", action="store_true", help="replace a voice of the same name")
    model_args(a)
    a.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    a.set_defaults(action=cmd_add)
    for name, help, func in (("list", "list the model's saved voices", cmd_list),
                             ("show", "details of one saved voice", cmd_show),
                             ("rm", "remove a saved voice", cmd_rm)):
        p = vs.add_parser(name, help=help)
        if name != "list":
            p.add_argument("name", help="voice name")
        p.add_argument("--model", default=_default_model(), help="the Base model the voice belongs to")
        if name == "rm":
            p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        p.set_defaults(action=func)
    v.set_defaults(func=lambda args: args.action(args) if getattr(args, "action", None) else _no_action(v))


def _default_model():
    from leapvox.models.catalog import default_model

    return default_model()


def _no_action(parser) -> int:
    parser.print_help(sys.stderr)
    raise UsageError("no action given", hint="leapvox voices add|list|show|rm")


# ---- reference audio ----------------------------------------------------------------------------------------------


def read_reference(path: Path, clean: bool = False):
    """The clip at `path` as the official package reads it: float32 torch tensor [N] at 24 kHz (module docstring);
    `clean`: --ref-clean's processing too. A UsageError (exit 2) for an unreadable, empty, non-finite, silent, too
    short or too long clip (without `clean`, the whole clip's length counts: it is all the model gets)."""
    import numpy as np
    import soundfile as sf
    import torch

    if not path.is_file():
        raise UsageError(f"cannot read the reference clip {path}: " + ("it is a folder" if path.is_dir() else
                         "no such file"))
    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=False)  # [n] or [n, channels]
    except Exception as e:  # soundfile raises LibsndfileError / RuntimeError / TypeError for what it cannot read
        raise UsageError(f"cannot read the reference clip {path}: {str(e).splitlines()[0] if str(e) else e}",
                         hint="give a wav, flac, ogg or mp3 file") from None
    if audio.ndim > 1:
        audio = np.mean(audio.T, axis=0)  # librosa.to_mono: the channels-first mean, summed in the same order
    if audio.shape[0] == 0:
        raise UsageError(f"the reference clip {path} is empty", hint=f"give {MIN_S:g}-{MAX_S:g} s of speech")
    if not np.isfinite(audio).all():
        raise UsageError(f"the reference clip {path} holds NaN or infinite samples",
                         hint="export it again, e.g. as 16-bit PCM")
    seconds = audio.shape[0] / sr
    if not clean and not MIN_S <= seconds <= MAX_S:
        raise UsageError(f"the reference clip {path} lasts {seconds:.1f} s; it must last {MIN_S:g} to {MAX_S:g} s",
                         hint="about 3-10 s of clear speech clones best" + (
                             "; --ref-clean trims leading and trailing silence" if seconds > MAX_S else ""))
    loudest = float(frame_dbfs(audio, max(1, sr // 50)).max())
    if loudest < SILENT_DBFS:
        raise UsageError(f"the reference clip {path} is silent (loudest 20 ms at {loudest:.0f} dBFS)",
                         hint="record a few seconds of clear speech")
    wav = resample(audio, sr, SAMPLE_RATE)
    if clean:
        wav = np.concatenate([trim_and_level(wav, path), np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32)])
    return torch.from_numpy(wav)


def resample(wav, sr_in: int, sr_out: int):
    """librosa.resample's default, which the official package calls: soxr's HQ setting on the float32 samples, the
    result cut or zero-padded to ceil(n * sr_out / sr_in) samples."""
    import numpy as np
    import soxr

    if sr_in == sr_out:
        return wav
    n = int(np.ceil(wav.shape[0] * (float(sr_out) / sr_in)))  # librosa's expression, rounding included
    out = soxr.resample(wav, sr_in, sr_out, quality="soxr_hq")[:n]  # float32 in, float32 out
    return np.pad(out, (0, n - out.shape[0]))


def frame_dbfs(wav, hop: int):
    """The level of each `hop`-sample frame in dBFS (the last frame zero-padded)."""
    import numpy as np

    n = -(-wav.shape[0] // hop)
    frames = np.pad(wav, (0, n * hop - wav.shape[0])).reshape(n, hop)
    return 10 * np.log10(np.mean(np.square(frames), axis=1, dtype=np.float64) + 1e-20)


def trim_and_level(wav, path: Path):
    """--ref-clean: leading/trailing silence trimmed (20 ms frames), duration check, level normalised; float32."""
    import numpy as np

    hop = SAMPLE_RATE // 50
    db = frame_dbfs(wav, hop)
    loud = np.flatnonzero(db > db.max() - TRIM_DB)
    wav = wav[loud[0] * hop : (loud[-1] + 1) * hop].astype(np.float64)
    seconds = len(wav) / SAMPLE_RATE
    if not MIN_S <= seconds <= MAX_S:
        raise UsageError(f"the reference clip {path} holds {seconds:.1f} s of sound; it must hold {MIN_S:g} to "
                         f"{MAX_S:g} s", hint="about 3-10 s of clear speech clones best")
    rms = float(np.sqrt(np.mean(wav**2)))
    gain = min(10 ** (TARGET_DBFS / 20) / max(rms, 1e-9), PEAK / max(float(np.abs(wav).max()), 1e-9))
    return (wav * gain).astype(np.float32)


# ---- the commands -------------------------------------------------------------------------------------------------


def _base_model(args):
    """--model resolved once (models.load.ModelFolder), checked to be a Base model before anything slow."""
    model = open_model(args, pull=getattr(args, "pull", False), say=quiet_or(args))
    kind = model.config.tts_model_type
    if kind != "base":
        raise UsageError(f"{args.model} is a {kind} model; saved voices belong to Base models",
                         hint="use --model qwen3-tts-0.6b-base (or another Base model)")
    return model


def cmd_add(args) -> int:
    from leapvox.models.voices import check_name, check_writable, model_key, save_voice, voices_dir

    check_name(args.name)
    text = " ".join(args.text.split()) if args.text is not None else None
    if args.text is not None and not text:
        raise UsageError("--text is empty", hint="give what the clip says, or leave --text out (x-vector only)")
    wav = read_reference(args.clip, args.ref_clean)  # bad audio: one line, before the model loads
    args.pull = True
    folder = _base_model(args)
    key = model_key(folder.path)
    if (voices_dir(key) / f"{args.name}.safetensors").exists() and not args.force:
        raise UsageError(f"a voice named {args.name!r} exists for this model", hint="use --force to replace it")
    check_writable(key)  # a read-only LEAPVOX_HOME: one line now, not after the encoding
    model = load(args, folder, say=quiet_or(args))
    voice = model.clone(wav, text)
    path = save_voice(key, args.name, voice, source=args.clip.name, overwrite=args.force, cleaned=args.ref_clean)
    mode = f"ICL, {voice.ref_codes.shape[0]} frames of codes" if voice.icl else "x-vector only"
    quiet_or(args)(f"saved voice {args.name!r} ({mode}, {len(wav) / SAMPLE_RATE:.1f} s clip) to {path}")
    return EXIT_OK


def cmd_list(args) -> int:
    from leapvox.models.voices import list_voices, model_key

    voices = list_voices(model_key(_base_model(args).path))
    if not voices:
        tell(f"no saved voices for {args.model} (hint: leapvox voices add NAME CLIP --model {args.model})")
        return EXIT_OK
    for v in voices:
        detail = "damaged (remove it with leapvox voices rm)" if v.mode == "damaged" else (
            f"ICL, {v.seconds:.1f} s: {v.ref_text!r}" if v.mode == "icl" else "x-vector only")
        print(f"{v.name}\t{detail}")
    return EXIT_OK


def cmd_show(args) -> int:
    from leapvox.models.voices import voice_info

    v = voice_info(_key(args), args.name)
    clip = "cleaned (--ref-clean: trimmed, levelled, silence appended)" if v.cleaned else "as the official package"
    print(f"name: {v.name}\nmode: {v.mode}\nreference: {v.seconds:.2f} s ({v.frames} frames)\n"
          f"transcript: {v.ref_text or '-'}\nx-vector: {v.hidden} values\nsource: {v.source or '-'}\nclip: {clip}\n"
          f"created: {v.created or '-'}\nfile: {v.path}")
    return EXIT_OK


def cmd_rm(args) -> int:
    from leapvox.models.voices import VoiceError, VoiceNotFound, remove_voice, voice_info

    key = _key(args)
    try:
        what = f"voice {args.name!r} ({voice_info(key, args.name).path})"
    except VoiceNotFound:
        raise
    except VoiceError:  # a damaged file can still be removed
        what = f"damaged voice {args.name!r}"
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"not removing {what} without confirmation", hint="pass --yes to remove without asking")
        print(f"Remove {what}? [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            say("nothing removed")
            return EXIT_OK
    remove_voice(key, args.name)
    say(f"leapvox: removed {what}")
    return EXIT_OK


def _key(args) -> str:
    from leapvox.models.voices import check_name, model_key

    check_name(args.name)
    return model_key(_base_model(args).path)
