"""Model manager against a fake Hub on 127.0.0.1 (tests/hubserver.py), reached by the real huggingface_hub client
through HF_ENDPOINT. The CLI runs in subprocesses so that huggingface_hub reads HF_* from the environment as it
does for a user. Nothing here touches the internet.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leapvox.engine.errors import ModelNotFoundError
from leapvox.models.catalog import CATALOG, CatalogEntry, resolve_model

from .conftest import FIXTURES, SESSION_KERNEL_CACHE
from .hubserver import FakeHub

TINY = FIXTURES / "tiny-0b6"
REPO = "test/tiny-0b6"
FAST = ["--max-frames", "3", "--greedy"]
# Runs the CLI with the catalog extended by $LEAPVOX_TEST_CATALOG (a monkeypatch in the child process).
RUNNER = (
    "import json, os, sys\n"
    "from leapvox.models import catalog\n"
    "for k, v in json.loads(os.environ.get('LEAPVOX_TEST_CATALOG', '{}')).items():\n"
    "    catalog.CATALOG[k] = catalog.CatalogEntry(**{**v, 'files': tuple(v['files'])})\n"
    "from leapvox.app.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def hub():
    h = FakeHub()
    h.commit = h.add_folder(REPO, TINY)
    h.add_folder("test/private", TINY, token="secret")
    h.add_folder("test/huge", TINY, reported_sizes={"model.safetensors": 10**15})
    yield h
    h.close()


@pytest.fixture
def cli(hub, tmp_path):
    """run(*argv, **env) → CompletedProcess, with a fresh HF cache and leapvox home in tmp_path."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith(("HF_", "LEAPVOX"))}
    tiny = {"name": "tiny", "description": "tiny test model", "repo_id": REPO, "revision": hub.commit,
            "files": list(CATALOG["qwen3-tts-0.6b"].files), "size_bytes": 3_400_000}
    env.update(
        HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"),
        LEAPVOX_HOME=str(tmp_path / "lv"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
        NO_PROXY="127.0.0.1,localhost", LEAPVOX_TEST_CATALOG=json.dumps({"tiny": tiny}),
    )

    def run(*argv, stdin=None, **extra):
        return subprocess.run(
            [sys.executable, "-c", RUNNER, *map(str, argv)], env={**env, **extra}, capture_output=True, text=True,
            input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, timeout=120,
        )

    if SESSION_KERNEL_CACHE.is_dir():  # the session's compiled kernel, not a fresh build per subprocess
        (tmp_path / "lv" / "cache").mkdir(parents=True)
        (tmp_path / "lv" / "cache" / "kernels").symlink_to(SESSION_KERNEL_CACHE, target_is_directory=True)
    run.cache = tmp_path / "hf" / "hub"
    run.snapshot = run.cache / "models--test--tiny-0b6" / "snapshots" / hub.commit
    return run


def one_line_error(p) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("leapvox: error: ") and p.stdout == ""
    return lines[0]


def same_files(folder: Path) -> bool:
    return all((folder / p.relative_to(TINY)).read_bytes() == p.read_bytes() for p in TINY.rglob("*") if p.is_file())


def test_first_pull_list_info_verify_and_offline_reuse(hub, cli):
    p = cli("models", "pull", "tiny")
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == cli.snapshot and same_files(cli.snapshot)
    assert "downloading tiny (test/tiny-0b6@" in p.stderr and "3.4 MB in 10 files" in p.stderr
    assert "%|" not in p.stderr  # no progress bars when stderr is not a terminal
    assert (cli.snapshot.parent.parent / "blobs").is_dir()  # the standard cache layout, filled by huggingface_hub

    p = cli("models", "pull", "tiny")
    assert p.returncode == 0 and "already downloaded" in p.stderr

    p = cli("models", "list")
    assert p.returncode == 0
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("tiny "))
    assert "downloaded" in row and "3.4 MB" in row
    demo = next(ln for ln in p.stdout.splitlines() if ln.startswith("demo "))
    assert " bundled " in demo and "not bundled" not in demo  # shipped as package data

    p = cli("models", "info", "tiny")
    assert p.returncode == 0 and f"revision     {hub.commit}" in p.stdout and str(cli.snapshot) in p.stdout

    p = cli("models", "verify", "tiny")
    assert p.returncode == 0 and p.stdout.count("ok ") == 10 and "reported by http://127.0.0.1" in p.stderr

    before = len(hub.requests)
    p = cli("models", "verify", "tiny", HF_HUB_OFFLINE="1")
    assert p.returncode == 0 and "recorded at pull time" in p.stderr
    p = cli("speakers", "--model", "tiny", HF_HUB_OFFLINE="1")
    assert p.returncode == 0 and "vivian" in p.stdout
    assert len(hub.requests) == before  # offline means no request at all


