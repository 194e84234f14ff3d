"""`leapvox voices add/list/show/rm`: cloned voices of a Base model, encoded once and saved (models/voices.py); and
reading a reference clip for `voices add` and `speak --ref-audio`.

A reference clip: any file soundfile reads (wav, flac, ogg, mp3), any sample rate (resampled to 24 kHz by soxr, the
resampler the official package uses through librosa), stereo mixed down, leading and trailing silence trimmed, the
level normalised, then 0.5 s of silence appended (without it the clip's last phoneme bleeds into the speech).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import EXIT_OK, UsageError, model_args, quiet_or, require_model, say, tell

SAMPLE_RATE = 24000
MIN_S, MAX_S = 1.0, 30.0  # speech in a clip after trimming
TAIL_S = 0.5  # silence appended
SILENT_DBFS = -60.0  # a clip whose loudest 20 ms is below this is silence
TRIM_DB = 40.0  # trimmed: leading/trailing 20 ms frames this far below the loudest frame
TARGET_DBFS, PEAK = -20.0, 0.95  # level: RMS of the speech, but no sample above PEAK


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


def read_reference(path: Path):
    """The clip at `path` prepared for cloning: float32 torch tensor [N] at 24 kHz (see the module docstring).
    A UsageError (exit 2) for an unreadable, empty, silent, too short or too long clip."""
    import numpy as np
    import soundfile as sf
    import torch

    if not path.is_file():
        raise UsageError(f"cannot read the reference clip {path}: " + ("it is a folder" if path.is_dir() else
                         "no such file"))
    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)  # [n, channels]
    except Exception as e:  # soundfile raises LibsndfileError / RuntimeError / TypeError for what it cannot read
        raise UsageError(f"cannot read the reference clip {path}: {str(e).splitlines()[0] if str(e) else e}",
                         hint="give a wav, flac, ogg or mp3 file") from None
    if audio.shape[0] == 0:
        raise UsageError(f"the reference clip {path} is empty", hint=f"give {MIN_S:g}-{MAX_S:g} s of speech")
    wav = audio.mean(axis=1) if audio.shape[1] > 1 else audio[:, 0]
    wav = np.nan_to_num(wav.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if sr != SAMPLE_RATE:
        wav = resample(wav, sr, SAMPLE_RATE)
    wav = trim_and_level(wav, path)
    wav = np.concatenate([wav, np.zeros(int(TAIL_S * SAMPLE_RATE))])
    return torch.from_numpy(wav.astype(np.float32))


def resample(wav, sr_in: int, sr_out: int):
    """soxr's high-quality setting (what librosa.resample, and so the official package, uses by default)."""
    import soxr

    return soxr.resample(wav, sr_in, sr_out, quality="HQ")


def trim_and_level(wav, path: Path):
    """Silence check, leading/trailing silence trimmed (20 ms frames), duration check, level normalised."""
    import numpy as np

    hop = SAMPLE_RATE // 50
    n = max(1, len(wav) // hop)
    frames = np.pad(wav, (0, n * hop - len(wav)))[: n * hop].reshape(n, hop) if len(wav) >= hop else wav[None]
    db = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-20)
    if db.max() < SILENT_DBFS:
        raise UsageError(f"the reference clip {path} is silent (loudest 20 ms at {db.max():.0f} dBFS)",
                         hint="record a few seconds of clear speech")
    loud = np.flatnonzero(db > db.max() - TRIM_DB)
    wav = wav[loud[0] * hop : min(len(wav), (loud[-1] + 1) * hop)]
    seconds = len(wav) / SAMPLE_RATE
    if not MIN_S <= seconds <= MAX_S:
        raise UsageError(f"the reference clip {path} holds {seconds:.1f} s of sound; it must hold {MIN_S:g} to "
                         f"{MAX_S:g} s", hint="about 3-10 s of clear speech clones best")
    rms = float(np.sqrt(np.mean(wav**2)))
    gain = min(10 ** (TARGET_DBFS / 20) / max(rms, 1e-9), PEAK / max(float(np.abs(wav).max()), 1e-9))
    return wav * gain


# ---- the commands -------------------------------------------------------------------------------------------------


def _base_folder(args) -> Path:
    """The model folder of --model, checked to be a Base model before anything slow."""
    from leapvox.models.checkpoint import load_config
    from leapvox.models.hub import resolve_model_path

    folder = resolve_model_path(require_model(args), pull=getattr(args, "pull", False))
    kind = load_config(folder).tts_model_type
    if kind != "base":
        raise UsageError(f"{args.model} is a {kind} model; saved voices belong to Base models",
                         hint="use --model qwen3-tts-0.6b-base (or another Base model)")
    return folder


def cmd_add(args) -> int:
    from leapvox.models.voices import check_name, model_key, save_voice, voices_dir

    check_name(args.name)
    text = " ".join(args.text.split()) if args.text is not None else None
    if args.text is not None and not text:
        raise UsageError("--text is empty", hint="give what the clip says, or leave --text out (x-vector only)")
    wav = read_reference(args.clip)  # bad audio: one line, before the model loads
    args.pull = True
    folder = _base_folder(args)
    key = model_key(folder)
    if (voices_dir(key) / f"{args.name}.safetensors").exists() and not args.force:
        raise UsageError(f"a voice named {args.name!r} exists for this model", hint="use --force to replace it")
    from leapvox.models.load import load_model

    model = load_model(folder, args.weights, say=quiet_or(args))
    voice = model.clone(wav, text)
    path = save_voice(key, args.name, voice, source=args.clip.name, overwrite=args.force)
    mode = f"ICL, {voice.ref_codes.shape[0]} frames of codes" if voice.icl else "x-vector only"
    quiet_or(args)(f"saved voice {args.name!r} ({mode}, {len(wav) / SAMPLE_RATE:.1f} s clip) to {path}")
    return EXIT_OK


def cmd_list(args) -> int:
    from leapvox.models.voices import list_voices, model_key

    voices = list_voices(model_key(_base_folder(args)))
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
    print(f"name: {v.name}\nmode: {v.mode}\nreference: {v.seconds:.2f} s ({v.frames} frames)\n"
          f"transcript: {v.ref_text or '-'}\nx-vector: {v.hidden} values\nsource: {v.source or '-'}\n"
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
    return model_key(_base_folder(args))
