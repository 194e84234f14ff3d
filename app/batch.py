"""`leapvox batch INPUT --out DIR`: many items, one file each, resumable, in this process, N local processes or Ray.

INPUT is JSONL or CSV (`id`, `text`; optionally `voice` or `speaker`, `language`, `seed`, `instruct`, `mode`), or a
plain text file: one item per line, or with --chapters a book split at its chapter headings. Every item is checked
before the model loads (ids that are not safe file names, duplicates, options by engine.options' one set of rules,
each error naming its line). Each item becomes DIR/<id>.wav (or .flac), written atomically, and one line of
DIR/manifest.jsonl (the item, its file, seconds, sha256, timings or its error), appended and fsynced as it finishes.
A rerun skips the items whose file and manifest entry agree, so Ctrl-C or a crash loses at most the items in flight;
the manifest then holds one entry per id again.

An item without a seed gets one derived from its id, so a dataset is reproducible item by item: a rerun, a retry
of a failed item, or the same item on another worker gives the same samples (fp32, same --threads).

On a cluster: `ray start --head` on one machine, `ray start --address HEAD:6379` on the others (each with leapvox
and the model), then `leapvox batch items.jsonl --out DIR --ray auto` on the head (or `--ray HEAD:6379`); the files
come back to DIR. Ray places one actor per --threads CPUs on each node, each with its own model. The alternative
for a serving fleet: run `leapvox serve` on several machines and fan the requests out with Ray Data
(`ray.data.read_json(...).map_batches(...)` posting each row to one server's /v1/audio/speech)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from leapvox.engine.options import AUTO, MODE_CHOICES, OptionError, build_options, check_options, check_text, validate

from .common import (
    EXIT_FAILED,
    EXIT_OK,
    MODE_AUTO_HELP,
    UsageError,
    choose,
    clean_text,
    cli_name,
    flag_values,
    interruption,
    model_args,
    open_model,
    quiet_or,
    say,
    stop_status,
    tell,
)

ITEM_FIELDS = ("id", "text", "voice", "speaker", "language", "seed", "instruct", "mode")
FLAG_KEYS = ("speaker", "language", "instruct", "mode", "temperature", "top_k", "top_p", "greedy",
             "repetition_penalty", "max_frames", "no_guard")
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MANIFEST = "manifest.jsonl"
# models.files.Output's temp files for our files: .NAME.XXXXXXXX.part
TEMP = re.compile(r"\.(?:.+\.(?:wav|flac)|manifest\.jsonl)\.[a-z0-9_]{8}\.part")
LOCK = ".leapvox-batch.lock"


def add_commands(sub) -> None:
    b = sub.add_parser(
        "batch", help="synthesise many items (JSONL, CSV, lines, a book's chapters) into files, resumably",
        description="Synthesise every item of INPUT into DIR/<id>.wav (or .flac) and DIR/manifest.jsonl.\nRerun "
        "the same command to go on after an interruption: items whose file and manifest entry agree\nare skipped; "
        "exit 0 when every item is written, 1 when some failed (the manifest says why).",
        epilog="INPUT: .jsonl (one JSON object a line) or .csv (a header row) with id, text and optionally voice or\n"
        "speaker, language, seed, instruct, mode; any other file is plain text, one item a line (or --chapters).\n"
        "An item without a seed gets one derived from its id. On a cluster: ray start --head, then --ray auto.\n\n"
        "examples:\n"
        "  leapvox batch lines.jsonl --out clips/ --workers 2\n"
        "  leapvox batch book.txt --chapters --out book/ --format flac\n"
        "  leapvox batch lines.csv --out clips/ --ray local      (or --ray auto on a running cluster)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("input", type=Path, help="items: .jsonl, .csv, or a plain text file")
    b.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for the files and manifest.jsonl")
    b.add_argument("--chapters", action="store_true", help="plain text: one item per chapter (split at headings "
                   "such as 'Chapter 3', 'CHAPTER III', 'Part One: ...', 'Prologue', '# Title')")
    b.add_argument("--format", choices=("wav", "flac"), default="wav", help="file format (default wav, 16-bit)")
    b.add_argument("--workers", type=int, help="local processes, one model each (default 1); with --ray: actors "
                   "(default: as many as the nodes' cores hold at --threads each)")
    b.add_argument("--threads", type=int, help="torch threads per worker (default: this machine's cores split "
                   "between the workers; with --ray 2); fp32 samples are the same for the same --threads")
    b.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run the items on Ray "
                   "(pip install \"leapvox[ray]\"): auto = the cluster `ray start` runs here, HOST:PORT, or local "
                   "(a local cluster for this run)")
    b.add_argument("--asr-check", action="store_true", help="English: transcribe each file with pocketsphinx "
                   "(pip install \"leapvox[demo]\"), record its word error rate and flag the items far above the "
                   "batch's median")
    model_args(b)
    b.add_argument("--speaker", help="speaker of items that name none (see 'leapvox speakers')")
    b.add_argument("--language", help="language of items that name none (default auto)")
    b.add_argument("--instruct", help="style instruction of items that give none (1.7B models)")
    b.add_argument("--mode", choices=MODE_CHOICES, help="decoding mode of items that name none: ar, spec, windowed, "
                   f"or {MODE_AUTO_HELP} (default auto; the manifest records the mode and weights each item ran with)")
    b.add_argument("--temperature", type=float, help="sampling temperature for all codes (default 0.9)")
    b.add_argument("--top-k", type=int, help="keep the K most likely codes (default 50; 0 disables)")
    b.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0 = off)")
    b.add_argument("--repetition-penalty", type=float, help="penalty on repeated code-0 values (default 1.05)")
    b.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    b.add_argument("--max-frames", type=int, help="stop each sentence after N frames of 80 ms")
    b.add_argument("--no-guard", action="store_true", help="disable the runaway cap derived from the text length")
    b.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors and the summary")
    b.set_defaults(func=cmd_batch)


# ---- input: items with their line numbers


@dataclass
class Item:
    id: str
    text: str
    options: dict  # option -> value as engine.options names them (voice: a Base model's saved voice)
    where: str  # "items.csv line 12", for errors

    def record(self) -> dict:
        """The item as its manifest entry holds it, and as a worker receives it."""
        return {"id": self.id, "text": self.text, "options": self.options}


def read_items(path: Path, chapters: bool = False) -> list[Item]:
    """The items of INPUT, by its extension; a usage error naming the line of the first bad one."""
    try:
        data = path.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"cannot read {path}: it is not UTF-8 text (offset {e.start})",
                         hint="convert it, e.g. iconv -f latin1 -t utf-8") from None
    kind = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}.get(path.suffix.lower(), "text")
    if chapters and kind != "text":
        raise UsageError(f"--chapters splits a plain text file; {path.name} is {kind.upper()}",
                         hint="leave --chapters out, or give the book as a .txt file")
    rows = _chapters(data, path) if chapters else {"jsonl": _jsonl, "csv": _csv, "text": _lines}[kind](data, path)
    items = [_item(fields, where) for fields, where in rows]
    if not items:
        raise UsageError(f"{path} holds no items", hint="one JSON object a line, a CSV with id,text, or lines of text")
    _check_ids(items)
    return items


def _jsonl(data: str, path: Path):
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path.name} line {n}: not JSON ({e.msg} at column {e.colno})",
                                 hint="one JSON object a line, e.g. {\"id\": \"a1\", \"text\": \"Hello.\"}") from None
            if not isinstance(row, dict):
                raise UsageError(f"{path.name} line {n}: a JSON object is wanted, not {type(row).__name__}",
                                 hint="e.g. {\"id\": \"a1\", \"text\": \"Hello.\"}")
            yield row, f"{path.name} line {n}"


def _csv(data: str, path: Path):
    import io

    reader = csv.DictReader(io.StringIO(data, newline=""))
    unknown = [c for c in reader.fieldnames or [] if c not in ITEM_FIELDS]
    if unknown or not {"id", "text"} <= set(reader.fieldnames or []):
        what = f"unknown column {unknown[0]!r}" if unknown else "the header row needs columns id and text"
        raise UsageError(f"{path.name} line 1: {what}", hint=f"columns: {', '.join(ITEM_FIELDS)}")
    start = reader.line_num + 1
    try:
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise UsageError(f"{path.name} line {start}: {len(reader.fieldnames)} columns are wanted",
                                 hint="quote a field that holds a comma: \"Hello, world.\"")
            yield {k: _csv_value(k, v) for k, v in row.items() if v.strip()}, f"{path.name} line {start}"
            start = reader.line_num + 1
    except csv.Error as e:
        raise UsageError(f"{path.name} line {start}: {e}") from None


def _csv_value(key: str, v: str):
    return int(v) if key == "seed" and re.fullmatch(r"\s*\d+\s*", v) else v


def _lines(data: str, path: Path):
    lines = data.splitlines()
    width = max(4, len(str(len(lines))))
    for n, line in enumerate(lines, 1):
        if line.strip():
            yield {"id": f"{n:0{width}d}", "text": line}, f"{path.name} line {n}"


_NUMBER = (r"\d+|[ivxlcdm]+|(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
           r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|"
           r"hundred)(?:[- ](?:one|two|three|four|five|six|seven|eight|nine))?")
HEADING = re.compile(rf"(?:(?:chapter|book|part)\s+(?:{_NUMBER})(?:\s*[.:\u2013\u2014-].*)?"
                     r"|(?:prologue|epilogue|preface|foreword|afterword|introduction)(?:\s*[.:\u2013\u2014-].*)?"
                     r"|#{1,3}\s+\S.*)", re.IGNORECASE)


def _chapters(data: str, path: Path):
    """A book's chapters: a new one at each heading line (at most 80 characters, HEADING), spoken with a full stop
    and a paragraph's pause after the heading; text before the first heading, if any, is the item `front-matter`."""
    parts, n_start = [[None, []]], [1]
    for n, line in enumerate(data.splitlines(), 1):
        if len(line.strip()) <= 80 and HEADING.fullmatch(line.strip()):
            parts.append([line.strip().lstrip("#").strip(), []])
            n_start.append(n)
        else:
            parts[-1][1].append(line)
    if len(parts) == 1:
        raise UsageError(f"{path.name}: no chapter headings found", hint="headings are lines such as 'Chapter 1', "
                         "'CHAPTER IV', 'Part Two: ...', 'Prologue' or '# Title'; or leave --chapters out")
    width = max(2, len(str(len(parts) - 1)))
    for i, ((heading, body), n) in enumerate(zip(parts, n_start, strict=True)):
        text = "\n".join(body).strip()
        if heading is None:
            if any(c.isalnum() for c in text):
                yield {"id": "front-matter", "text": text}, f"{path.name} line 1"
            continue
        title = heading if heading[-1] in ".!?:" else heading + "."
        yield {"id": f"chapter-{i:0{width}d}", "text": f"{title}\n\n{text}"}, f"{path.name} line {n}"  # a paragraph


