"""`leapvox recipe coreml`: talker, code predictor and codec decoder as Core ML assets (conversion runs on Linux)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_commands(sub) -> None:
    e = sub.add_parser(
        "coreml",
        help="export the talker, code predictor and codec decoder to Core ML (.mlpackage; runs on macOS 15)",
        description="Convert a model to Core ML: the talker (prefill + decode) and the code predictor (prefill, ar, "
        "fused draft + verify) as multifunction .mlpackage assets with shared weights and KV caches as states, and "
        "the codec decoder as a streaming step with its carried state; fp16 compute. Needs coremltools "
        "(pip install 'leapvox[coreml]'); running the assets needs macOS 15.",
    )
    e.add_argument("--model", help="catalog name, Hub repo org/name[@revision] or checkpoint folder "
                   "(default: $LEAPVOX_MODEL)")
    e.add_argument("--out", type=Path, help="folder to write (default: leapvox's coreml folder, keyed by model, "
                   "revision and settings; see 'leapvox paths')")
    e.add_argument("--weights", choices=["w8a16", "fp16"], default="w8a16",
                   help="int8 per-channel weights with fp16 compute (default), or fp16 weights")
    e.add_argument("--prefill-len", type=int, default=256, help="talker prompt rows per prefill call (default 256)")
    e.add_argument("--context", type=int, default=2048, help="talker KV slots, prompt + frames (default 2048)")
    e.add_argument("--parts", default="predictor,talker,codec",
                   help="comma-separated: predictor, talker, codec (default all three)")
    e.add_argument("--codec-chunk", type=int, default=4, help="frames per codec streaming call (default 4 = 320 ms)")
    e.set_defaults(func=cmd_export_coreml)


def _say(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def calibration_backend(args) -> tuple[str, str]:
    """`recipe tree`'s (backend, device class) for the tree file: ('cpu', 'cpu'), or ('ane', this Mac's chip)."""
    from leapvox.app.common import check_backend
    from leapvox.engine.backend import ane_unavailable_reason

    check_backend(args)
    if args.backend == "ane" or (args.backend == "auto" and ane_unavailable_reason() is None):
        from leapvox.engine.coreml.runtime import device_class

        return "ane", device_class()
    return "cpu", "cpu"


def cmd_export_coreml(args) -> int:
    import os
    from dataclasses import replace

    from leapvox.app.common import UsageError
    from leapvox.models.hub import resolve_model_path
    from leapvox.models.recipes.coreml_export import CoreMLExportError, ExportSettings, human_bytes
    from leapvox.models.spec_assets import load_tree

    model = args.model or os.environ.get("LEAPVOX_MODEL")
    if not model:
        raise UsageError("no model given", hint="pass --model qwen3-tts-0.6b, or --model PATH to a checkpoint folder")
    folder = resolve_model_path(model, pull=False)
    from leapvox.engine.coreml.runtime import device_class

    for backend, device in (("ane", device_class()), ("ane", "default"), ("cpu", "cpu")):  # this Mac's tree first
        tree, tree_file = load_tree(folder, backend, device)
        if tree_file is not None:
            break
    settings = ExportSettings(weights=args.weights, prefill_len=args.prefill_len, context=args.context,
                              codec_chunk=args.codec_chunk,
                              tree_paths=tuple(tree.paths()[1:]),
                              parts=tuple(p.strip() for p in args.parts.split(",") if p.strip()))
    try:
        settings.check()
    except CoreMLExportError as e:
        raise UsageError(str(e), hint=e.hint) from None
    settings = replace(settings, drafts=settings.tree.max_depth)  # draft as deep as the verify tree goes
    _say(f"draft tree: {settings.tree.size} nodes, depth {settings.tree.max_depth} "
         f"({tree_file or 'the default tree; run leapvox recipe tree for a calibrated one'})")
    from leapvox.models.recipes.coreml_export import export_model, export_modules

    if args.out is None:
        dest, manifest = export_model(folder, settings, say=_say)
    else:
        from leapvox.models.load import load_model
        from leapvox.models.spec_assets import load_offsets

        loaded = load_model(folder, weights="fp32")
        talker = loaded.tts.talker
        offsets, _ = load_offsets(folder, talker.code_predictor.cfg.hidden_size)
        dest = args.out.expanduser()
        manifest = export_modules(talker, dest, settings, offsets, {"model": str(folder)}, say=_say)
    for part, info in manifest["parts"].items():
        _say(f"{part}.mlpackage: {human_bytes(info['bytes'])}, functions {', '.join(info['functions'])}")
    _say(f"wrote {dest} ({human_bytes(manifest['bytes'])})")
    print(dest)
    return 0
