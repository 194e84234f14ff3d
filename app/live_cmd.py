"""`leapvox tui`, `leapvox compare`, `leapvox devices`, and the `speak --play` path. Data on stdout, messages
on stderr. Only argparse at import time; torch, sounddevice and Textual load inside the commands."""

from __future__ import annotations

import sys
from pathlib import Path

from leapvox.engine.modes import MODES


def say(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def add_commands(sub) -> None:
    """Register `tui`, `compare` and `devices` on the top-level subparsers."""
    from leapvox.app.cli import _model_args

    t = sub.add_parser("tui", help="interactive window: type, speak, live speed readouts, history")
    _model_args(t)
    t.add_argument("--device", help="output device number or name (see 'leapvox devices')")
    t.add_argument("--save-dir", type=Path, default=Path("."), help="where 'Save WAV' writes (default: here)")
    _backend_args(t)
    t.set_defaults(func=cmd_tui)

    c = sub.add_parser(
        "compare",
        help="speak one text through every decoding mode; table, WAVs, JSON (and a plot)",
        description=f"The same text, seed and speaker through each available mode ({', '.join(MODES)}). Prints "
        "a table on stdout; writes MODE.wav, compare.json and (with matplotlib) compare.png into --out.",
    )
    c.add_argument("text", help="text to speak")
    _model_args(c)
    c.add_argument("--out", type=Path, default=Path("leapvox-compare"), help="output folder (./leapvox-compare)")
    c.add_argument("--modes", help=f"comma-separated subset of: {', '.join(MODES)} (default: all)")
    c.add_argument("--speaker", help="voice (default: the model's first)")
    c.add_argument("--language", default="auto")
    c.add_argument("--seed", type=int, default=0, help="random seed shared by all modes (default 0)")
    c.add_argument("--max-frames", type=int, help="stop each sentence after N frames")
    c.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    _backend_args(c)
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("devices", help="list audio output devices (for --device)")
    d.set_defaults(func=cmd_devices)


def _backend_args(p) -> None:
    from leapvox.app.coreml_cmd import add_backend_args

    add_backend_args(p)


def _load(args):
    from leapvox.app.cli import _require_model
    from leapvox.models.checkpoint import load_model
    from leapvox.models.hub import resolve_model_path

    return load_model(resolve_model_path(_require_model(args), pull=False), dtype=args.dtype)


def cmd_devices(args) -> int:
    from leapvox.app.playback import output_devices

    devices = output_devices()
    if not devices:
        say("no audio output devices (hint: on a headless machine write WAVs with -o)")
        return 1
    for d in devices:
        mark = "*" if d.is_default else " "
        print(f"{mark} {d.index:3d}  {d.name}  ({d.channels} ch, {d.default_samplerate:.0f} Hz)")
    return 0


def cmd_tui(args) -> int:
    from leapvox.app.cli import _require_model
    from leapvox.app.playback import AudioUnavailable, resolve_device

    if not args.save_dir.is_dir():
        from leapvox.app.cli import UsageError

        raise UsageError(f"--save-dir {args.save_dir} is not a folder")
    model = _require_model(args)
    from leapvox.app.coreml_cmd import check_backend
    from leapvox.models.coreml_export import resolve_backend
    from leapvox.models.hub import resolve_model_path

    check_backend(args)
    folder = resolve_model_path(model, pull=False)  # a bad --model fails here, before the screen opens
    backend = resolve_backend(args.backend, folder)
    try:
        device = resolve_device(args.device)
    except AudioUnavailable:
        device = None  # the TUI says so itself
    from leapvox.app.tui.app import LeapvoxApp

    LeapvoxApp(str(Path(folder).resolve()), dtype=args.dtype, device=device, save_dir=args.save_dir,
               backend=backend, compute_units=args.compute_units).run()
    return 0


def cmd_compare(args) -> int:
    from dataclasses import replace

    from leapvox.app.cli import UsageError
    from leapvox.app.compare import compare

    modes = tuple(m.strip() for m in args.modes.split(",")) if args.modes else MODES
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"unknown mode {unknown[0]!r}", hint=f"this build offers: {', '.join(MODES)}")
    if not args.text.strip():
        raise UsageError("the text is empty", hint="give some words to speak")
    from leapvox.app.coreml_cmd import check_backend, use_backend

    check_backend(args)
    model = _load(args)
    if use_backend(args, model.path, model) == "ane" and not args.modes and "windowed" in modes:
        modes = tuple(m for m in modes if m != "windowed")
        say("the ane backend has no windowed mode (not exported): comparing " + ", ".join(modes))
    opts = replace(model.defaults, seed=args.seed, language=args.language, speaker=args.speaker or None)
    if args.max_frames is not None:
        opts = replace(opts, max_frames=args.max_frames)
    if args.greedy:
        opts = opts.greedy()
    record = compare(model, args.text.strip(), opts, modes, args.out)
    print(record["table"])
    wrote = [f"{m}.wav" for m in modes] + ["compare.json"] + ([record["plot"]] if record["plot"] else [])
    say(f"wrote {', '.join(wrote)} in {args.out}" + ("" if record["plot"] else " (install matplotlib for a plot)"))
    return 0


def speak_play(args, model, text: str, opts) -> int:
    """`speak --play`: play while synthesising; also write -o (and --codes) when given."""
    import numpy as np
    import torch

    from leapvox.app.playback import AudioUnavailable, Player, resolve_device
    from leapvox.engine.streaming import stream_speech

    tell = (lambda m: None) if args.quiet else say
    player = None
    try:
        player = Player(model.sample_rate, resolve_device(args.device)).start()
    except AudioUnavailable as e:
        if not args.output:
            raise
        say(f"warning: cannot play: {e} (writing {args.output} only)")
    audio, codes, stats = [], [], None
    try:
        for chunk in stream_speech(model.synthesizer(), text, opts):
            if player is not None:
                player.feed(chunk.audio, chunk.stats.xrt, chunk.stats.est_remaining_s)
            audio.append(chunk.audio)
            codes.append(chunk.codes)
            stats = chunk.stats
        if player is not None:
            player.end()
            player.wait()
    finally:
        if player is not None:
            player.close()
    for w in stats.warnings:
        say(f"warning: {w}")
    _write_outputs(args, np.concatenate(audio), torch.cat(codes), model.sample_rate)
    played = f", {player.stats.underruns} underruns (pre-buffer {player.stats.prebuffer_s:.2f} s)" if player else ""
    tell(
        f"{'played' if player else 'synthesised'} {stats.audio_s:.2f} s of audio, {stats.sentences} sentence(s), "
        f"{stats.frames} frames, {stats.elapsed_s:.2f} s, xRT {stats.xrt:.2f}, first audio "
        f"{stats.first_audio_s or 0:.2f} s{played}"
    )
    return 0


def _write_outputs(args, audio, codes, sample_rate: int) -> None:
    if args.codes:
        import json

        from leapvox.models.files import write_text_atomic

        write_text_atomic(args.codes, json.dumps(codes.tolist()))
    if not args.output:
        return
    from leapvox.app.audio import write_wav, write_wav_stream

    if args.output == "-":
        write_wav_stream(sys.stdout.buffer, audio, sample_rate)
    else:
        write_wav(Path(args.output).expanduser(), audio, sample_rate)
