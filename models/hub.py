"""Models in the Hugging Face cache: pull, check, verify, remove. A thin layer over huggingface_hub.

huggingface_hub does the downloading, the cache layout and the environment (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT,
HF_TOKEN, HF_HUB_OFFLINE). leapvox adds a small manifest per snapshot in its own data folder: the size and hash the
Hub reported for every file at pull time (LFS sha256, or git blob sha1 for small files), plus the size and mtime
of each file when it last hashed correctly, so that a load re-hashes only files that changed on disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from leapvox.engine.errors import LeapvoxError, ModelNotFoundError

from .catalog import CATALOG, CatalogEntry, ModelSpec, human_size, resolve_model
from .files import write_text_atomic
from .paths import check_folder, leapvox_dirs

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Files without which a checkpoint cannot load, whatever else the repo holds.
ESSENTIAL = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "speech_tokenizer/config.json",
             "speech_tokenizer/model.safetensors")


class DownloadError(LeapvoxError):
    """The Hub or the disk stopped a download: network, authorisation, disk space, a file that fails its hash."""


class NotCachedError(DownloadError):
    """The model is not (completely) in the cache and may not or cannot be fetched now."""


def _say_nothing(msg: str) -> None:
    pass


# ---- where files live ------------------------------------------------------------------------------------------

def hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def hf_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def repo_folder(repo_id: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return hf_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")


def cached_commit(spec: ModelSpec) -> str | None:
    """The commit the cache holds for the spec's revision (a commit hash, or a branch/tag recorded in refs/)."""
    rev = spec.revision or "main"
    if COMMIT.match(rev):
        return rev
    ref = repo_folder(spec.repo_id) / "refs" / rev
    return ref.read_text().strip() if ref.is_file() else None


# ---- manifest: what the Hub said each file is ------------------------------------------------------------------

def _manifest_path(repo_id: str, commit: str) -> Path:
    return leapvox_dirs()["manifests"] / repo_folder(repo_id).name / f"{commit}.json"


def load_manifest(repo_id: str, commit: str) -> dict | None:
    try:
        m = json.loads(_manifest_path(repo_id, commit).read_text(encoding="utf-8"))
        return m if isinstance(m.get("files"), dict) else None
    except (OSError, ValueError):
        return None


