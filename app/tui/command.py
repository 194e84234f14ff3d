"""`leapvox tui`: the interactive window. Only argparse at import time; Textual loads inside the command."""

from __future__ import annotations

from pathlib import Path

from leapvox.app.common import UsageError, backend_args, check_backend, model_args, require_model


def add_commands(sub) -> None:
    t = sub.add_parser("tui", help="interactive window: type, speak, live speed readouts, history",
                       description="Type text, pick a speaker, language, mode and backend, speak with live speed "
                       "readouts. The mode selector starts on auto: the mode leapvox tune chose for this model on this "
                       "machine (else ar); the window's top line says what auto chose and why.")
    model_args(t)
    t.add_argument("--device", help="output device number or name (see 'leapvox devices')")
    t.add_argument("--save-dir", type=Path, default=Path("."), help="where 'Save WAV' writes (default: here)")
    backend_args(t)
    t.set_defaults(func=cmd_tui)


def cmd_tui(args) -> int:
    from leapvox.app.playback import AudioUnavailable, resolve_device
    from leapvox.models.auto import choose
    from leapvox.models.coreml_assets import resolve_backend
    from leapvox.models.hub import resolve_model_path

    if not args.save_dir.is_dir():
        raise UsageError(f"--save-dir {args.save_dir} is not a folder")
    check_backend(args)
    folder = resolve_model_path(require_model(args), pull=False)  # a bad --model fails here, before the screen opens
    backend = resolve_backend(args.backend, folder)
    choice = choose(folder, "auto", args.weights, backend, args.model)  # --weights auto: known before the load
    try:
        device = resolve_device(args.device)
    except AudioUnavailable:
        device = None  # the TUI says so itself
    from leapvox.app.tui.app import LeapvoxApp

    LeapvoxApp(str(Path(folder).resolve()), weights=choice.weights, device=device, save_dir=args.save_dir,
               backend=backend, compute_units=args.compute_units, auto=choice).run()
    return 0
