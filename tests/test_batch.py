"""`leapvox batch` on the bundled demo model (fp32, one thread per worker: the same samples on every route): input
parsing (JSONL, CSV with quoted commas and newlines, lines, a book's chapters), everything refused before the model
loads, per-item errors and the exit code, an interrupted run (a real SIGINT to a real process) resumed without
duplicates or half files, --workers 2 and --ray local against one worker, and batch against speak."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from leapvox.app.batch import derive_seed, outliers, read_items

from .conftest import one_line, run

FAST = ("--weights", "fp32", "--threads", "1", "--max-frames", "30")
SHORT = (*FAST[:-1], "12")  # 12 frames at most: about a second of audio
TEXTS = ["Hello there.", "A second, shorter one.", "The third item is here."]
# An interrupted run is sent SIGINT once its first item is recorded: with this many short items some are still to
# come however late that signal lands on a busy machine (with 3 or 4 items a loaded CI box could finish them first).
INTERRUPTED_ITEMS = 8


def jsonl(tmp_path: Path, rows: list[dict], name: str = "items.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def without_timings(entries: list[dict]) -> dict:
    return {e["id"]: {k: v for k, v in e.items() if k != "timings"} for e in entries}


def leftovers(out: Path) -> list[str]:
    """What a finished run must not leave in DIR: temp files, or its lock file."""
    from leapvox.app.batch import LOCK

    return [p.name for p in out.iterdir() if p.name.endswith(".part") or p.name == LOCK]


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if batch gets as far as loading the model."""
    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("leapvox.models.load.load_model", load)


# ---- input, refused before any work


def test_csv_quoted_commas_and_newlines_keep_their_lines(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text('id,text,seed\na,"Hello, world.",5\nb,"Two lines,\nin one field.",\nc,Plain.,\n')
    items = read_items(path)
    assert [(i.id, i.text, i.options) for i in items] == [
        ("a", "Hello, world.", {"seed": 5}), ("b", "Two lines,\nin one field.", {}), ("c", "Plain.", {})]
    assert [i.where for i in items] == ["items.csv line 2", "items.csv line 3", "items.csv line 5"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from(',"\n'),
                        min_size=1).filter(lambda t: any(c.isalnum() for c in t)), min_size=1, max_size=5))
def test_csv_round_trips_any_text(tmp_path_factory, texts):
    """Whatever a CSV writer quotes (commas, quotes, line breaks, any script) comes back as the same text."""
    path = tmp_path_factory.mktemp("csv") / "items.csv"
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["id", "text"])
    w.writerows([[f"i{n}", t] for n, t in enumerate(texts)])
    path.write_text(buf.getvalue(), newline="")
    from leapvox.app.common import clean_text

    assert [i.text for i in read_items(path)] == [clean_text(t) for t in texts]