def _item(row: dict, where: str) -> Item:
    unknown = [k for k in row if k not in ITEM_FIELDS]
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r}", hint=f"fields: {', '.join(ITEM_FIELDS)}")
    iid, text = row.get("id"), row.get("text")
    if isinstance(iid, int) and not isinstance(iid, bool):
        iid = str(iid)
    if not isinstance(iid, str) or not SAFE_ID.fullmatch(iid):
        raise UsageError(f"{where}: id {iid!r} is not a safe file name" if iid is not None else f"{where}: no id",
                         hint="ids name files: 1-128 ASCII letters, digits, '.', '_', '-', starting with a letter "
                         "or digit")
    if not isinstance(text, str):
        raise UsageError(f"{where}: {'no text' if text is None else 'text must be a string'}")
    text = clean_text(text)
    try:
        check_text(text)
    except OptionError as e:
        raise UsageError(f"{where}: {e}", hint=e.hint) from None
    options = {k: v for k, v in row.items() if k not in ("id", "text") and v is not None}
    if "voice" in options and "speaker" in options:
        raise UsageError(f"{where}: give voice or speaker, not both", hint="voice is the speaker's other name")
    return Item(iid, text, options, where)


def _check_ids(items: list[Item]) -> None:
    """No two items write one file (file systems that ignore case included)."""
    seen = {}
    for it in items:
        first = seen.setdefault(it.id.casefold(), it)
        if first is not it:
            same = "" if first.id == it.id else f" ({first.id!r} there: file names may ignore case)"
            raise UsageError(f"{it.where}: duplicate id {it.id!r}, also on {first.where.split(' ', 1)[1]}{same}",
                             hint="give every item its own id")


