"""The models leapvox knows by name: a literal table, and `resolve_model` turning a `--model` value into a spec.

`--model` accepts a catalog name (`qwen3-tts-0.6b`), a Hub repo `org/name[@revision]`, or a local checkpoint folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from leapvox.engine.errors import ModelNotFoundError

ASSETS = Path(__file__).resolve().parent / "assets"
DEMO_DIR = ASSETS / "demo"  # the bundled demo model (package data)

# Every file the engine reads from a CustomVoice checkpoint (allow_patterns for snapshot_download).
CUSTOM_VOICE_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
    "speech_tokenizer/preprocessor_config.json",
)
SPEAKERS = ("aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian")
LANGUAGES = (
    "auto", "chinese", "english", "french", "german", "italian", "japanese", "korean", "portuguese", "russian",
    "spanish",
)


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    repo_id: str | None = None  # None for a bundled model
    revision: str | None = None  # pinned commit
    files: tuple[str, ...] = CUSTOM_VOICE_FILES
    size_bytes: int | None = None
    size_exact: bool = False  # False: size_bytes is an estimate
    licence: str = "apache-2.0"
    speakers: tuple[str, ...] = SPEAKERS
    languages: tuple[str, ...] = LANGUAGES
    instruct: bool = False
    bundled: Path | None = None  # folder inside the package, for models shipped with leapvox
    model_type: str = "custom_voice"  # config.json tts_model_type: custom_voice, base (clones) or voice_design


CATALOG: dict[str, CatalogEntry] = {
    "qwen3-tts-0.6b": CatalogEntry(
        name="qwen3-tts-0.6b",
        description="Qwen3-TTS 12 Hz 0.6B CustomVoice: 9 voices, 10 languages",
        repo_id="Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
        revision="85e237c12c027371202489a0ec509ded67b5e4b5",
        size_bytes=2_498_388_392,  # all 13 files of the repo at this revision
        size_exact=True,
    ),
    "qwen3-tts-1.7b": CatalogEntry(
        name="qwen3-tts-1.7b",
        description="Qwen3-TTS 12 Hz 1.7B CustomVoice: 9 voices, 10 languages, follows style instructions",
        repo_id="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
        revision="0c0e3051f131929182e2c023b9537f8b1c68adfe",
        size_bytes=4_500_000_000,
        instruct=True,
    ),
    "qwen3-tts-0.6b-base": CatalogEntry(
        name="qwen3-tts-0.6b-base",
        description="Qwen3-TTS 12 Hz 0.6B Base: clones a voice from a few seconds of audio (leapvox voices add)",
        repo_id="Qwen/Qwen3-TTS-12Hz-0.6B-Base",
        revision="5d83992436eae1d760afd27aff78a71d676296fc",
        size_bytes=2_520_000_000,  # the Hub's listing: 2.52 GB
        speakers=(),
        model_type="base",
    ),
    "qwen3-tts-1.7b-base": CatalogEntry(
        name="qwen3-tts-1.7b-base",
        description="Qwen3-TTS 12 Hz 1.7B Base: clones a voice from a few seconds of audio (leapvox voices add)",
        repo_id="Qwen/Qwen3-TTS-12Hz-1.7B-Base",
        revision="fd4b254389122332181a7c3db7f27e918eec64e3",
        size_bytes=4_540_000_000,  # estimate: 1.7B CustomVoice + the 12M-parameter speaker encoder
        speakers=(),
        model_type="base",
    ),
    "qwen3-tts-1.7b-voicedesign": CatalogEntry(
        name="qwen3-tts-1.7b-voicedesign",
        description="Qwen3-TTS 12 Hz 1.7B VoiceDesign: a voice described in words (speak --instruct \"...\")",
        repo_id="Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
        revision="5ecdb67327fd37bb2e042aab12ff7391903235d3",
        size_bytes=4_500_000_000,  # estimate: same architecture and files as 1.7B CustomVoice
        speakers=(),
        instruct=True,
        model_type="voice_design",
    ),
    "demo": CatalogEntry(
        name="demo",
        description="small bundled demo model that speaks offline out of the box",
        bundled=DEMO_DIR,
        speakers=(),
        languages=(),
    ),
}

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
REVISION = re.compile(r"^[\w./-]+$")


@dataclass(frozen=True)
class ModelSpec:
    """What a `--model` value names: a Hub repo at a revision, a bundled folder, or a local folder."""

    name: str  # as the user should type it again
    repo_id: str | None = None
    revision: str | None = None  # None: the repo's default branch
    files: tuple[str, ...] = CUSTOM_VOICE_FILES
    size_bytes: int | None = None
    size_exact: bool = False
    folder: Path | None = None  # local or bundled folder
    entry: CatalogEntry | None = field(default=None, compare=False)

    @property
    def on_hub(self) -> bool:
        return self.repo_id is not None

    @property
    def label(self) -> str:
        """`name (org/repo@rev7)` for messages."""
        if not self.on_hub:
            return self.name
        where = self.repo_id + (f"@{self.revision[:7]}" if self.revision else "")
        return f"{self.name} ({where})" if self.entry is not None and self.entry.name == self.name else where


def bundled_ready(entry: CatalogEntry) -> bool:
    return entry.bundled is not None and (entry.bundled / "config.json").is_file()


def default_model() -> str | None:
    """The model used when none is given: $LEAPVOX_MODEL, else the bundled demo model when it is installed."""
    import os

    return os.environ.get("LEAPVOX_MODEL") or ("demo" if bundled_ready(CATALOG["demo"]) else None)


def spec_for_entry(entry: CatalogEntry) -> ModelSpec:
    return ModelSpec(
        name=entry.name,
        repo_id=entry.repo_id,
        revision=entry.revision,
        files=entry.files,
        size_bytes=entry.size_bytes,
        size_exact=entry.size_exact,
        folder=entry.bundled,
        entry=entry,
    )


def resolve_model(text: str, catalog: dict[str, CatalogEntry] | None = None) -> ModelSpec:
    """A catalog name, an existing folder, `org/name[@revision]`, or a path (checked later): in that order."""
    catalog = CATALOG if catalog is None else catalog
    text = text.strip()
    if text in catalog:
        entry = catalog[text]
        if entry.bundled is not None and not bundled_ready(entry):
            raise ModelNotFoundError(
                f"the {entry.name} model is not bundled yet", hint="use --model qwen3-tts-0.6b (downloads ~2.5 GB)"
            )
        return spec_for_entry(entry)
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelSpec(name=text, folder=path)
    repo, _, revision = text.partition("@")
    if REPO_ID.match(repo) and (not revision or REVISION.match(revision)) and not text.startswith(("./", "../")):
        known = next((e for e in catalog.values() if e.repo_id == repo), None)
        return ModelSpec(
            name=text,
            repo_id=repo,
            revision=revision or None,
            files=known.files if known else CUSTOM_VOICE_FILES,
            size_bytes=known.size_bytes if known else None,
            size_exact=bool(known and known.size_exact and revision == known.revision),
            entry=known,
        )
    if "/" in text or "\\" in text or text.startswith((".", "~")):
        return ModelSpec(name=text, folder=path)  # a folder that does not exist: check_folder says so
    raise ModelNotFoundError(
        f"unknown model {text!r}",
        hint=f"use a catalog name ({', '.join(catalog)}), a Hub repo org/name[@revision], or a checkpoint folder",
    )


def human_size(n: int | None, exact: bool = True) -> str:
    if n is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{'' if exact else '~'}{n / scale:.{1 if unit != 'GB' else 2}f} {unit}"
    return f"{n} B"


# ---- bundled models: their files and the hashes recorded for them ------------------------------------------------
# A bundled model has no Hub to report hashes, so its folder carries MANIFEST.json: the size and sha256 of every file
# of the model (all files but the model card and the manifest itself). tests/test_models_local.py fails when the
# manifest no longer matches the files; regenerate it with
#   python3 -c "from leapvox.models.catalog import write_bundled_manifest; write_bundled_manifest()"

BUNDLED_MANIFEST = "MANIFEST.json"
NOT_MODEL_FILES = ("README.md", BUNDLED_MANIFEST)


def bundled_files(folder: Path) -> list[str]:
    """The model's files under a bundled folder, as sorted posix paths relative to it (hidden files skipped)."""
    names = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        hidden = any(part.startswith(".") or part == "__pycache__" for part in rel.split("/"))
        if p.is_file() and p.name not in NOT_MODEL_FILES and not hidden:
            names.append(rel)
    return sorted(names)


