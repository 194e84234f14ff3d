"""`leapvox tui`: the interactive window. Only argparse at import time; Textual loads inside the command."""

from __future__ import annotations

from pathlib import Path

from leapvox.app.common import UsageError, backend_args, check_backend, model_args, require_model


def add_commands(sub) -> None:
    t = sub.add_parser("tui", help="interactive window: type, speak, live speed readouts, history")
    model_args(t)
    t.add_argument("--device", help="output device number or name (see 'leapvox devices')")
    t.add_argument("--save-dir", type=Path, default=Path("."), help="where 'Save WAV' writes (default: here)")
    backend_args(t)
    t.set_defaults(func=cmd_tui)


def cmd_tui(args) -> int:
    from leapvox.app.playback import AudioUnavailable, resolve_device
    from leapvox.models.coreml_assets import resolve_backend
    from leapvox.models.hub import resolve_model_path

    if not args.save_dir.is_dir():
        raise UsageError(f"--save-dir {args.save_dir} is not a folder")
    check_backend(args)
    folder = resolve_model_path(require_model(args), pull=False)  # a bad --model fails here, before the screen opens
    backend = resolve_backend(args.backend, folder)
    try:
        device = resolve_device(args.device)
    except AudioUnavailable:
        device = None  # the TUI says so itself
    from leapvox.app.tui.app import LeapvoxApp

    LeapvoxApp(str(Path(folder).resolve()), weights=args.weights, device=device, save_dir=args.save_dir,
               backend=backend, compute_units=args.compute_units).run()
    return 0