# ---- options: every item by the one set of rules, before the model loads


def derive_seed(item_id: str) -> int:
    """The seed of an item that gives none: from its id alone, so it is the same on every run and worker."""
    return int.from_bytes(hashlib.sha256(f"leapvox batch {item_id}".encode()).digest()[:8], "big")


def check_items(items: list[Item], flags: dict, folder, auto_mode: str = "ar") -> None:
    """Each item's options over the batch's flags, checked as speak checks its flags (engine.options) against the
    model's config: the first bad one is a usage error naming its line. Resolves voice (a speaker, or a Base model's
    saved voice) and the seed in place; mode auto (or none) is checked as `auto_mode`, what it runs."""
    from .batch_workers import run_mode

    base = folder.config.tts_model_type == "base"
    saved = _saved_voices(folder) if base else set()
    for it in items:
        o = it.options
        if "voice" in o and not base:
            o["speaker"] = o.pop("voice")
        o.setdefault("seed", derive_seed(it.id))
        if base and o.get("voice") is not None and o["voice"] not in saved:
            raise UsageError(f"{it.where}: no saved voice {o['voice']!r} for this model",
                             hint=f"saved voices: {', '.join(sorted(saved)) or 'none (leapvox voices add)'}")
        given = {**flags, **o}
        given["mode"] = run_mode(given, auto_mode)
        try:
            check_options({k: v for k, v in given.items() if k != "voice"})
            validate(build_options(given, folder.defaults), folder.config, given.get("voice"))
        except OptionError as e:
            raise UsageError(f"{it.where}: {e}", hint=e.hint) from None