def test_chapters_split_at_headings(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("A Tale\nby Someone\n\nCHAPTER I.\nIt was dark.\nPart of the problem was the rain.\n\n"
                    "Chapter Two: The Storm\nThe wind rose.\n\n# Epilogue\nAll was well.\n")
    items = read_items(book, chapters=True)
    assert [(i.id, i.text) for i in items] == [
        ("front-matter", "A Tale\nby Someone"),
        ("chapter-01", "CHAPTER I.\n\nIt was dark.\nPart of the problem was the rain."),
        ("chapter-02", "Chapter Two: The Storm.\n\nThe wind rose."),
        ("chapter-03", "Epilogue.\n\nAll was well."),
    ]
    assert items[2].where == "book.txt line 8"
    assert [i.id for i in read_items(book)] == ["0001", "0002", "0004", "0005", "0006", "0008", "0009", "0011",
                                               "0012"]  # without --chapters: one item a line


@pytest.mark.parametrize("rows, expected", [
    ([{"id": "a", "text": "One."}, {"id": "A", "text": "Two."}], "line 2: duplicate id 'A', also on line 1"),
    ([{"id": "../etc/x", "text": "One."}], "line 1: id '../etc/x' is not a safe file name"),
    ([{"id": ".hidden", "text": "One."}], "line 1: id '.hidden' is not a safe file name"),
    ([{"id": "a", "text": "One.", "speeker": "leap"}], "line 1: unknown field 'speeker'"),
    ([{"id": "a", "text": "!!! ???"}], "line 1: the text has nothing to say"),
    ([{"id": "a", "text": "One."}, {"id": "b", "text": "Two.", "speaker": "nobody"}],
     "line 2: unknown speaker 'nobody'"),
    ([{"id": "a", "text": "One.", "seed": -1}], "line 1: seed must be an integer"),
    ([{"id": "a", "text": "One.", "mode": "fast"}], "line 1: unknown decoding mode 'fast'"),
])
def test_bad_items_refused_before_the_model_loads(tmp_path, capsys, no_model, rows, expected):
    out = tmp_path / "out"
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", out, *FAST)
    assert code == 2
    assert expected in one_line(err)
    assert not out.exists()  # nothing made either


def test_missing_extras_and_bad_flags_are_one_line(tmp_path, capsys, no_model, monkeypatch):
    path = jsonl(tmp_path, [{"id": "a", "text": "One."}])
    code, _, err = run(capsys, "batch", path, "--out", tmp_path / "o", "--workers", "0")
    assert code == 2 and "--workers must be >= 1" in one_line(err)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    code, _, err = run(capsys, "batch", path, "--out", tmp_path / "o", "--ray", "local")
    assert code == 2 and 'pip install "leapvox[ray]"' in one_line(err)
    code, _, err = run(capsys, "batch", path, "--out", tmp_path / "o", "--chapters")
    assert code == 2 and "--chapters splits a plain text file" in one_line(err)


def test_a_second_batch_into_a_locked_folder_is_one_line_before_the_model_loads(tmp_path, capsys, no_model):
    """A run holding DIR's lock (here: this test, as another batch would) makes a second run into DIR refuse at once,
    one line, exit 2; a lock file planted as a symlink is refused, never followed."""
    import fcntl

    from leapvox.app.batch import LOCK

    path, out = jsonl(tmp_path, [{"id": "a", "text": "Hello."}]), tmp_path / "out"
    out.mkdir()
    with open(out / LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, _, err = run(capsys, "batch", path, "--out", out, *SHORT)
    assert code == 2 and "another leapvox batch is writing into" in one_line(err)
    (out / LOCK).unlink()
    (out / LOCK).symlink_to(tmp_path / "elsewhere")
    code, _, err = run(capsys, "batch", path, "--out", out, *SHORT)
    assert code == 2 and "is not a regular file" in one_line(err) and not (tmp_path / "elsewhere").exists()


def test_a_lock_file_replaced_under_every_try_is_refused_as_busy(tmp_path, monkeypatch):
    """Runs finishing and starting between our open and our lock (the file we locked is no longer the one at the
    path) are retried; three misses in a row mean the folder is busy: the same one-line refusal, no lock left open."""
    from leapvox.app import batch

    opened = []
    real_open = open

    def tracking_open(path, *a, **k):
        f = real_open(path, *a, **k)
        opened.append(f)
        return f

    monkeypatch.setattr(batch, "_ours", lambda lock, path: False)
    monkeypatch.setattr(batch, "open", tracking_open, raising=False)  # the module's open, not everyone's
    with pytest.raises(batch.UsageError, match="another leapvox batch is writing into"):
        batch.open_out(tmp_path / "out")
    monkeypatch.undo()
    assert len(opened) == 3 and all(f.closed for f in opened)
    lock, manifest = batch.open_out(tmp_path / "out")  # the folder itself is fine: a real try takes it
    assert not lock.closed
    batch.close_out(lock, tmp_path / "out")
    assert not (tmp_path / "out" / batch.LOCK).exists()


def test_seeds_derive_from_the_id_alone():
    assert derive_seed("a1") == derive_seed("a1") != derive_seed("a2")
    assert 0 <= derive_seed("x" * 128) < 2**64


def test_outliers_are_far_above_the_median():
    med, limit, flagged = outliers({"a": 0.1, "b": 0.12, "c": 0.08, "d": 0.11, "e": 0.9})
    assert (med, flagged) == (0.11, {"e"}) and 0.11 < limit < 0.9
    assert outliers({"a": 0.0, "b": 0.0, "c": 0.2})[2] == set()  # clean items: one lost word is no outlier
    assert outliers({"a": 0.5, "b": 0.6, "c": 0.55, "d": 0.58})[2] == set()


# ---- synthesis


def test_items_written_failures_recorded_then_retried_and_done_ones_skipped(tmp_path, capsys):
    """Run 1: b's file cannot be written (a folder is in its place): recorded as b's error, a and c written, exit 1.
    Run 2, b's way cleared and a's text edited: b and a spoken again (their entries replaced), c skipped. Run 3:
    nothing to do, no file touched."""
    rows = [{"id": i, "text": t} for i, t in zip("abc", TEXTS, strict=True)]
    rows[2]["seed"] = 7
    out = tmp_path / "out"
    (out / "b.wav").mkdir(parents=True)
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", out, *FAST)
    assert code == 1
    assert "2 written, 0 done before, 1 failed (b: see" in err.splitlines()[-1]
    entries = {e["id"]: e for e in manifest(out)}
    assert "not a regular file" in entries["b"]["error"] and "file" not in entries["b"]
    for e in (entries["a"], entries["c"]):
        audio, rate = sf.read(out / e["file"])
        assert (rate, len(audio), e["sha256"], e.get("error")) == (24000, e["samples"], sha(out / e["file"]), None)
        assert e["seconds"] == pytest.approx(len(audio) / rate, abs=1e-4) and e["seconds"] > 0.3
    assert [entries[i]["item"]["options"]["seed"] for i in "abc"] == [derive_seed("a"), derive_seed("b"), 7]
    (out / "b.wav").rmdir()
    rows[0]["text"] = "Changed text."
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", out, *FAST)
    assert code == 0 and "2 written, 1 done before, 0 failed" in err
    assert [(e["id"], e["item"]["text"]) for e in manifest(out)][0] == ("c", TEXTS[2])
    assert sorted((e["id"], e["item"]["text"]) for e in manifest(out)) == [("a", "Changed text."), ("b", TEXTS[1]),
                                                                            ("c", TEXTS[2])]
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav")}
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", out, *FAST)
    assert code == 0 and "nothing to do, all 3 items are done" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav")} == before


def test_batch_gives_speak_s_samples(tmp_path, capsys):
    import torch

    torch.set_num_threads(1)  # as --threads 1 (the fixture restores the session's count)
    code, _, err = run(capsys, "speak", TEXTS[0], "-o", tmp_path / "speak.wav", "--seed", "7", "--weights", "fp32",
                       "--max-frames", "30")
    assert code == 0, err
    code, _, err = run(capsys, "batch", jsonl(tmp_path, [{"id": "s", "text": TEXTS[0], "seed": 7}]), "--out",
                       tmp_path / "out", *FAST, "--format", "flac")
    assert code == 0, err
    a, _ = sf.read(tmp_path / "speak.wav", dtype="int16")
    b, _ = sf.read(tmp_path / "out" / "s.flac", dtype="int16")
    assert np.array_equal(a, b)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "leapvox.app.cli", *map(str, args)]


def interrupted(cmd: list[str], out: Path) -> list[dict]:
    """`cmd`, a batch into `out`, in a real process, sent SIGINT once it has recorded its first item: a one-line
    message and exit 130, no temp file, none of its processes left. The entries it recorded."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    mf = out / "manifest.jsonl"
    while proc.poll() is None and not (mf.exists() and mf.read_text().count("\n") >= 1):
        time.sleep(0.05)
    children = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in one_line(err) and "run the same command again" in err
    assert leftovers(out) == []
    time.sleep(0.5)
    assert [pid for pid in children if running(pid)] == []  # a pool's processes stopped with it
    return manifest(out)


def test_interrupted_batch_resumes_without_duplicates_or_half_files(tmp_path, capsys):
    """Interrupted (above) after its first item; a torn manifest line (a crash mid-append) is tolerated; the rerun
    speaks only what is missing, and every item is recorded once, with its file."""
    rows = [{"id": f"i{n}", "text": f"Item {n}."} for n in range(INTERRUPTED_ITEMS)]
    path, out = jsonl(tmp_path, rows), tmp_path / "out"
    first = interrupted(cli("batch", path, "--out", out, *SHORT), out)
    assert 1 <= len(first) < len(rows)
    with open(out / "manifest.jsonl", "a") as f:
        f.write('{"id": "i3", "item": {"id"')  # torn: the crash came mid-line
    code, _, err = run(capsys, "batch", path, "--out", out, *SHORT)
    assert code == 0, err
    assert f"{len(first)} of {len(rows)} items done before" in err
    entries = manifest(out)
    assert sorted(e["id"] for e in entries) == [r["id"] for r in rows]
    assert all(sha(out / e["file"]) == e["sha256"] for e in entries)
    assert {e["id"]: e["sha256"] for e in first}.items() <= {e["id"]: e["sha256"] for e in entries}.items()
    assert sorted(p.name for p in out.glob("*.wav")) == sorted(f"{r['id']}.wav" for r in rows) and leftovers(out) == []


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """The reference: INTERRUPTED_ITEMS short items (the TEXTS in turn) through one local worker, in this process."""
    import torch

    from leapvox.app.cli import main

    tmp, threads = tmp_path_factory.mktemp("ref"), torch.get_num_threads()
    rows = [{"id": f"r{n}", "text": TEXTS[n % len(TEXTS)]} for n in range(INTERRUPTED_ITEMS)]
    path, out = jsonl(tmp, rows), tmp / "out"
    try:
        assert main([str(a) for a in ("batch", path, "--out", out, *SHORT, "-q")]) == 0
    finally:
        torch.set_num_threads(threads)  # set before the per-test fixture that restores it
    return path, out


def same_run(a: Path, b: Path) -> None:
    assert without_timings(manifest(a)) == without_timings(manifest(b))
    assert {p.name: sha(p) for p in a.glob("*.wav")} == {p.name: sha(p) for p in b.glob("*.wav")}


@pytest.mark.slow
def test_two_workers_interrupted_and_resumed_equal_one(one_worker, tmp_path):
    """--workers 2: interrupted (its pool stopped, nothing half written), resumed, the same files and manifest as
    one worker's run."""
    path, ref = one_worker
    out = tmp_path / "out"
    assert len(interrupted(cli("batch", path, "--out", out, *SHORT, "--workers", "2"), out)) < INTERRUPTED_ITEMS
    done = subprocess.run(cli("batch", path, "--out", out, *SHORT, "--workers", "2"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    same_run(ref, out)


@pytest.mark.slow
def test_ray_local_equals_local(one_worker, tmp_path):
    pytest.importorskip("ray", reason='the Ray route needs ray: pip install "leapvox[ray]"')
    path, ref = one_worker
    done = subprocess.run(cli("batch", path, "--out", tmp_path / "out", *SHORT, "--ray", "local"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ray: started a local cluster" in done.stderr
    same_run(ref, tmp_path / "out")


def test_pause_markup_is_silence(tmp_path, capsys):
    rows = [{"id": "p", "text": "One. [pause 1s] Two.", "seed": 3}]
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", tmp_path / "out", *FAST)
    assert code == 0, err
    audio, rate = sf.read(tmp_path / "out" / "p.wav")
    quiet = np.abs(audio) < 1e-3
    longest, n = 0, 0
    for q in quiet:
        n = n + 1 if q else 0
        longest = max(longest, n)
    assert longest >= 0.95 * rate


@pytest.mark.slow  # the ASR's own process pool and models: half a minute
def test_asr_check_records_word_errors(tmp_path, capsys):
    pytest.importorskip("pocketsphinx", reason='--asr-check needs pip install "leapvox[demo]"')
    rows = [{"id": f"w{n}", "text": t} for n, t in enumerate(TEXTS[:2])]
    code, _, err = run(capsys, "batch", jsonl(tmp_path, rows), "--out", tmp_path / "out", *FAST, "--asr-check")
    assert code == 0, err
    assert "asr check: median WER" in err.splitlines()[-1]
    from leapvox.models.recipes.demo.quality import word_errors

    for e in manifest(tmp_path / "out"):
        r = word_errors([e["item"]["text"]], [e["asr"]["heard"]])
        assert e["asr"]["wer"] == pytest.approx(r.wer, abs=1e-4) and e["asr"]["outlier"] is False
