"""A model's tuning profile on this machine (`leapvox tune`, issue #39): what was measured, and the decision that
`--mode auto` and `--weights auto` follow.

One JSON file per model and machine, `<data>/profiles/<model key>-<machine id>.json`, written atomically. It holds
the versions it was made with; a profile made for another model (its fingerprint), another leapvox or torch
version, or another CPU is stale: it is not followed, and the reason says why (`doctor`, speak's summary line).
The draft offsets and tree it decided on live where spec mode reads them (models.spec_assets); the profile names
them. Without a usable profile `auto` means what it meant before tune existed: mode ar, weights
models.auto.auto_weights (engine.fast.quant.resolve_weights with the model's width).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .paths import leapvox_dirs, model_key

PROFILE_VERSION = 1

# The stages `leapvox tune` runs, in order; a profile file written part-way lists those done in `stages_done`, and a
# rerun continues from the first missing one (the stage's own data, e.g. generated frames, lives in `work_dir`).
STAGES: tuple[str, ...] = ("frames", "offsets", "tree", "formats", "decision")


@dataclass
class FormatResult:
    """One weight format measured against fp32 on the model's own held-out frames (teacher-forced), and its speed."""

    weights: str
    code0_agreement: float  # share of frames whose argmax code 0 equals fp32's
    codes_agreement: float  # same for codes 1..15 (predictor), over all positions
    kl_talker: float  # mean KL(fp32 || format) of the code-0 distributions, nats
    kl_predictor: float  # mean KL over codes 1..15
    frame_ms: float  # median ms per frame (talker step + predictor frame) at this machine's threads
    passes: bool  # fidelity within the threshold `tune` argues (see models/tune.py)
    talker_ms: float | None = None  # the two parts of frame_ms (ar), medians
    predictor_ms: float | None = None
    spec_predictor_ms: float | None = None  # the predictor's frame in spec mode with the profile's offsets and tree
    tokens_per_call: float | None = None  # spec's, in those measured frames
    verify_over_ar: float | None = None  # one verify call over the profile's tree / one ar call, in this format


@dataclass
class Decision:
    mode: str  # "spec" or "ar"
    weights: str  # one of engine.options.WEIGHT_FORMATS
    why: str  # one line a user reads, e.g. "spec: 2.4 tokens/call, 1.6x the predictor's speed here"


@dataclass
class Profile:
    model_key: str
    fingerprint: str
    machine: str
    versions: dict[str, str]
    threads: int
    created: str = ""
    stages_done: list[str] = field(default_factory=list)
    offsets_path: str | None = None  # the offsets spec mode reads (None: they did not beat zero offsets)
    tree_path: str | None = None
    tokens_per_call: float | None = None  # spec, measured on held-out frames with the chosen offsets and tree
    tokens_per_call_by_depth: list[float] = field(default_factory=list)  # [d-1]: expected with the tree cut to depth d
    verify_over_ar: float | None = None  # one verify call's time over one ar predictor call, measured here
    formats: list[FormatResult] = field(default_factory=list)
    decision: Decision | None = None
    notes: list[str] = field(default_factory=list)
    # added by leapvox tune's first version (absent from a profile: the defaults)
    settings: dict = field(default_factory=dict)  # what the run was asked for (sentences, frames, texts); a rerun
    # with other settings starts afresh
    measured_in: str | None = None  # the weight format the frames were spoken in and the tree was timed in
    frames: dict = field(default_factory=dict)  # sentences and frames, training and held out
    offsets_trial: dict = field(default_factory=dict)  # each candidate's tokens per call vs zero offsets (paired CI)
    tree_size: int | None = None  # draft nodes of the calibrated tree
    acceptance_by_depth: list[float] = field(default_factory=list)  # spec's per-depth acceptance, held-out frames
    spec_gain: float | None = None  # tokens_per_call / verify_over_ar: the predictor's estimated speed-up
    stage_seconds: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"profile_version": PROFILE_VERSION, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        d = json.loads(text)
        if d.pop("profile_version", None) != PROFILE_VERSION:
            raise ValueError("made by another version of leapvox tune")
        d["formats"] = [FormatResult(**f) for f in d.get("formats", [])]
        d["decision"] = Decision(**d["decision"]) if d.get("decision") else None
        return cls(**d)


def machine_id() -> str:
    """This CPU, as a short stable name: its model name and a hash of its feature flags and core count."""
    from leapvox.engine.fast.kernels import cpu_flags

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), name)
    except OSError:
        pass
    digest = hashlib.sha1(" ".join(sorted(cpu_flags())).encode() + str(os.cpu_count()).encode()).hexdigest()[:8]
    return f"{name} [{digest}]"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    import torch

    try:
        mine = dist_version("leapvox")
    except PackageNotFoundError:
        mine = "unknown"
    return {"leapvox": mine, "torch": torch.__version__}


def fingerprint(folder: Path) -> str:
    """What identifies the model's weights without reading them all: config.json, and for each weight file its size,
    its safetensors header and its first and last MiB."""
    folder = Path(folder)
    h = hashlib.sha256((folder / "config.json").read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def profile_path(folder: Path) -> Path:
    tag = hashlib.sha1(machine_id().encode()).hexdigest()[:8]
    return leapvox_dirs()["data"] / "profiles" / f"{model_key(folder)}-{tag}.json"


def work_dir(folder: Path) -> Path:
    """Where a tune run keeps its intermediate data (generated frames ...) so that it can resume."""
    return profile_path(folder).with_suffix(".work")


def save_profile(path: Path, profile: Profile) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(profile.to_json())
    tmp.replace(path)
    return path


def stale_reason(profile: Profile, folder: Path) -> str | None:
    """None when `profile` was made for this model, leapvox, torch and CPU; else why it no longer applies."""
    if profile.fingerprint != fingerprint(folder):
        return "it was made for other weights"
    now = versions()
    for name, made in profile.versions.items():
        if now.get(name) != made:
            return f"it was made with {name} {made} (now {now.get(name)})"
    if profile.machine != machine_id():
        return f"it was made on another CPU ({profile.machine})"
    return None


def load_profile(folder: Path) -> tuple[Profile | None, str | None]:
    """The finished profile for the model in `folder` on this machine, or (None, why not) — why is None when no
    tune was ever run here."""
    path = profile_path(folder)
    if not path.is_file():
        return None, None
    try:
        profile = Profile.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"its profile {path} is unreadable ({e}); rerun leapvox tune"
    if profile.decision is None:
        return None, f"leapvox tune did not finish ({', '.join(profile.stages_done) or 'nothing'} done); rerun it"
    why = stale_reason(profile, folder)
    if why:
        return None, f"its profile is stale: {why}; rerun leapvox tune"
    return profile, None