def _saved_voices(folder) -> set[str]:
    from leapvox.models.voices import list_voices, model_key

    return {v.name for v in list_voices(model_key(folder.path)) if v.mode != "damaged"}


# ---- the output folder and its manifest


@dataclass
class Manifest:
    """DIR/manifest.jsonl: one JSON line per finished item, appended and fsynced."""

    path: Path
    entries: dict = field(default_factory=dict)  # id -> its last entry
    file: object = None

    def read(self) -> bool:
        """The entries on disk (a torn last line from a crash is skipped); whether the file needs rewriting."""
        if not self.path.exists():
            return False
        lines, dirty = self.path.read_text("utf-8", errors="replace").splitlines(), False
        for line in lines:
            try:
                entry = json.loads(line)
                self.entries.pop(entry["id"], None)  # the last entry of an id counts (a retry after a failure)
                self.entries[entry["id"]] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                dirty = True
        return dirty or len(lines) != len(self.entries)

    def rewrite(self) -> None:
        from leapvox.models.files import write_text_atomic

        write_text_atomic(self.path, "".join(json.dumps(e) + "\n" for e in self.entries.values()))

    def append(self, entry: dict) -> None:
        if self.file is None:
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.entries[entry["id"]] = entry

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
                else hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _done(entry: dict | None, out: Path, key: dict) -> bool:
    """Whether an item's entry says it is done with these settings and its file agrees (size and sha256)."""
    if not entry or entry.get("error") or not entry.get("file") or {k: entry.get(k) for k in key} != key:
        return False
    path = out / entry["file"]
    return path.is_file() and not path.is_symlink() and path.stat().st_size == entry.get("bytes") \
        and _sha256(path) == entry.get("sha256")


