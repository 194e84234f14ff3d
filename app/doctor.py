"""`leapvox doctor`: one screen saying what this machine offers leapvox, and whether `leapvox speak` can work.

Every probe returns plain data (so `--json` and the screen show the same facts); the exit code is 0 when `speak`
can work here, 1 otherwise, with the reason on stderr. Only argparse at import time: torch, sounddevice and the
model manager load inside the command.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from leapvox.app.common import version

# Weights of a checkpoint at most this big are loaded for real by the doctor (the demo model is a few MB).
LOAD_CHECK_MAX_BYTES = 64_000_000
# The quick probe: one batch-1 matrix-vector product of this shape, like a decoding step of a 0.6B layer.
PROBE_SHAPE = (1024, 3072)


def add_commands(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="what this machine offers leapvox (versions, backends, audio, models) and whether speak works",
        description="One screen for you or a bug report: versions, threads, weight formats, backends, audio "
        "devices, paths with sizes, models and whether they verify, and whether 'leapvox speak' can work. "
        "Exit 0 when speak can work, 1 otherwise (the reason goes to stderr).",
    )
    d.add_argument("--model", help="check this model for speak (default: what speak would use, $LEAPVOX_MODEL)")
    d.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    d.set_defaults(func=cmd_doctor)


# ---- probes ------------------------------------------------------------------------------------------------------

def versions() -> dict:
    import torch

    return {
        "leapvox": version(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "frozen": bool(getattr(sys, "frozen", False)),  # a standalone bundle (PyInstaller)
        "torch": torch.__version__,
        "platform": f"{platform.system()} {platform.machine()}",
    }


def threads() -> dict:
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        usable = os.cpu_count()
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ}
    return {
        "torch_intra_op": torch.get_num_threads(),
        "torch_inter_op": torch.get_num_interop_threads(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "env": env,
    }


def weight_formats() -> list[str]:
    """The formats `--weights` accepts (the checkpoint loader's list)."""
    from leapvox.models.checkpoint import weight_formats as formats

    return formats()


def _probe_step(fmt: str, x, w):
    """A no-argument callable doing the probe's product the way `--weights fmt` computes a linear layer, or None
    for a format the doctor does not know how to run."""
    import torch.nn.functional as F

    from leapvox.models.checkpoint import DTYPES

    if fmt in DTYPES:
        xd, wd = x.to(DTYPES[fmt]), w.to(DTYPES[fmt])
        return lambda: F.linear(xd, wd)
    if fmt in ("int8", "w8a8", "w4a8", "int4"):  # the layer `--weights fmt` puts in the model, on its activations
        from torch import nn

        from leapvox.engine.fast.quant import quantized_linear

        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight.data = w
        layer = quantized_linear(linear, fmt, "gate_proj")  # a decoder-layer product (w4a8 puts those in 4 bits)
        return lambda: layer(x)
    return None


def probe_formats(formats: list[str], budget_s: float = 0.06) -> dict:
    """A quick probe, not a benchmark: the median time of a batch-1 matrix-vector product per format (int8: through
    engine.fast.quant's Int8Linear, as a loaded int8 model computes it). A format that cannot run here gets no time and
    a reason under "not_probed"."""
    import torch

    from leapvox.app.common import DEFAULT_WEIGHTS
    from leapvox.engine.fast import kernels
    from leapvox.engine.fast.quant import NARROW_HIDDEN, resolve_weights

    n_in, n_out = PROBE_SHAPE
    times: dict[str, float | None] = {}
    not_probed: dict[str, str] = {}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g)
    for fmt in formats:
        times[fmt] = None
        with torch.inference_mode():
            try:
                step = _probe_step(fmt, x, w)
                if step is None:
                    not_probed[fmt] = "the doctor has no probe for this format"
                    continue
                step()  # warm-up; also where a kernel this torch lacks fails
            except Exception as e:
                first = (str(e).strip().splitlines() or [""])[0]
                not_probed[fmt] = f"{type(e).__name__}: {first}" if first else type(e).__name__
                continue
            samples = []
            for _ in range(5):
                reps, t0 = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - t0) < budget_s / 5:
                    step()
                    reps += 1
                samples.append(elapsed / reps)
        times[fmt] = sorted(samples)[len(samples) // 2]
    timed = {k: v for k, v in times.items() if v is not None}
    fastest = min(timed, key=timed.get) if timed else None
    out = {
        "shape": f"1x{n_in} @ {n_in}x{n_out}",
        "ms": {k: (round(v * 1e3, 4) if v is not None else None) for k, v in times.items()},
        "fastest": fastest,
        # formats within 10% of the fastest: too close for a quick probe to call
        "close": [k for k, v in timed.items() if k != fastest and v <= 1.1 * timed[fastest]],
        "default": DEFAULT_WEIGHTS,  # what --weights uses when not given
        "default_here": resolve_weights(DEFAULT_WEIGHTS),  # the format that default is on this machine
        "narrow_hidden": NARROW_HIDDEN,  # ... for a model at least this wide; fp32 for a narrower one
        "w8a8_kernel": kernels.describe(),  # leapvox's compiled kernel, or torch's and why
        "w8a8_kernel_hint": kernels.hint(),
        "fp32_layer": kernels.describe_fp32(),  # what a narrow fp32 model's decoder layers run on
    }
    if not_probed:
        out["not_probed"] = not_probed
    return out


def backends() -> dict:
    """{backend: {"ready": bool, "detail": str}} for cpu, cuda and coreml."""
    import torch

    from leapvox.engine.backend import available_backends

    offered = available_backends()
    out = {"cpu": {"ready": "cpu" in offered, "detail": f"torch {torch.__version__}"}}
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        out["cuda"] = {"ready": "cuda" in offered, "detail": f"CUDA {torch.version.cuda}: {names}"}
    elif torch.version.cuda is None:
        out["cuda"] = {"ready": False, "detail": "this torch is a CPU-only build"}
    else:
        why = f"torch has CUDA {torch.version.cuda} but finds no usable GPU or driver"
        out["cuda"] = {"ready": False, "detail": why}
    out["coreml"] = coreml_status(offered)
    return out


def coreml_status(offered: tuple[str, ...]) -> dict:
    if sys.platform != "darwin":
        return {"ready": False, "detail": "Core ML and the Neural Engine exist on macOS only"}
    try:
        import coremltools
    except ImportError:
        return {"ready": False, "detail": "coremltools is not installed (pip install 'leapvox[coreml]')"}
    ane = "Apple silicon (Neural Engine)" if platform.machine() == "arm64" else "Intel Mac (no Neural Engine)"
    if "ane" not in offered:
        from leapvox.engine.backend import ane_unavailable_reason

        why = ane_unavailable_reason()
        return {"ready": False, "detail": f"coremltools {coremltools.__version__} on {ane}: {why}"}
    return {"ready": True, "detail": f"coremltools {coremltools.__version__} on {ane}: --backend ane runs a model "
            "after leapvox recipe coreml"}


def audio() -> dict:
    """Output devices as PortAudio lists them, or why there are none."""
    from leapvox.app.playback import AudioUnavailable, load_sounddevice, output_devices

    try:
        sd = load_sounddevice()
    except AudioUnavailable as e:
        return {"portaudio": None, "devices": [], "why_none": str(e), "hint": e.hint}
    portaudio = sd.get_portaudio_version()[1]
    try:
        devices = output_devices()
    except Exception as e:  # PortAudio itself failed to enumerate
        return {"portaudio": portaudio, "devices": [], "why_none": f"PortAudio could not list devices: {e}",
                "hint": "-o out.wav works without audio"}
    out = {"portaudio": portaudio, "devices": [{"index": d.index, "name": d.name, "default": d.is_default}
                                               for d in devices]}
    if not devices:
        out["why_none"] = "PortAudio lists no output device (no sound card or sound server here)"
        out["hint"] = "-o out.wav works without audio; on a desktop, check that PulseAudio/PipeWire is running"
    return out


def folder_size(path: Path) -> int | None:
    """Bytes of regular files under path, symlinks not followed (the HF cache links snapshots to blobs); None if
    the path does not exist."""
    if not path.exists():
        return None
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, f)):
                total += st.st_size
    return total