def sha256_of(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bundled_manifest(folder: Path) -> dict:
    """The manifest of a bundled folder as its files are now: {"files": {name: {"size", "sha256"}}}."""
    return {"files": {name: {"size": (folder / name).stat().st_size, "sha256": sha256_of(folder / name)}
                      for name in bundled_files(folder)}}


def write_bundled_manifest(folder: Path = DEMO_DIR) -> Path:
    import json

    path = folder / BUNDLED_MANIFEST
    path.write_text(json.dumps(bundled_manifest(folder), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_bundled_manifest(folder: Path) -> dict | None:
    """The recorded manifest of a bundled folder, or None when it has none (or an unreadable one)."""
    import json

    try:
        m = json.loads((folder / BUNDLED_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("files"), dict) else None


def check_bundled(folder: Path, m: dict) -> dict[str, str]:
    """{file: problem} for every recorded file that is missing, of another size or another sha256, and for every
    model file on disk that the manifest does not list."""
    problems = {}
    for name, record in sorted(m["files"].items()):
        path = folder / name
        if not path.is_file():
            problems[name] = "missing"
        elif (size := path.stat().st_size) != record.get("size"):
            problems[name] = f"{size} bytes, {record.get('size')} recorded"
        elif sha256_of(path) != record.get("sha256"):
            problems[name] = "sha256 differs from the recorded one"
    for name in bundled_files(folder):
        if name not in m["files"]:
            problems[name] = f"not in {BUNDLED_MANIFEST}"
    return problems


def bundled_size(entry: CatalogEntry) -> int | None:
    """Bytes of a bundled model: the recorded sizes of its files, else the sizes of its files on disk now."""
    if not bundled_ready(entry):
        return None
    m = read_bundled_manifest(entry.bundled)
    if m is not None:
        return sum(int(r.get("size") or 0) for r in m["files"].values())
    return sum((entry.bundled / n).stat().st_size for n in bundled_files(entry.bundled))
