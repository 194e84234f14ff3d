"""What leapvox writes where a user names the path (issue #37): a regular file atomically, through a symlink to the
file it names, straight into a FIFO or a character device (never replacing the node), never over the -f text, never
binary into a terminal, in the format the extension names; and hints that say what is really wrong."""

from __future__ import annotations

import errno
import io
import os
import pty
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given
from hypothesis import strategies as st

from leapvox.app.audio import EXTENSIONS, WavWriter, file_format, supported_formats
from leapvox.app.cli import main
from leapvox.models.files import write_bytes_atomic

from .conftest import one_line, run

FAST = ["--max-frames", "2", "--greedy"]  # the bundled demo model (the default): quick, and the same samples each run


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> np.ndarray:
    """The 16-bit samples of `speak Hi. FAST -o x.wav` (a regular file): what every other target must get."""
    path = tmp_path_factory.mktemp("ref") / "x.wav"
    assert main(["speak", "Hi.", "-o", str(path), "-q", *FAST]) == 0
    audio, _ = sf.read(path, dtype="int16")
    assert len(audio) > 0
    return audio


def _reader(path: Path, got: bytearray) -> threading.Thread:
    """A thread that opens the FIFO `path` for reading and keeps all it reads until the writer closes it."""
    def read():
        with open(path, "rb") as f:
            got.extend(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _release(path: Path, t: threading.Thread) -> None:
    """Let a reader still waiting on the FIFO go (when nothing opened it for writing)."""
    for _ in range(1000):  # the reader may not have reached its open() yet: no reader is ENXIO, try again
        if not (t.is_alive() and stat.S_ISFIFO(os.stat(path).st_mode)):
            break
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            break
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            time.sleep(0.01)
    t.join(10)


# ---- targets that are not regular files ---------------------------------------------------------------------------

def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path, capsys, reference):
    fifo = tmp_path / "pipe"  # no extension: a WAV
    os.mkfifo(fifo)
    got = bytearray()
    t = _reader(fifo, got)
    try:
        code, _, err = run(capsys, "speak", "Hi.", "-o", fifo, *FAST)
    finally:
        _release(fifo, t)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # not replaced by a regular file the reader never sees
    audio, sr = sf.read(io.BytesIO(bytes(got)), dtype="int16")  # a streaming header: read to the end of the data
    assert sr == 24000 and np.array_equal(audio, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_symlink_gets_its_target_written_with_the_temp_file_beside_the_target(tmp_path, capsys, monkeypatch,
                                                                                 reference):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (there / "take.wav").write_bytes(b"old")
    link = here / "link.wav"
    link.symlink_to(there / "take.wav")
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append((Path(src).parent, Path(dst)))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    code, _, err = run(capsys, "speak", "Hi.", "-o", link, *FAST)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(there / "take.wav")
    assert np.array_equal(sf.read(there / "take.wav", dtype="int16")[0], reference)
    assert seen == [(there, there / "take.wav")]  # made in the target's folder, renamed onto the target
    assert sorted(p.name for p in here.iterdir()) == ["link.wav"] and sorted(os.listdir(there)) == ["take.wav"]


def test_a_dangling_symlink_makes_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "sub" / "new.json")
    (tmp_path / "sub").mkdir()
    write_bytes_atomic(link, b"{}")
    assert link.is_symlink() and (tmp_path / "sub" / "new.json").read_bytes() == b"{}"