def check_out(out: Path) -> None:
    """--out is a folder, or one that can be made (its nearest existing parent a writable folder): known before
    the model loads, and nothing made yet."""
    there = out
    while not there.exists() and not there.is_symlink() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise UsageError(f"cannot write into {out}: {there} is not a folder", hint="give a folder with --out")
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write into {out}: no permission to write in {there}", hint="give another --out")


def _ours(lock, path: Path) -> bool:
    """Whether the locked file is still the one at `path` (a run that finished removes its lock file: a lock taken
    on the removed file would guard nothing)."""
    try:
        return os.fstat(lock.fileno()).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except OSError:
        return False


def open_out(out: Path):
    """DIR made and locked for this run (a second batch into it is refused); our leftover temp files removed.
    The lock file goes when the run ends (close_out)."""
    if (out / LOCK).is_symlink() or (out / LOCK).exists() and not (out / LOCK).is_file():
        raise UsageError(f"{out / LOCK} is not a regular file", hint="remove it, or give another --out folder")
    for _ in range(3):  # another run may remove the lock file between our open and our lock: open it again
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock = open(out / LOCK, "a")  # noqa: SIM115 - held until close_out
        except OSError as e:
            raise UsageError(f"cannot write into {out}: {e.strerror or e}", hint="give another --out folder") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            break  # held by a running batch
        if _ours(lock, out / LOCK):
            break
        lock.close()
    if lock.closed:  # held, or its file replaced under us three times running: another batch is busy there
        raise UsageError(f"another leapvox batch is writing into {out}", hint="wait for it, or give another --out")
    for p in out.iterdir():
        if TEMP.fullmatch(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)  # a file this command was writing when it was killed
    manifest = Manifest(out / MANIFEST)
    if manifest.path.is_symlink() or manifest.path.exists() and not manifest.path.is_file():
        raise UsageError(f"{manifest.path} is not a regular file", hint="give another --out folder")
    return lock, manifest


def write_file(out: Path, result: dict, fmt: str) -> dict:
    """An item's bytes into DIR/<id>.<fmt>, atomically (never through a symlink or over a non-file); its entry."""
    from leapvox.models.files import write_bytes_atomic

    name = f"{result['id']}.{fmt}"
    path = out / name
    if path.is_symlink() or path.exists() and not path.is_file():
        raise OSError(f"{name} exists and is not a regular file")
    write_bytes_atomic(path, result["data"])
    return {"file": name, "bytes": len(result["data"]), "sha256": hashlib.sha256(result["data"]).hexdigest(),
            "seconds": round(result["samples"] / result["sample_rate"], 4), "samples": result["samples"],
            "sample_rate": result["sample_rate"], "stop_reason": result["stop_reason"],
            "warnings": result["warnings"]}


# ---- the command