def paths() -> dict:
    from leapvox.models import hub

    dirs = {"hf-cache": hub.hf_cache_dir()}
    dirs.update({k: v for k, v in hub.leapvox_dirs().items() if k in ("data", "config", "cache")})
    return {k: {"path": str(v), "bytes": folder_size(v)} for k, v in dirs.items()}


def models() -> list[dict]:
    """Each catalog model: what `leapvox models list` says, and for a present one whether it verifies (files whose
    size or time changed since they last hashed correctly are hashed again, as a load would)."""
    from leapvox.app.manage import model_state
    from leapvox.engine.errors import LeapvoxError
    from leapvox.models import hub
    from leapvox.models.catalog import CATALOG, spec_for_entry

    out = []
    for entry in CATALOG.values():
        spec = spec_for_entry(entry)
        row = {"name": entry.name, "present": False, "verified": None, "bytes": None}
        try:
            state, on_disk = model_state(spec)
            row.update(state=state, bytes=on_disk)
            if spec.on_hub and state != "not downloaded":
                row["present"] = True
                _m, problems = hub.local_state(spec, mode="changed")
                row["verified"] = not problems
                if _m is not None and not problems:
                    row["tune"] = tune_status(hub.repo_folder(spec.repo_id) / "snapshots" / _m["commit"], entry.name)
                if problems:
                    name, problem = next(iter(problems.items()))
                    row["problem"] = f"{name}: {problem}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1
                                                             else "")
            elif not spec.on_hub and state == "bundled":
                row["present"] = True
                row["bytes"] = folder_size(entry.bundled)
                from leapvox.models.catalog import check_bundled, read_bundled_manifest
                from leapvox.models.checkpoint import load_config

                load_config(entry.bundled)
                recorded = read_bundled_manifest(entry.bundled)  # a bundled model's hashes (MANIFEST.json)
                problems = check_bundled(entry.bundled, recorded) if recorded is not None else {}
                row["verified"] = not problems
                row["tune"] = tune_status(entry.bundled, entry.name)
                if problems:
                    name, problem = next(iter(problems.items()))
                    row["problem"] = f"{name}: {problem}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1
                                                             else "")
        except LeapvoxError as e:
            row.update(verified=False, problem=str(e))
        out.append(row)
    return out