def _node(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device made in tmp_path (1, 3 is null, 1, 7 is full), or a skip saying why there is none."""
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        os.close(os.open(node, os.O_WRONLY))
    except OSError as e:
        pytest.skip(f"cannot make and open a character device here ({e.strerror}); needs root and a folder "
                    "not mounted nodev")
    return node


def test_a_null_device_is_written_into_and_stays_a_device(tmp_path, capsys):
    null = _node(tmp_path, "null", 3)
    code, _, err = run(capsys, "speak", "Hi.", "-o", null, *FAST, "--codes", tmp_path / "codes.json")
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codes.json", "null"]


def test_a_full_device_is_one_line_and_exit_1(tmp_path, capsys):
    full = _node(tmp_path, "full", 7)
    code, out, err = run(capsys, "speak", "Hi.", "-o", full, *FAST)
    line = one_line(err)
    assert code == 1 and out == ""
    assert line.startswith(f"leapvox: error: cannot write {full}: No space left on device (hint: the device is full")
    assert stat.S_ISCHR(os.stat(full).st_mode) and os.listdir(tmp_path) == ["full"]


def test_codes_into_a_full_device_is_one_line(tmp_path, capsys):
    full = _node(tmp_path, "full", 7)
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", *FAST, "--codes", full)
    assert code == 1 and f"cannot write {full}: No space left on device" in one_line(err)
    assert "--codes" in one_line(err) and stat.S_ISCHR(os.stat(full).st_mode)


def test_a_compressed_format_into_a_fifo_arrives_whole(tmp_path):
    """FLAC, MP3 and Ogg Opus into a FIFO (libsndfile cannot seek there): encoded in memory, as the server does."""
    signal = np.sin(np.arange(24000) / 7).astype(np.float32) * 0.3
    for fmt in set(supported_formats()) - {"wav", "pcm"}:
        fifo = tmp_path / f"pipe-{fmt}"
        os.mkfifo(fifo)
        got = bytearray()
        t = _reader(fifo, got)
        try:
            w = WavWriter(fifo, 24000, fmt)
            for part in np.array_split(signal, 5):
                w.write(part)
            w.close()
        finally:
            _release(fifo, t)
        audio, sr = sf.read(io.BytesIO(bytes(got)))
        assert sr == 24000 and len(audio) == len(signal), fmt


# ---- the output is not the input, and not a terminal -------------------------------------------------------------

def test_output_that_is_the_text_file_is_refused_before_the_load(tmp_path, capsys, no_load):
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time.")
    (tmp_path / "alias.wav").symlink_to(text)
    os.link(text, tmp_path / "hard.wav")
    for out in (text, tmp_path / "alias.wav", tmp_path / "hard.wav"):
        code, _, err = run(capsys, "speak", "-f", text, "-o", out)
        assert code == 2 and "is the text file (-f)" in one_line(err), err
    code, _, err = run(capsys, "speak", "-f", text, "-o", tmp_path / "x.wav", "--codes", text)
    assert code == 2 and "--codes" in one_line(err) and "is the text file (-f)" in one_line(err)
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--codes", tmp_path / "x.wav")
    assert code == 2 and "is the -o file" in one_line(err)
    assert text.read_text() == "Once upon a time."
    assert sorted(os.listdir(tmp_path)) == ["alias.wav", "hard.wav", "story.txt"]


def test_standard_output_on_a_terminal_is_refused_before_the_load(tmp_path):
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "leapvox.app.cli", "speak", "Hi.", "-o", "-", *FAST],
                           stdout=slave, stderr=subprocess.PIPE, text=True, timeout=120)
        os.set_blocking(master, False)
        try:
            shown = os.read(master, 1 << 16)
        except BlockingIOError:
            shown = b""
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 2 and shown == b""
    assert "not writing audio into the terminal (standard output)" in one_line(p.stderr)
    assert "loading" not in p.stderr


def test_a_terminal_named_with_o_is_refused_before_the_load(capsys, no_load):
    master, slave = pty.openpty()
    try:
        code, _, err = run(capsys, "speak", "Hi.", "-o", os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)
    assert code == 2 and "not writing audio into the terminal" in one_line(err)


def test_a_block_device_or_socket_is_refused(tmp_path, capsys, no_load):
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.wav"))
    try:
        code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "s.wav")
    finally:
        sock.close()
    assert code == 2 and "it is a socket" in one_line(err)


# ---- the format follows the extension -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt, subtype", [("x.flac", "FLAC", "PCM_16"), ("x.MP3", "MP3", "MPEG_LAYER_III"),
                                                 ("x.ogg", "OGG", "OPUS")])
def test_the_format_follows_the_extension(tmp_path, capsys, reference, name, fmt, subtype):
    if EXTENSIONS[Path(name).suffix.lower()] not in supported_formats():
        pytest.skip(f"this libsndfile cannot write {fmt}")
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / name, *FAST)
    assert code == 0, err
    info = sf.info(tmp_path / name)
    assert (info.format, info.subtype, info.samplerate) == (fmt, subtype, 24000)
    audio, _ = sf.read(tmp_path / name, dtype="int16")
    if fmt == "FLAC":  # lossless: the WAV's samples exactly
        assert np.array_equal(audio, reference)
    else:
        assert abs(len(audio) - len(reference)) <= 1152  # lossy codecs pad by up to a frame
    assert sorted(os.listdir(tmp_path)) == [name]


def test_an_unknown_extension_is_refused_with_the_list(tmp_path, capsys, no_load):
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.xyz")
    line = one_line(err)
    assert code == 2 and "'.xyz' is not an audio format" in line and ".wav, .flac" in line
    assert os.listdir(tmp_path) == []


@given(st.sampled_from(sorted(EXTENSIONS)), st.lists(st.booleans(), min_size=5, max_size=5),
       st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8))
def test_file_format_ignores_case_and_needs_a_known_extension(ext, upper, stem):
    mixed = "".join(c.upper() if u else c for c, u in zip(ext, upper, strict=False))
    if EXTENSIONS[ext] in supported_formats():
        assert file_format(f"{stem}{mixed}") == EXTENSIONS[ext]
    assert file_format(stem) == "wav"  # no extension: WAV, as before
    with pytest.raises(ValueError, match=r"leapvox writes \.wav"):
        file_format(f"{stem}{mixed}x")


def test_a_compressed_file_on_a_full_disk_is_the_disk_error_and_leaves_nothing(tmp_path):
    """libsndfile says only "System error"; the writer raises the file's own OSError and removes its temp file."""
    code = f"""
import resource, signal, numpy as np
from leapvox.app.audio import WavWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))
w = WavWriter({str(tmp_path / 'x.flac')!r}, 24000, "flac")
try:
    for _ in range(20):
        w.write(np.sin(np.arange(24000) / 7).astype(np.float32) * 0.3)
    w.close()
except OSError as e:
    w.abort()
    print(e.errno)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(errno.EFBIG), r.stderr
    assert "cffi" not in r.stderr and os.listdir(tmp_path) == []


# ---- hints that say what is wrong ---------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_text_file_is_named_so(tmp_path, capsys, no_load, encoding, name):
    f = tmp_path / "notes.txt"
    f.write_bytes((("\ufeff" if encoding.endswith("-be") else "") + "Hello there.").encode(encoding))
    code, _, err = run(capsys, "speak", "-f", f, "-o", tmp_path / "x.wav")
    line = one_line(err)
    assert code == 2 and f"it is {name} text" in line and f"iconv -f {name} -t UTF-8" in line and "latin1" not in line


def test_utf16_on_standard_input_is_named_so(tmp_path, capsys, monkeypatch, no_load):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("Hi.".encode("utf-16")), encoding="utf-8"))
    code, _, err = run(capsys, "speak", "-", "-o", tmp_path / "x.wav")
    assert code == 2 and "it is UTF-16 text" in one_line(err) and "iconv -f UTF-16" in one_line(err)


def test_a_damaged_file_in_a_local_folder_says_which_and_not_download(tmp_path, capsys):
    import shutil

    from leapvox.models.catalog import DEMO_DIR

    model = tmp_path / "model"
    shutil.copytree(DEMO_DIR, model)
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", model, *FAST)
    line = one_line(err)
    assert code == 1 and f"{model / 'model.safetensors'} is damaged" in line
    assert f"hint: replace {model / 'model.safetensors'} with an intact copy" in line and "download" not in line
    (model / "model.safetensors").unlink()
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", model, *FAST)
    assert code == 1 and f"hint: put the checkpoint's model.safetensors in {model}" in one_line(err)


def test_a_damaged_bundled_file_says_reinstall():
    from leapvox.models.catalog import DEMO_DIR
    from leapvox.models.checkpoint import DamagedFileError

    hint = DamagedFileError("x", DEMO_DIR / "model.safetensors").hint
    assert hint == "reinstall leapvox to restore the bundled model"