def _check_args(args) -> None:
    for flag in ("workers", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.asr_check:
        try:
            import jiwer  # noqa: F401
            import pocketsphinx  # noqa: F401
            import scipy  # noqa: F401
        except ImportError:
            raise UsageError("--asr-check needs pocketsphinx, jiwer and scipy", hint='pip install "leapvox[demo]"') \
                from None
    if args.ray is not None:
        from .batch_workers import import_ray

        import_ray()  # not installed: one line now


def _threads(args) -> int:
    if args.threads:
        return args.threads
    if args.ray is not None:
        return 2
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // (args.workers or 1))


def cmd_batch(args) -> int:
    from .batch_workers import Job

    _check_args(args)
    items = read_items(args.input, args.chapters)
    flags = {k: v for k, v in flag_values(args, FLAG_KEYS).items() if v not in (None, False)}
    for warning in check_options(flags, cli_name):
        say(f"warning: {warning}")
    check_out(args.out)
    folder = open_model(args, pull=True, say=quiet_or(args))
    # mode auto and --weights auto: by the tune profile, once for the whole batch (every worker, every Ray node)
    uses_auto = any(({**flags, **it.options}.get("mode") or AUTO) == AUTO for it in items)
    choice = choose(args, folder, AUTO if uses_auto else "ar")
    check_items(items, flags, folder, choice.mode)
    lock, manifest = open_out(args.out)
    job = Job(args.model, choice.weights, _threads(args), args.format, flags, choice.mode)
    key = {"model": args.model, "weights": choice.weights}  # the weights as run: an item made in others is redone
    try:
        dirty = manifest.read()
        done = {it.id for it in items if _done(manifest.entries.get(it.id), args.out,
                                                {**key, "mode": _mode_of(it, job), "item": it.record()})}
        redo = {it.id for it in items} - done
        if dirty or redo & manifest.entries.keys():
            manifest.entries = {i: e for i, e in manifest.entries.items() if i not in redo}
            manifest.rewrite()
        todo = [it for it in items if it.id not in done]
        if not todo:
            say(f"leapvox: batch: nothing to do, all {len(items)} items are done ({args.out / MANIFEST})")
        elif done:
            quiet_or(args)(f"{len(done)} of {len(items)} items done before, {len(todo)} to go")
        code = _run(args, job, key, todo, manifest, len(done), choice.line()) if todo else EXIT_OK
        if code in (EXIT_OK, EXIT_FAILED):
            _asr_check(args, items, manifest)
        return code
    finally:
        manifest.close()
        close_out(lock, args.out)


def close_out(lock, out: Path) -> None:
    """Remove our lock file (still holding the lock, and only if it is ours), then release the lock."""
    if _ours(lock, out / LOCK):
        with contextlib.suppress(OSError):
            (out / LOCK).unlink()
    lock.close()


def _mode_of(it: Item, job) -> str:
    """The mode item `it` runs (its manifest entry records it)."""
    from .batch_workers import run_mode

    return run_mode({**job.flags, **it.options}, job.auto_mode)


def _results(args, job, todo):
    from .batch_workers import run_local, run_ray

    records = (it.record() for it in todo)
    if args.ray is not None:
        return run_ray(job, records, args.ray, args.workers, quiet_or(args), most=len(todo))
    return run_local(job, records, min(args.workers or 1, len(todo)))


def _run(args, job, key: dict, todo: list[Item], manifest: Manifest, skipped: int, chosen: str = "") -> int:
    """Speak `todo`, writing each result as it comes; the summary (with `chosen`: what auto chose, and why); 0 all
    written, 1 some failed, 130 interrupted."""
    import contextlib

    from tqdm import tqdm

    bar = tqdm(total=sum(len(it.text) for it in todo), unit="char", dynamic_ncols=True, leave=False,
               disable=args.quiet or not sys.stderr.isatty(), file=sys.stderr,
               bar_format="leapvox: {desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}")
    by_id = {it.id: it for it in todo}
    ok, failed, audio_s, t0 = 0, [], 0.0, time.perf_counter()
    results = _results(args, job, todo)
    try:
        with contextlib.closing(results):
            bar.set_description_str(f"0/{len(todo)} items")
            for r in results:
                it = by_id[r["id"]]
                entry = {"id": r["id"], "item": it.record(), **key, "mode": _mode_of(it, job), "threads": job.threads}
                try:
                    entry.update(write_file(args.out, r, args.format) if "error" not in r else {"error": r["error"]})
                except OSError as e:
                    entry["error"] = f"cannot write {r['id']}.{args.format}: {e.strerror or e}"
                secs = entry.get("seconds", 0.0)
                entry["timings"] = {"synth_s": round(r["synth_s"], 3), "xrt": round(secs / r["synth_s"], 3)
                                    if r["synth_s"] > 0 else None}
                manifest.append(entry)
                ok, audio_s = ok + ("error" not in entry), audio_s + secs
                if "error" in entry:
                    failed.append(r["id"])
                    bar.write(f"leapvox: {r['id']} failed: {entry['error']}", file=sys.stderr)
                wall = time.perf_counter() - t0
                bar.set_description_str(f"{ok + len(failed)}/{len(todo)} items", refresh=False)
                bar.set_postfix_str(f"xRT {audio_s / wall:.2f}" + (f", {len(failed)} failed" if failed else ""),
                                    refresh=False)
                bar.update(len(by_id[r["id"]].text))
    except (KeyboardInterrupt, RuntimeError) as e:
        if (stop := interruption(e)) is None:
            raise
        bar.close()
        word, status = stop_status(stop)
        say(f"leapvox: {word}: {ok + len(failed)} of {len(todo)} items finished, {skipped} done before, the rest not "
            "started or lost in flight (hint: run the same command again to go on)")
        return status
    bar.close()
    wall = time.perf_counter() - t0
    say(f"leapvox: batch: {ok} written, {skipped} done before, {len(failed)} failed"
        + (f" ({', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''}: see {args.out / MANIFEST})"
           if failed else "")
        + f"; {audio_s:.1f} s of audio in {wall:.1f} s, xRT {audio_s / wall if wall else 0:.2f}, "
        f"{(ok + len(failed)) / wall if wall else 0:.2f} items/s" + (f"; {chosen}" if chosen else ""))
    return EXIT_FAILED if failed else EXIT_OK


# ---- --asr-check: pocketsphinx word errors per item (the demo recipes' judge), outliers against the median

OUTLIER_MADS, OUTLIER_MIN = 3.0, 0.25  # flagged: WER above median + max(3 MADs, 25 points)


def outliers(wers: dict[str, float]) -> tuple[float, float, set[str]]:
    """(median, threshold, ids above it): far above the batch's median by its own spread, and by 25 points at
    least (a batch whose items are all clean does not flag one that lost a word)."""
    med = statistics.median(wers.values())
    mad = statistics.median(abs(w - med) for w in wers.values())
    limit = med + max(OUTLIER_MADS * mad, OUTLIER_MIN)
    return med, limit, {i for i, w in wers.items() if w > limit}


def _asr_check(args, items: list[Item], manifest: Manifest) -> None:
    if not args.asr_check:
        return
    import soundfile as sf

    from leapvox.engine.markup import segments
    from leapvox.models.recipes.demo.quality import asr_input, transcribe_all, word_errors

    scored = [it for it in items if (manifest.entries.get(it.id) or {}).get("file")
              and it.options.get("language", args.language or "auto") in ("auto", "english")]
    if not scored:
        tell("asr check: no English items with files to score")
        return
    clips = []
    for i, it in enumerate(scored):
        wav, rate = sf.read(args.out / manifest.entries[it.id]["file"], dtype="float32")
        clips.append(asr_input(wav, rate, seed=i))
    refs = [" ".join(s for s in segments(it.text) if isinstance(s, str)) for it in scored]  # what is said
    result = word_errors(refs, transcribe_all(clips, max(1, args.workers or 1)))
    wers = {it.id: float(e / w) if w else 0.0 for it, e, w in zip(scored, result.errors, result.words, strict=True)}
    med, limit, flagged = outliers(wers)
    for it, hyp in zip(scored, result.hyps, strict=True):
        manifest.entries[it.id]["asr"] = {"wer": round(wers[it.id], 4), "heard": hyp, "outlier": it.id in flagged}
    manifest.close()
    manifest.rewrite()
    say(f"leapvox: asr check: median WER {100 * med:.1f} % over {len(scored)} items; {len(flagged)} above "
        f"{100 * limit:.1f} %" + (f": {', '.join(sorted(flagged)[:10])}" if flagged else ""))