def tune_status(folder: Path, name: str) -> dict:
    """The model's tune profile here (models.auto.profile_status): {"state": fresh | unused | none, "line",
    "profile": its file}; what `--mode auto` and `--weights auto` follow."""
    from leapvox.models.auto import profile_status
    from leapvox.models.profile import profile_path

    try:
        state, text = profile_status(folder, name)
    except OSError as e:  # its weight files unreadable: the fingerprint cannot be taken
        state, text = "unused", f"tune profile not checked: {e.strerror or e}"
    return {"state": state, "line": text, "profile": str(profile_path(folder))}


def other_profiles(shown: list[str]) -> list[str]:
    """Tune profiles in leapvox's data folder besides the `shown` ones (checkpoint folders, other machines)."""
    from leapvox.models.paths import leapvox_dirs

    folder = leapvox_dirs()["data"] / "profiles"
    return sorted(str(p) for p in folder.glob("*.json") if str(p) not in shown) if folder.is_dir() else []


def espeak() -> dict:
    exe = shutil.which("espeak-ng")
    if exe is None:
        return {"path": None, "version": None}
    try:
        first = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        ver = first.split(":", 1)[1].split()[0] if ":" in first else first.splitlines()[0] if first else "?"
    except (OSError, subprocess.SubprocessError, IndexError):
        ver = "?"
    return {"path": exe, "version": ver}


def speak_default_model() -> str | None:
    """What `leapvox speak` uses without --model ($LEAPVOX_MODEL, else the bundled demo)."""
    from leapvox.models.catalog import default_model

    return default_model()