def test_speak_pulls_on_first_use_then_works_offline(hub, cli, tmp_path):
    model = f"{REPO}@{hub.commit}"
    p = cli("speak", "Hello.", "-o", tmp_path / "a.wav", "--model", model, *FAST, "--codes", tmp_path / "a.json")
    assert p.returncode == 0, p.stderr
    downloads = [ln for ln in p.stderr.splitlines() if "downloading" in ln]
    assert len(downloads) == 1 and "3.4 MB" in downloads[0]  # the size, stated once, before fetching
    assert (tmp_path / "a.wav").stat().st_size > 44

    p = cli("speak", "Hello.", "-o", tmp_path / "b.wav", "--model", model, *FAST, "--codes", tmp_path / "b.json",
            HF_HUB_OFFLINE="1")
    assert p.returncode == 0, p.stderr
    assert "downloading" not in p.stderr
    assert (tmp_path / "b.json").read_text() == (tmp_path / "a.json").read_text()  # same greedy codes


def test_interrupted_download_resumes(hub, cli):
    # huggingface_hub reads bodies in 10 MiB chunks and resumes from the last whole chunk: serve 24 MB weights
    weights = hashlib.sha256(b"leapvox").digest() * (24_000_000 // 32)
    sha = hashlib.sha256(weights).hexdigest()
    files = {p.relative_to(TINY).as_posix(): p.read_bytes() for p in TINY.rglob("*") if p.is_file()}
    commit = hub.add_repo("test/padded", {**files, "model.safetensors": weights})
    hub.drop_once.add(sha)
    p = cli("models", "pull", "test/padded")
    assert p.returncode == 0, p.stderr
    assert sha not in hub.drop_once  # the connection was cut mid-file ...
    ranges = [r for o, m, path, r in hub.requests if o == "cdn" and path.endswith(sha) and r]
    assert ranges and int(ranges[-1].removeprefix("bytes=").rstrip("-")) > 0  # ... and the GET resumed from there
    snapshot = cli.cache / "models--test--padded" / "snapshots" / commit
    assert (snapshot / "model.safetensors").read_bytes() == weights
    assert cli("models", "verify", "test/padded").returncode == 0


def test_corrupted_file_is_detected_never_loaded_and_refetched(hub, cli, tmp_path):
    assert cli("models", "pull", "tiny").returncode == 0
    weights = cli.snapshot / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # same size, different content
    Path(os.path.realpath(weights)).write_bytes(bytes(data))
    (cli.snapshot / "vocab.json").unlink()  # and a partial snapshot

    line = one_line_error(cli("speakers", "--model", "tiny"))
    assert "incomplete or damaged" in line and "leapvox models pull tiny" in line
    p = cli("speak", "Hi.", "-o", tmp_path / "x.wav", "--model", "tiny", *FAST, HF_HUB_OFFLINE="1")
    assert p.returncode == 1 and "damaged" in one_line_error(p) and not (tmp_path / "x.wav").exists()

    p = cli("models", "verify", "tiny")
    assert p.returncode == 1
    failed = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("FAILED")}
    assert failed == {"model.safetensors", "vocab.json"}, p.stdout

    p = cli("models", "pull", "tiny")
    assert p.returncode == 0, p.stderr
    assert "model.safetensors of tiny" in p.stderr and "damaged" in p.stderr
    assert same_files(cli.snapshot) and cli("models", "verify", "tiny").returncode == 0


def test_a_cached_file_damaged_unseen_gets_the_hint_that_repairs_it(hub, cli, tmp_path):
    """A file damaged in place with its size and time kept passes the quick check and fails to load: the hint names
    the steps that repair it (verify hashes it, pull fetches it again), not a local folder's."""
    assert cli("models", "pull", "tiny").returncode == 0
    blob = Path(os.path.realpath(cli.snapshot / "model.safetensors"))
    st = blob.stat()
    with open(blob, "r+b") as f:
        f.write(b"\xff" * 8)  # the header length: far too large
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    p = cli("speak", "Hi.", "-o", tmp_path / "x.wav", "--model", "tiny", *FAST)
    line = one_line_error(p)
    assert p.returncode == 1 and "model.safetensors is damaged" in line
    assert line.endswith("(hint: run: leapvox models verify tiny; then leapvox models pull tiny)")
    assert cli("models", "verify", "tiny").returncode == 1
    assert cli("models", "pull", "tiny").returncode == 0 and same_files(cli.snapshot)
    assert cli("speak", "Hi.", "-o", tmp_path / "x.wav", "--model", "tiny", *FAST).returncode == 0