def save_manifest(m: dict) -> None:
    path = _manifest_path(m["repo_id"], m["commit"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(m, indent=1, sort_keys=True))


def manifest_from_hub(spec: ModelSpec) -> dict:
    """Ask the Hub for the revision's commit and the size and hash of each file leapvox needs."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    try:
        info = HfApi().model_info(spec.repo_id, revision=spec.revision, files_metadata=True)
    except Exception as e:
        raise hub_error(e, spec) from None
    wanted = set(filter_repo_objects([s.rfilename for s in info.siblings or []], allow_patterns=list(spec.files)))
    files = {
        s.rfilename: {
            "size": s.lfs.size if s.lfs else s.size,
            "sha256": s.lfs.sha256 if s.lfs else None,
            "git_sha1": None if s.lfs else s.blob_id,
        }
        for s in info.siblings or []
        if s.rfilename in wanted
    }
    lacking = [f for f in ESSENTIAL if f not in files]
    if lacking:
        raise ModelNotFoundError(
            f"{spec.repo_id} has no {lacking[0]}: it is not a Qwen3-TTS CustomVoice checkpoint",
            hint="use a *-CustomVoice repo (leapvox models list shows the known ones)",
        )
    return {"repo_id": spec.repo_id, "commit": info.sha, "source": "hub", "files": files, "checked": {}}


def manifest_from_cache(spec: ModelSpec, commit: str) -> dict:
    """For a cache that leapvox did not fill (copied, or fetched by another tool): the blob names are the hashes."""
    snapshot = repo_folder(spec.repo_id) / "snapshots" / commit
    files = {}
    for name in spec.files:
        f = snapshot / name
        if not (f.exists() or name in ESSENTIAL):
            continue
        blob = Path(os.path.realpath(f)).name if f.is_symlink() else ""
        files[name] = {
            "size": None,
            "sha256": blob if len(blob) == 64 else None,
            "git_sha1": blob if len(blob) == 40 else None,
        }
    return {"repo_id": spec.repo_id, "commit": commit, "source": "cache", "files": files, "checked": {}}


# ---- checking files against the manifest -----------------------------------------------------------------------

def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def file_hash(path: Path, algorithm: str) -> str:
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    with open(path, "rb") as f:
        return sha_fileobj(f).hex() if algorithm == "sha256" else git_hash(f.read())


def check_file(snapshot: Path, name: str, record: dict, m: dict, mode: str) -> str | None:
    """None if the file is there and matches its record, else what is wrong. Records the stamp of a good hash.

    mode: "quick" checks presence and size only; "changed" also hashes files whose size or mtime changed since
    they last hashed correctly; "deep" hashes every file.
    """
    path = snapshot / name
    if not path.exists():
        return "missing"
    size = path.stat().st_size
    if record.get("size") is not None and size != record["size"]:
        return f"{size} bytes, the Hub reported {record['size']}"
    if mode == "quick" or (mode == "changed" and m["checked"].get(name) == _stamp(path)):
        return None
    algorithm = "sha256" if record.get("sha256") else "git_sha1" if record.get("git_sha1") else None
    if algorithm and file_hash(path, algorithm) != record[algorithm]:
        m["checked"].pop(name, None)
        return f"{algorithm} differs from the one the Hub reported"
    m["checked"][name] = _stamp(path)
    return None


def check_snapshot(m: dict, mode: str = "changed", names=None) -> dict[str, str]:
    """{file: problem} for every file of the manifest that is missing or damaged; saves new stamps."""
    snapshot = repo_folder(m["repo_id"]) / "snapshots" / m["commit"]
    before = dict(m["checked"])
    problems = {}
    for name in names if names is not None else sorted(m["files"]):
        problem = check_file(snapshot, name, m["files"][name], m, mode)
        if problem:
            problems[name] = problem
    if m["checked"] != before:
        with contextlib.suppress(OSError):  # a read-only data folder only costs a re-hash next time
            save_manifest(m)
    return problems


def local_state(spec: ModelSpec, mode: str = "changed") -> tuple[dict | None, dict[str, str]]:
    """(manifest, problems) for the cached snapshot of a Hub spec; (None, ...) when nothing is cached."""
    commit = cached_commit(spec)
    if commit is None or not (repo_folder(spec.repo_id) / "snapshots" / commit).is_dir():
        return None, {"*": "not downloaded"}
    m = load_manifest(spec.repo_id, commit) or manifest_from_cache(spec, commit)
    return m, check_snapshot(m, mode)


def _discard(snapshot: Path, name: str) -> None:
    """Remove a damaged file from the cache: the snapshot link and the blob it points to."""
    path = snapshot / name
    blob = Path(os.path.realpath(path))
    path.unlink(missing_ok=True)
    if blob != path and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)


# ---- pull --------------------------------------------------------------------------------------------------------

def _free_bytes(folder: Path) -> int:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def pull(spec: ModelSpec, say: Callable[[str], None] = _say_nothing, progress: bool = False) -> Path:
    """Download what is missing or damaged (pinned revision, needed files only), hash it, return the folder."""
    if offline():
        m, problems = local_state(spec)
        if m is not None and not problems:
            return repo_folder(spec.repo_id) / "snapshots" / m["commit"]
        raise not_cached_error(spec, "HF_HUB_OFFLINE is set")
    m = manifest_from_hub(spec)
    old = load_manifest(spec.repo_id, m["commit"])
    if old and old.get("files") == m["files"]:
        m["checked"] = old.get("checked", {})
    snapshot = repo_folder(spec.repo_id) / "snapshots" / m["commit"]
    for name, problem in check_snapshot(m).items():
        if problem != "missing":
            say(f"{name} of {spec.label} is damaged ({problem}); fetching it again")
            _discard(snapshot, name)
    save_manifest(m)
    todo = [n for n in sorted(m["files"]) if not (snapshot / n).exists()]
    if not todo:
        return snapshot
    need = sum(m["files"][n]["size"] or 0 for n in todo)
    cache = hf_cache_dir()
    if need > _free_bytes(cache):
        raise DownloadError(
            f"not enough disk space for {spec.label}: it needs {human_size(need)}, "
            f"{human_size(_free_bytes(cache))} free in {cache}",
            hint="free some space, or set HF_HUB_CACHE to a folder on a bigger disk",
        )
    say(f"downloading {spec.label}: {human_size(need)} in {len(todo)} files from {hf_endpoint()} into {cache}")
    commit = _download(spec, m["commit"], todo, progress)
    if commit != m["commit"]:  # the branch moved between the two requests: take the files as downloaded
        m = manifest_from_hub(replace(spec, revision=commit))
        snapshot, todo = snapshot.parent / commit, sorted(m["files"])
        save_manifest(m)
    problems = check_snapshot(m, "deep", names=todo)
    if problems:
        name, problem = next(iter(problems.items()))
        _discard(snapshot, name)
        raise DownloadError(
            f"the downloaded {name} of {spec.label} is damaged: {problem}",
            hint="run the command again; if it persists, the server (HF_ENDPOINT) serves a different file",
        )
    return snapshot


def _download(spec: ModelSpec, commit: str, names: list[str], progress: bool) -> str:
    """snapshot_download of `names`; returns the commit it fetched. A branch or tag is passed as such, so that
    huggingface_hub records it under refs/ for offline use."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    if not progress:
        disable_progress_bars()
    revision = spec.revision if spec.revision and not COMMIT.match(spec.revision) else commit
    if spec.revision is None:
        revision = "main"
    try:
        folder = snapshot_download(spec.repo_id, revision=revision, allow_patterns=names, cache_dir=hf_cache_dir())
    except Exception as e:
        raise hub_error(e, spec) from None
    return Path(folder).name


def ensure(spec: ModelSpec, pull_missing: bool = False, say: Callable[[str], None] = _say_nothing,
           progress: bool = False) -> Path:
    """The checkpoint folder for a spec. A cached snapshot is checked first; a damaged one is never returned."""
    if not spec.on_hub:
        return check_folder(spec.folder)
    m, problems = local_state(spec)
    if m is not None and not problems:
        return repo_folder(spec.repo_id) / "snapshots" / m["commit"]
    if not pull_missing:
        if m is None:
            raise NotCachedError(f"{spec.label} is not downloaded", hint=f"run: leapvox models pull {spec.name}")
        name, problem = next(iter(problems.items()))
        raise NotCachedError(
            f"{spec.label} in the cache is incomplete or damaged ({name}: {problem})",
            hint=f"run: leapvox models pull {spec.name}",
        )
    if offline():
        if m is None:
            raise not_cached_error(spec, "HF_HUB_OFFLINE is set")
        name, problem = next(iter(problems.items()))
        raise NotCachedError(
            f"{spec.label} in the cache is incomplete or damaged ({name}: {problem}) and HF_HUB_OFFLINE is set",
            hint=f"unset HF_HUB_OFFLINE and run: leapvox models pull {spec.name}; or {OFFLINE_HINT}",
        )
    return pull(spec, say=say, progress=progress)


def resolve_model_path(text: str, pull: bool = False, catalog: dict[str, CatalogEntry] | None = None,
                       say: Callable[[str], None] = _say_nothing, progress: bool = False) -> Path:
    """`--model` value → checkpoint folder; with `pull`, fetch a Hub model that is missing or damaged."""
    return ensure(resolve_model(text, CATALOG if catalog is None else catalog), pull, say, progress)


# ---- verify and remove ---------------------------------------------------------------------------------------------

def verify(spec: ModelSpec) -> tuple[dict, dict[str, str], str]:
    """Hash every file of the cached snapshot. Returns (manifest, problems, against-what)."""
    source = "hashes recorded at pull time"
    m = None
    if not offline():
        try:
            m = manifest_from_hub(spec)
            source = f"hashes reported by {hf_endpoint()}"
        except NotCachedError:  # the Hub is unreachable: fall back to what was recorded
            m = None
    if m is None:
        commit = cached_commit(spec)
        if commit is None:
            raise NotCachedError(f"{spec.label} is not downloaded", hint=f"run: leapvox models pull {spec.name}")
        m = load_manifest(spec.repo_id, commit)
        if m is None:
            m = manifest_from_cache(spec, commit)
            source = "hashes in the cache's blob names (no leapvox manifest)"
    elif old := load_manifest(spec.repo_id, m["commit"]):
        m["checked"] = old.get("checked", {})
    if not (repo_folder(spec.repo_id) / "snapshots" / m["commit"]).is_dir():
        raise NotCachedError(f"{spec.label} is not downloaded", hint=f"run: leapvox models pull {spec.name}")
    return m, check_snapshot(m, "deep"), source


def cached_revisions(spec: ModelSpec):
    """huggingface_hub's CachedRevisionInfo for every cached revision of the spec's repo (or only its @revision)."""
    from huggingface_hub import scan_cache_dir

    if not hf_cache_dir().is_dir():
        return []
    repo = next((r for r in scan_cache_dir(hf_cache_dir()).repos
                 if r.repo_type == "model" and r.repo_id == spec.repo_id), None)
    if repo is None:
        return []
    if spec.entry is None and spec.revision:  # org/name@rev: only that revision
        commit = cached_commit(spec)
        return [r for r in repo.revisions if r.commit_hash == commit]
    return sorted(repo.revisions, key=lambda r: r.commit_hash)


def remove(spec: ModelSpec, revisions) -> int:
    """Delete the given cached revisions (and leapvox's manifests for them). Returns bytes freed."""
    from huggingface_hub import scan_cache_dir

    strategy = scan_cache_dir(hf_cache_dir()).delete_revisions(*(r.commit_hash for r in revisions))
    strategy.execute()
    for r in revisions:
        _manifest_path(spec.repo_id, r.commit_hash).unlink(missing_ok=True)
    return strategy.expected_freed_size


# ---- errors ------------------------------------------------------------------------------------------------------

OFFLINE_HINT = (
    "pull it on a machine with internet and copy the Hugging Face cache (leapvox paths shows it), "
    "set HF_ENDPOINT to a mirror, or pass a local checkpoint folder with --model PATH"
)


def not_cached_error(spec: ModelSpec, why: str) -> NotCachedError:
    size = human_size(spec.size_bytes, spec.size_exact)
    what = f"{spec.label[:-1]}, {size})" if spec.label.endswith(")") else f"{spec.label} ({size})"
    return NotCachedError(f"{what} is not in the cache and cannot be downloaded: {why}", OFFLINE_HINT)


def hub_error(e: Exception, spec: ModelSpec) -> LeapvoxError:
    """One error a person can act on, for anything huggingface_hub raised while talking to the Hub."""
    from huggingface_hub import errors as hf

    status = getattr(getattr(e, "response", None), "status_code", None)
    endpoint = hf_endpoint()
    token_hint = "set HF_TOKEN to a token that can read it (or run: hf auth login)"
    if isinstance(e, hf.OfflineModeIsEnabled):
        return not_cached_error(spec, "HF_HUB_OFFLINE is set")
    if isinstance(e, hf.GatedRepoError):
        return DownloadError(f"{spec.repo_id} is gated on {endpoint}: accept its terms there first", token_hint)
    if isinstance(e, hf.RevisionNotFoundError):
        return ModelNotFoundError(f"{spec.repo_id} has no revision {spec.revision!r} on {endpoint}",
                                  hint="check the part after @")
    if status == 401:
        return DownloadError(f"{endpoint} refused access to {spec.repo_id} (401: private, gated or a bad token)",
                             token_hint)
    if isinstance(e, (hf.RepositoryNotFoundError, hf.RemoteEntryNotFoundError)) or status == 404:
        return ModelNotFoundError(
            f"{spec.repo_id} was not found on {endpoint} (404)",
            hint="check the name (leapvox models list shows the catalog); a local folder must exist",
        )
    if isinstance(e, hf.HfHubHTTPError):
        return DownloadError(f"{endpoint} answered {status} for {spec.repo_id}",
                             hint="try again later, or set HF_ENDPOINT to a mirror")
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return DownloadError(f"the disk filled up while downloading {spec.label} into {hf_cache_dir()}",
                             hint="free some space, or set HF_HUB_CACHE to a folder on a bigger disk")
    if isinstance(e, hf.LocalEntryNotFoundError | hf.FileMetadataError) or _is_network_error(e):
        return not_cached_error(spec, f"cannot reach {endpoint}")
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return DownloadError(f"downloading {spec.label} failed: {first_line}", hint="run the command again to resume")


def _is_network_error(e: Exception) -> bool:
    return type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3") or isinstance(
        e, ConnectionError | TimeoutError
    )