def speak_check(model: str | None, model_rows: list[dict], espeak_info: dict) -> dict:
    """Can `leapvox speak` work: a model that resolves locally (no download), whose config reads, whose text front
    end is installed, and (when small) that loads."""
    from leapvox.engine.errors import LeapvoxError
    from leapvox.models import hub
    from leapvox.models.checkpoint import load_config, read_json

    source = "--model"
    if model is None:
        model = speak_default_model()
        source = "$LEAPVOX_MODEL" if os.environ.get("LEAPVOX_MODEL") else \
            "speak's default (the bundled demo model)" if model == "demo" else "speak's default"
    if model is None:
        present = [r["name"] for r in model_rows if r["present"] and r["verified"]]
        if not present:
            return {"ready": False, "model": None, "reason": "no model here: $LEAPVOX_MODEL is not set, the demo "
                    "model is not bundled, and no catalog model is downloaded",
                    "hint": "leapvox models pull qwen3-tts-0.6b, or set LEAPVOX_MODEL to a checkpoint folder"}
        model, source = present[0], f"present here (pass --model {present[0]} or set LEAPVOX_MODEL={present[0]})"
    out = {"ready": False, "model": model, "source": source}
    try:
        folder = hub.resolve_model_path(model, pull=False)
        out["folder"] = str(folder)
        out["tune"] = tune_status(folder, model)
        load_config(folder)
        raw = read_json(folder / "config.json")
    except LeapvoxError as e:
        return {**out, "reason": str(e), "hint": e.hint}
    from leapvox.models.frontend import FRONTEND_NEEDS, FRONTENDS, hibari_available

    frontend = raw.get("leapvox_text_frontend")
    out["frontend"] = frontend or "none (the tokenizer reads the text)"
    if frontend and frontend not in FRONTENDS:
        return {**out, "reason": f"{model} asks for text front end {frontend!r}, which this leapvox does not have",
                "hint": f"known front ends: {', '.join(FRONTENDS)}"}
    if frontend in FRONTEND_NEEDS:
        out["needs"] = FRONTEND_NEEDS[frontend]
    if frontend == "espeak-ng-ipa":
        if espeak_info["path"] is None:
            return {**out, "reason": f"{model} reads phonemes from the espeak-ng program, which is not on PATH",
                    "hint": "apt install espeak-ng (Debian/Ubuntu) or brew install espeak-ng (macOS)"}
    elif frontend == "hibari-g2p" and not hibari_available():
        return {**out, "reason": f"{model} reads phonemes from hibari-tts's G2P, which is not installed",
                "hint": "pip install 'leapvox[hibari]'"}
    weights = sum(p.stat().st_size for p in Path(folder).rglob("*.safetensors"))
    if weights <= LOAD_CHECK_MAX_BYTES:
        from leapvox.models.load import load_model

        t0 = time.perf_counter()
        try:
            loaded = load_model(folder)
            if frontend:
                loaded.tokenizer.frontend("hello")  # runs the front end (espeak-ng) once
        except LeapvoxError as e:
            return {**out, "reason": str(e), "hint": e.hint}
        out["loaded_s"] = round(time.perf_counter() - t0, 2)
    return {**out, "ready": True}


def collect(model: str | None = None) -> dict:
    v = versions()
    formats = weight_formats()
    model_rows = models()
    esp = espeak()
    speak = speak_check(model, model_rows, esp)
    shown = [r["tune"]["profile"] for r in [*model_rows, speak] if r.get("tune")]
    return {
        "versions": v,
        "threads": threads(),
        "formats": {"available": formats, "probe": probe_formats(formats)},
        "backends": backends(),
        "audio": audio(),
        "paths": paths(),
        "models": model_rows,
        "espeak_ng": esp,
        "speak": speak,
        "other_profiles": other_profiles(shown),
    }


# ---- the screen --------------------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    from leapvox.models.catalog import human_size

    return "not created yet" if n is None else human_size(n) if n else "empty"