def test_unknown_repo_is_404(cli, tmp_path):
    line = one_line_error(p := cli("models", "pull", "test/nope"))
    assert p.returncode == 2 and "test/nope was not found" in line and "404" in line
    p = cli("speak", "Hi.", "-o", tmp_path / "x.wav", "--model", "test/nope@main", *FAST)
    assert p.returncode == 2 and "404" in one_line_error(p)


def test_private_repo_needs_token(cli):
    line = one_line_error(p := cli("models", "pull", "test/private"))
    assert p.returncode == 1 and "401" in line and "HF_TOKEN" in line
    p = cli("models", "pull", "test/private", HF_TOKEN="wrong")
    assert p.returncode == 1 and "401" in one_line_error(p)
    p = cli("models", "pull", "test/private", HF_TOKEN="secret")
    assert p.returncode == 0, p.stderr
    # pulled by branch (main): found again offline through the cache's refs/main
    p = cli("models", "verify", "test/private", HF_HUB_OFFLINE="1")
    assert p.returncode == 0 and "recorded at pull time" in p.stderr


def test_offline_with_nothing_cached(hub, cli, tmp_path):
    before = len(hub.requests)
    p = cli("speak", "Hi.", "-o", tmp_path / "x.wav", "--model", "tiny", *FAST, HF_HUB_OFFLINE="1")
    line = one_line_error(p)
    assert p.returncode == 1 and "tiny (test/tiny-0b6@" in line and ", ~3.4 MB)" in line
    assert "HF_ENDPOINT" in line and "--model PATH" in line and "copy" in line
    assert len(hub.requests) == before
    # no network at all (nothing listens there): the same advice
    p = cli("models", "pull", "tiny", HF_ENDPOINT="http://127.0.0.1:9")
    assert p.returncode == 1 and "cannot reach http://127.0.0.1:9" in one_line_error(p)


def test_not_enough_disk_space_is_caught_before_downloading(hub, cli):
    p = cli("models", "pull", "test/huge")
    line = one_line_error(p)
    assert p.returncode == 1 and "not enough disk space" in line and "HF_HUB_CACHE" in line
    assert not any("/test/huge/resolve/" in path for path in hub.paths())


def test_rm_asks_unless_yes(cli):
    assert cli("models", "pull", "tiny").returncode == 0
    p = cli("models", "rm", "tiny")  # stdin is not a terminal
    assert p.returncode == 2 and "--yes" in one_line_error(p) and cli.snapshot.is_dir()
    p = cli("models", "rm", "tiny", "--yes")
    assert p.returncode == 0, p.stderr
    assert not cli.snapshot.parent.parent.exists()
    assert not list((cli.cache.parent.parent / "lv").rglob("*.json"))  # leapvox's manifest went too
    assert "not downloaded" in cli("models", "list").stdout
    p = cli("models", "rm", "tiny", "--yes")
    assert p.returncode == 0 and "nothing to remove" in p.stderr


def test_paths_prints_hf_cache_and_leapvox_dirs(cli, tmp_path):
    p = cli("paths")
    assert p.returncode == 0 and p.stderr == ""
    rows = dict(ln.split(None, 1) for ln in p.stdout.splitlines())
    assert rows["hf-cache"] == str(tmp_path / "hf" / "hub")
    assert {"data", "config", "cache", "offsets", "trees", "coreml", "settings"} <= set(rows)
    assert all(v.startswith(str(tmp_path)) for v in rows.values())


def test_resolve_model_accepts_names_repos_and_folders(tmp_path):
    demo = tmp_path / "demo"
    catalog = {"demo": CatalogEntry(name="demo", description="d", bundled=demo)}
    with pytest.raises(ModelNotFoundError, match="not bundled yet"):
        resolve_model("demo", catalog)
    demo.mkdir()
    (demo / "config.json").write_text("{}")
    assert resolve_model("demo", catalog).folder == demo  # appears once the bundled folder exists

    spec = resolve_model("qwen3-tts-0.6b")
    assert spec.repo_id == "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" and spec.revision.startswith("85e237c")
    spec = resolve_model("org/name@v1.0", catalog)
    assert (spec.repo_id, spec.revision, spec.folder) == ("org/name", "v1.0", None)
    assert resolve_model(str(TINY), catalog).folder == TINY
    assert resolve_model("./no/such/folder", catalog).folder == Path("./no/such/folder")
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        resolve_model("qwen-nonsense", catalog)
