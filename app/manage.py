"""`leapvox models list|pull|rm|info|verify` and `leapvox paths`. Data on stdout, messages on stderr.

Only argparse here at import time; huggingface_hub is imported by the commands (through leapvox.models.hub).
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def say(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def add_commands(sub) -> None:
    """Register `models` (with its subcommands) and `paths` on the top-level subparsers."""
    m = sub.add_parser(
        "models",
        help="list, download, check and remove models (Hugging Face cache)",
        description="Models live in the Hugging Face cache (HF_HOME / HF_HUB_CACHE); downloads go through "
        "HF_ENDPOINT with HF_TOKEN; HF_HUB_OFFLINE=1 never touches the network.",
    )
    msub = m.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    m.set_defaults(func=lambda args: _usage(m))

    p = msub.add_parser("list", help="known models and what the cache holds")
    p.set_defaults(func=cmd_list)
    p = msub.add_parser("pull", help="download a model (or repair a damaged one); prints its folder")
    p.add_argument("name", help="catalog name or org/name[@revision]")
    p.set_defaults(func=cmd_pull)
    p = msub.add_parser("rm", help="remove a model from the cache")
    p.add_argument("name", help="catalog name or org/name[@revision]")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_rm)
    p = msub.add_parser("info", help="a model's repo, revision, size, licence, voices and cache state")
    p.add_argument("name", help="catalog name, org/name[@revision] or a folder")
    p.set_defaults(func=cmd_info)
    p = msub.add_parser("verify", help="hash every file of a cached model against the Hub's (or recorded) hashes")
    p.add_argument("name", help="catalog name or org/name[@revision]")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("paths", help="where leapvox and the Hugging Face cache keep files")
    p.set_defaults(func=cmd_paths)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _hub_spec(name: str):
    from leapvox.engine.errors import InputError
    from leapvox.models.catalog import resolve_model

    spec = resolve_model(name)
    if not spec.on_hub:
        raise InputError(f"{name} is not a model from the Hub", hint="this command works on catalog names and org/name")
    return spec


def model_state(spec) -> tuple[str, int | None]:
    """(state in words, bytes on disk) without hashing anything."""
    from leapvox.models import hub
    from leapvox.models.catalog import bundled_ready

    if not spec.on_hub:
        if spec.entry is None:
            return "local folder", None
        if not bundled_ready(spec.entry):
            return "not bundled yet", None
        return "bundled", folder_bytes(spec.entry.bundled)
    m, problems = hub.local_state(spec, mode="quick")
    on_disk = sum(r.size_on_disk for r in hub.cached_revisions(spec) if m and r.commit_hash == m["commit"]) or None
    if m is None:
        return "not downloaded", None
    if problems:
        return f"incomplete ({len(problems)} of {len(m['files'])} files missing or wrong)", on_disk
    return "downloaded", on_disk


def folder_bytes(folder) -> int:
    """Bytes of the regular files under a folder (links followed: a Hub snapshot's files are links to blobs)."""
    from pathlib import Path

    total = 0
    for p in Path(folder).rglob("*"):
        with contextlib.suppress(OSError):  # unreadable or vanished: not counted
            total += p.stat().st_size if p.is_file() else 0
    return total


def catalog_size(entry) -> str:
    """The SIZE a catalog entry is listed with: the catalog's figure, or a bundled model's recorded file sizes."""
    from leapvox.models.catalog import bundled_size, human_size

    if entry.size_bytes:
        return human_size(entry.size_bytes, entry.size_exact)
    if entry.bundled is not None and (n := bundled_size(entry)) is not None:
        return human_size(n)
    return "-"


def cmd_list(args) -> int:
    from leapvox.models.catalog import CATALOG, human_size, spec_for_entry

    rows = [("NAME", "SIZE", "ON DISK", "STATE", "SOURCE")]
    for entry in CATALOG.values():
        spec = spec_for_entry(entry)
        state, on_disk = model_state(spec)
        source = f"{entry.repo_id}@{entry.revision[:7]}" if entry.repo_id else "bundled with leapvox"
        rows.append((entry.name, catalog_size(entry), human_size(on_disk) if on_disk else "-", state, source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    print_exports()  # Core ML assets, if any
    return 0


def cmd_pull(args) -> int:
    from leapvox.models import hub
    from leapvox.models.catalog import resolve_model

    spec = resolve_model(args.name)
    if not spec.on_hub:
        print(hub.ensure(spec))
        return 0
    downloaded = []

    def note(msg: str) -> None:
        downloaded.append(msg)
        say(msg)

    folder = hub.pull(spec, say=note, progress=sys.stderr.isatty())
    say(f"{spec.label} is ready" if downloaded else f"{spec.label} is already downloaded and intact")
    print(folder)
    from leapvox.app.tune import offer_line

    if line := offer_line(folder, spec.name):  # an offer, never run or asked for: pull's output stays the folder
        say(line)
    return 0


def cmd_rm(args) -> int:
    from leapvox.engine.errors import InputError
    from leapvox.models import hub
    from leapvox.models.catalog import human_size

    spec = _hub_spec(args.name)
    revisions = hub.cached_revisions(spec)
    if not revisions:
        say(f"nothing to remove: {spec.label} is not in the cache ({hub.hf_cache_dir()})")
        return 0
    size = sum(r.size_on_disk for r in revisions)
    what = f"{spec.repo_id} ({len(revisions)} revision{'s' if len(revisions) > 1 else ''}, {human_size(size)})"
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError(f"not removing {what} without confirmation", hint="pass --yes to remove without asking")
        print(f"Remove {what} from {hub.hf_cache_dir()}? [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            say("nothing removed")
            return 0
    freed = hub.remove(spec, revisions)
    say(f"removed {what}; freed {human_size(freed)}")
    return 0


WEIGHTS = (("model", "the talker's weights"), ("speech_tokenizer/model", "the codec's weights"))
OTHER_NEEDED = (("vocab.json", "the text tokenizer"), ("merges.txt", "the text tokenizer"),
                ("speech_tokenizer/config.json", "the codec's config"))


def _weights(folder, stem: str, what: str) -> tuple[list[str], list[str]]:
    """(descriptions, problems) of the safetensors files of `stem` (one file, or an index and its shards); reads
    each file's header only."""
    import os
    from pathlib import Path

    from leapvox.engine.errors import LeapvoxError
    from leapvox.models.catalog import human_size
    from leapvox.models.checkpoint import read_json

    index, single = folder / f"{stem}.safetensors.index.json", folder / f"{stem}.safetensors"
    if index.is_file():
        try:
            shards = sorted({str(f) for f in read_json(index)["weight_map"].values()})
        except (LeapvoxError, KeyError, TypeError, AttributeError) as e:
            return [], [f"cannot read {index.relative_to(folder).as_posix()}: {e}"]
        files = [index.parent / f for f in shards]
    elif single.is_file():
        files = [single]
    else:
        return [], [f"missing {single.relative_to(folder).as_posix()} ({what})"]
    from safetensors import safe_open

    found, problems = [], []
    for f in files:
        rel = Path(os.path.relpath(f, folder)).as_posix()
        if not f.is_file():
            problems.append(f"missing {rel} (named by {index.name})")
            continue
        try:
            with safe_open(str(f), framework="pt") as st:
                n = len(list(st.keys()))
        except Exception as e:  # safetensors raises its own error type for a bad or truncated file
            problems.append(f"cannot read {rel}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        found.append(f"{rel} ({human_size(f.stat().st_size)}, {n} tensors)")
    return found, problems


def inspect_folder(folder) -> tuple[list[tuple[str, str]], list[str]]:
    """What a checkpoint folder holds (rows for `models info`) and what keeps it from loading (one line each)."""
    from pathlib import Path

    from leapvox.engine.errors import LeapvoxError
    from leapvox.models.catalog import human_size
    from leapvox.models.checkpoint import load_config, read_json

    folder = Path(folder).expanduser()
    if not folder.exists():
        return [], [f"no such folder: {folder}"]
    if not folder.is_dir():
        return [], [f"{folder} is a file; a checkpoint is a folder (config.json, model.safetensors, ...)"]
    rows, problems = [], []
    if not (folder / "config.json").is_file():
        problems.append("missing config.json (the model's configuration)")
    else:
        try:
            raw = read_json(folder / "config.json")
            cfg = load_config(folder)
        except LeapvoxError as e:
            problems.append(str(e))
        except (TypeError, ValueError, AttributeError) as e:  # a config.json of the wrong shape
            problems.append(f"config.json is not a usable Qwen3-TTS config: {type(e).__name__}: {e}")
        else:
            frontend = raw.get("leapvox_text_frontend")
            rows += [
                ("model", f"{raw.get('model_type', '?')} {cfg.tts_model_type} ({cfg.tts_model_size or '?'}): talker "
                 f"{cfg.talker.num_hidden_layers} layers x {cfg.talker.hidden_size}"
                 + (f", text front end {frontend}" if frontend else "")),
                ("speakers", ", ".join(cfg.speakers) or "-"),
                ("languages", ", ".join(cfg.languages)),
                ("instruct", "yes" if cfg.supports_instruct else "no"),
            ]
    codec_cfg = folder / "speech_tokenizer" / "config.json"
    if codec_cfg.is_file():
        try:
            rows.append(("codec", str(read_json(codec_cfg).get("model_type", "qwen3_tts_tokenizer_12hz"))))
        except LeapvoxError as e:
            problems.append(str(e))
    weights = []
    for stem, what in WEIGHTS:
        found, lacking = _weights(folder, stem, what)
        weights += found
        problems += lacking
    rows.append(("weights", ", ".join(weights) or "-"))
    problems += [f"missing {name} ({what})" for name, what in OTHER_NEEDED if not (folder / name).is_file()]
    rows.insert(1 if rows and rows[0][0] == "model" else 0, ("size", human_size(folder_bytes(folder))))
    return rows, problems


def cmd_info(args) -> int:
    from leapvox.models import hub
    from leapvox.models.catalog import CATALOG, human_size, resolve_model, spec_for_entry

    spec = spec_for_entry(CATALOG[args.name]) if args.name in CATALOG else resolve_model(args.name)
    e = spec.entry
    if e is None and not spec.on_hub:  # a folder: what it holds and what is wrong with it
        return print_folder_info(spec.folder)
    state, on_disk = model_state(spec)
    rows = [("name", spec.name)]
    if e is not None:
        rows.append(("description", e.description))
    if spec.on_hub:
        rows += [("repo", spec.repo_id), ("revision", spec.revision or "main (default branch)")]
    if e is not None:
        speakers, languages = ", ".join(e.speakers), ", ".join(e.languages)
        if e.bundled is not None and state == "bundled":  # the catalog lists no voices for it: its config does
            held = dict(inspect_folder(e.bundled)[0])
            speakers, languages = speakers or held.get("speakers", ""), languages or held.get("languages", "")
        rows += [
            ("size", catalog_size(e)),
            ("licence", e.licence),
            ("speakers", speakers or "-"),
            ("languages", languages or "-"),
            ("instruct", "yes" if e.instruct else "no"),
        ]
    if spec.on_hub:
        rows.append(("files", ", ".join(spec.files)))
    rows.append(("state", state + (f", {human_size(on_disk)} on disk" if on_disk else "")))
    if spec.on_hub and state == "downloaded":
        rows.append(("path", str(hub.repo_folder(spec.repo_id) / "snapshots" / hub.cached_commit(spec))))
    elif spec.folder is not None:
        rows.append(("path", str(spec.folder)))
    _print_rows(rows)
    return 0


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


def print_folder_info(folder) -> int:
    """`models info FOLDER`: the folder's contents, then one `problem` row per problem; exit 1 when there are any."""
    rows, problems = inspect_folder(folder)
    _print_rows([("path", str(folder)), *rows, *(("problem", p) for p in problems)])
    if problems:
        n = len(problems)
        say(f"{folder} has {n} problem{'s' if n > 1 else ''} and will not load as a checkpoint (hint: a checkpoint "
            "folder holds config.json, model.safetensors, vocab.json, merges.txt and speech_tokenizer/)")
        return 1
    return 0


def verify_bundled(entry) -> tuple[dict, dict[str, str], str]:
    """Hash every file of a bundled model against its MANIFEST.json: (manifest, problems, against-what)."""
    from leapvox.engine.errors import CheckpointError
    from leapvox.models.catalog import BUNDLED_MANIFEST, check_bundled, read_bundled_manifest

    path = entry.bundled / BUNDLED_MANIFEST
    m = read_bundled_manifest(entry.bundled)
    if m is None:
        raise CheckpointError(f"{entry.name} has no recorded hashes to check against: {path} is missing or unreadable",
                              hint="reinstall leapvox; the manifest ships with the bundled model")
    return m, check_bundled(entry.bundled, m), f"hashes recorded in {path}"


def cmd_verify(args) -> int:
    from leapvox.models import hub
    from leapvox.models.catalog import CATALOG, human_size, spec_for_entry

    entry = CATALOG.get(args.name)
    if entry is not None and entry.bundled is not None:  # even without config.json: that is a finding, too
        spec = spec_for_entry(entry)
        m, problems, source = verify_bundled(entry)
        hint = "reinstall leapvox to restore the bundled model"
    else:
        spec = _hub_spec(args.name)
        m, problems, source = hub.verify(spec)
        hint = f"leapvox models pull {spec.name} fetches them again"
    names = sorted(set(m["files"]) | set(problems))
    width = max(len(n) for n in names)
    for name in names:
        size = m["files"].get(name, {}).get("size")
        print(f"{'ok' if name not in problems else 'FAILED':7} {name.ljust(width)}  {human_size(size) if size else '-'}"
              + (f"  ({problems[name]})" if name in problems else ""))
    if problems:
        say(f"{len(problems)} of {len(names)} files of {spec.label} are missing or damaged (checked against "
            f"{source}) (hint: {hint})")
        return 1
    say(f"all {len(names)} files of {spec.label} match the {source}")
    return 0


def cmd_paths(args) -> int:
    from leapvox.models import hub

    rows = [("hf-cache", str(hub.hf_cache_dir()))]
    rows += [(k, str(v)) for k, v in hub.leapvox_dirs().items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    return 0


def print_exports() -> None:
    """The Core ML exports in leapvox's coreml folder, one line each (nothing when there are none)."""
    import json

    from leapvox.models.catalog import human_size
    from leapvox.models.coreml_assets import export_root

    root = export_root()  # in leapvox's data folder
    rows = []
    for m in sorted(root.glob("*/manifest.json")) if root.is_dir() else []:
        try:
            d = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        rows.append((m.parent.name, human_size(d.get("bytes", 0)), "+".join(d.get("parts", {})), d.get("model", "?")))
    if rows:
        print("\nCore ML exports (leapvox recipe coreml):")
        for name, size, parts, model in rows:
            print(f"  {name}  {size}  {parts}  {model}")