def render(r: dict) -> str:
    lines = []

    def row(label: str, text: str) -> None:
        lines.append(f"{label:<10} {text}")

    def more(text: str) -> None:
        lines.append(f"{'':<10} {text}")

    def block(label: str, texts: list[str]) -> None:
        for i, text in enumerate(texts):
            (row(label, text) if i == 0 else more(text))

    v = r["versions"]
    row("leapvox", f"{v['leapvox']}{' (standalone bundle)' if v['frozen'] else ''}   torch {v['torch']}   "
        f"python {v['python']}   {v['platform']}")
    t = r["threads"]
    env = "".join(f", {k}={val}" for k, val in t["env"].items())
    row("threads", f"torch uses {t['torch_intra_op']} (intra-op) / {t['torch_inter_op']} (inter-op); "
        f"{t['usable_cpus']} of {t['cpus']} CPUs usable{env}")
    f = r["formats"]
    p = f["probe"]
    why = p.get("not_probed", {})
    timings = ", ".join(f"{k} {ms:.3f} ms" if ms is not None else f"{k} not probed ({why.get(k, '?')})"
                        for k, ms in p["ms"].items())
    close = f" ({', '.join(p['close'])} within 10%)" if p["close"] else ""
    here = p.get("default_here")
    width = p.get("narrow_hidden")
    narrow = f"; fp32 for a model narrower than {width}, such as the demo" if width else ""
    default = f" (default {p['default']}{f' = {here} here' if here and here != p['default'] else ''}{narrow})" \
        if p.get("default") else ""
    row("formats", f"{', '.join(f['available'])}{default}; fastest here: {p['fastest'] or '?'}{close}")
    more(f"(a quick probe, not a benchmark: {p['shape']} per call: {timings})")
    if p.get("w8a8_kernel"):
        more(f"w8a8 runs on {p['w8a8_kernel']}")
    if p.get("w8a8_kernel_hint"):
        more(f"hint: {p['w8a8_kernel_hint']}")
    if p.get("fp32_layer"):
        more(f"fp32 layers of a narrow model (the demo) run on {p['fp32_layer']}")
    block("backends", [f"{name:<7} {'ready' if b['ready'] else 'no'}: {b['detail']}"
                       for name, b in r["backends"].items()])
    a = r["audio"]
    if a["devices"]:
        block("audio", [f"{d['index']:>3}  {d['name']}{'  (default)' if d['default'] else ''}" for d in a["devices"]])
    else:
        block("audio", [f"no output device: {a['why_none']}", f"hint: {a['hint']}"])
    block("paths", [f"{k:<9} {p['path']}  ({_size(p['bytes'])})" for k, p in r["paths"].items()])
    width = max(len(m["name"]) for m in r["models"])
    texts = []
    for m in r["models"]:
        state = m.get("state", "?")
        if m["present"]:
            state += ", verified" if m["verified"] else f", FAILS verification: {m.get('problem', '?')}"
            state += f", {_size(m['bytes'])}" if m["bytes"] else ""
        elif m.get("problem"):
            state += f": {m['problem']}"
        texts.append(f"{m['name']:<{width}}  {state}")
    block("models", texts)
    tuned = [(m["name"], m["tune"]) for m in r["models"] if m.get("tune")]
    s = r["speak"]
    if s.get("tune") and s["model"] not in {name for name, _ in tuned}:
        tuned.append((s["model"], s["tune"]))
    others = r.get("other_profiles", [])
    width = max([len(name) for name, _ in tuned], default=0)
    block("tune", [f"{name:<{width}}  {t['line']}" for name, t in tuned]
          + ([f"{len(others)} other profile(s) in {Path(others[0]).parent} (other models or machines)"]
             if others else []))
    e = r["espeak_ng"]
    row("espeak-ng", f"{e['path']} ({e['version']})" if e["path"] else "not installed (only the demo model needs it)")
    s = r["speak"]
    if s.get("frontend"):
        needs = f" (needs {s['needs']})" if s.get("needs") else " (needs nothing beyond leapvox's own packages)"
        row("frontend", f"{s['model']}: {s['frontend']}{needs}")
    if s["ready"]:
        loaded = f", loads in {s['loaded_s']:.1f} s" if "loaded_s" in s else ""
        row("speak", f"ready: model {s['model']} from {s['source']}{loaded}")
    else:
        row("speak", f"NOT READY: {s['reason']}")
        if s.get("hint"):
            more(f"hint: {s['hint']}")
    return "\n".join(lines)


def cmd_doctor(args) -> int:
    report = collect(args.model)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report))
    s = report["speak"]
    if not s["ready"]:
        hint = f" (hint: {s['hint']})" if s.get("hint") else ""
        print(f"leapvox: speak will not work here: {s['reason']}{hint}", file=sys.stderr, flush=True)
        return 1
    return 0
