"""`leapvox models list|pull|rm|info|verify` and `leapvox paths`. Data on stdout, messages on stderr.

Only argparse here at import time; huggingface_hub is imported by the commands (through leapvox.models.hub).
"""

from __future__ import annotations

import argparse
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
        return ("bundled" if bundled_ready(spec.entry) else "not bundled yet") if spec.entry else "local folder", None
    m, problems = hub.local_state(spec, mode="quick")
    on_disk = sum(r.size_on_disk for r in hub.cached_revisions(spec) if m and r.commit_hash == m["commit"]) or None
    if m is None:
        return "not downloaded", None
    if problems:
        return f"incomplete ({len(problems)} of {len(m['files'])} files missing or wrong)", on_disk
    return "downloaded", on_disk


def cmd_list(args) -> int:
    from leapvox.models.catalog import CATALOG, human_size, spec_for_entry

    rows = [("NAME", "SIZE", "ON DISK", "STATE", "SOURCE")]
    for entry in CATALOG.values():
        spec = spec_for_entry(entry)
        state, on_disk = model_state(spec)
        source = f"{entry.repo_id}@{entry.revision[:7]}" if entry.repo_id else "bundled with leapvox"
        size = human_size(entry.size_bytes, entry.size_exact) if entry.size_bytes else "-"
        rows.append((entry.name, size, human_size(on_disk) if on_disk else "-", state, source))
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


def cmd_info(args) -> int:
    from leapvox.models import hub
    from leapvox.models.catalog import CATALOG, human_size, resolve_model, spec_for_entry

    spec = spec_for_entry(CATALOG[args.name]) if args.name in CATALOG else resolve_model(args.name)
    e = spec.entry
    state, on_disk = model_state(spec)
    rows = [("name", spec.name)]
    if e is not None:
        rows.append(("description", e.description))
    if spec.on_hub:
        rows += [("repo", spec.repo_id), ("revision", spec.revision or "main (default branch)")]
    if e is not None:
        rows += [
            ("size", human_size(e.size_bytes, e.size_exact) if e.size_bytes else "-"),
            ("licence", e.licence),
            ("speakers", ", ".join(e.speakers) or "-"),
            ("languages", ", ".join(e.languages) or "-"),
            ("instruct", "yes" if e.instruct else "no"),
        ]
    if spec.on_hub:
        rows.append(("files", ", ".join(spec.files)))
    rows.append(("state", state + (f", {human_size(on_disk)} on disk" if on_disk else "")))
    if spec.on_hub and state == "downloaded":
        rows.append(("path", str(hub.repo_folder(spec.repo_id) / "snapshots" / hub.cached_commit(spec))))
    elif spec.folder is not None:
        rows.append(("path", str(spec.folder)))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    return 0


def cmd_verify(args) -> int:
    from leapvox.models import hub
    from leapvox.models.catalog import human_size

    spec = _hub_spec(args.name)
    m, problems, source = hub.verify(spec)
    width = max(len(n) for n in m["files"])
    for name in sorted(m["files"]):
        size = m["files"][name]["size"]
        print(f"{'ok' if name not in problems else 'FAILED':7} {name.ljust(width)}  {human_size(size) if size else '-'}"
              + (f"  ({problems[name]})" if name in problems else ""))
    if problems:
        say(f"{len(problems)} of {len(m['files'])} files of {spec.label} are missing or damaged (checked against "
            f"{source}) (hint: leapvox models pull {spec.name} fetches them again)")
        return 1
    say(f"all {len(m['files'])} files of {spec.label} match the {source}")
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
        print("\nCore ML exports (leapvox export-coreml):")
        for name, size, parts, model in rows:
            print(f"  {name}  {size}  {parts}  {model}")
