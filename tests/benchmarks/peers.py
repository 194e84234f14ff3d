"""Peer benchmark: leapvox next to the CPU peers on one random-weight checkpoint, in one run.

    python3 -m tests.benchmarks.peers                  # install (once), convert (once), 3 interleaved rounds
    python3 -m tests.benchmarks.peers --quick          # check the harness: 4 frames, 1 round
    python3 -m tests.benchmarks.peers --help

Not a test module: pytest collects nothing from this folder. The random-weight 0.6B CustomVoice checkpoint in the
official layout comes from bench.checkpoint_for("0.6b"). Each peer gets its own virtualenv in a cache folder outside
the repository (--cache, default ~/.cache/leapvox/peers; reused when present) and converts that checkpoint with its
own converter: vox-tts with `python -m vox.build --dtype bf16 --quant q8`, qwentts.cpp (PyPI
realtimetts-qwen-native-cpu) with tests/benchmarks/peers_gguf.py (written for this benchmark from the facts of its
GGUF format, Q8_0). The official qwen-tts joins when its virtualenv is given (--reference-python or
$LEAPVOX_REFERENCE_PYTHON, as for bench.py).

Rounds interleave the engines (A B C A B C ...), one process at a time, each process loading its model, speaking a
short warm-up and then the same text for exactly --frames frames with --threads threads, streaming; medians over
rounds are printed and written to --json (atomically). Per engine: talker, code-predictor (15 codes) and codec
milliseconds per frame, xRT, time to first audio, peak RSS (ru_maxrss of the child process), and the bytes of
weights the talker step and the predictor's 15 calls read per frame divided by the stage's time (GB/s), next to
the machine's read bandwidth measured in the same run (bench.bandwidth, once per round).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINES = ("leapvox", "vox", "qwentts", "official")
PEERS = {
    "vox": {
        "label": "vox-tts 0.19.5, q8",
        "venv": "vox-tts-0.19.5",
        "packages": ["vox-tts==0.19.5"],
        "module": "vox",
    },
    "qwentts": {
        "label": "qwentts.cpp (realtimetts-qwen-native-cpu 0.4.2), Q8_0",
        "venv": "qwentts-0.4.2",
        "packages": ["realtimetts-qwen-native-cpu==0.4.2", "gguf"],
        "module": "qwentts_cpp_cpu",
    },
}
# bytes per weight of each peer's format for the talker and predictor linears: vox q8 = 32 int8 + one fp32 scale per
# 32 weights; GGML Q8_0 = 32 int8 + one fp16 scale; the official package runs them in bf16.
# leapvox weight "formats" that are a real format with part of leapvox's compiled path turned off, for A/B runs:
# name -> (format, environment, label). w8a8-torch: torch's prebuilt kernels (engine.kernels off); w8a8-unfused:
# leapvox's kernel for the products but each decoder layer through its modules (engine.fused off)
VARIANTS = {
    "w8a8-torch": ("w8a8", {"LEAPVOX_KERNELS": "0"}, "torch's kernels"),
    "w8a8-unfused": ("w8a8", {"LEAPVOX_FUSED": "0"}, "layers unfused"),
}
BYTES_PER_WEIGHT = {"vox": 36 / 32, "qwentts": 34 / 32, "official": 2.0}
SPEAKER, LANGUAGE = "aiden", "english"  # the official side speaks the first speaker by name, in English


class Usage(Exception):
    pass


def say(msg: str) -> None:
    print(f"peers: {msg}", file=sys.stderr, flush=True)


def default_cache() -> Path:
    env = os.environ.get("LEAPVOX_PEERS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "leapvox" / "peers"


# ---- children: timed, with their peak memory ------------------------------------------------------------------


def run_child(cmd: list[str], env: dict | None = None, timeout: float = 1800, nice: bool = False) -> dict:
    """Run `cmd` to the end; returns rc, stdout, stderr, wall seconds and the child's peak RSS (MiB, ru_maxrss)."""
    if nice:
        cmd = ["nice", "-n", "19", *cmd]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=str(ROOT))
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "stdout": out.read(),
            "stderr": err.read(),
            "wall_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # KiB on Linux
        }


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line")


def tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


# ---- installs and conversions ------------------------------------------------------------------------------------


def venv_python(cache: Path, name: str) -> Path:
    return cache / PEERS[name]["venv"] / "bin" / "python"


def ensure_venv(cache: Path, name: str, install: bool) -> str | None:
    """None when the peer's virtualenv is ready (created and filled now if missing and `install`), else why not."""
    spec = PEERS[name]
    folder = cache / spec["venv"]
    marker = folder / "leapvox-peers.json"
    py = venv_python(cache, name)
    if marker.is_file() and py.is_file():
        say(f"{name}: reusing the virtualenv {folder}")
        return None
    if not install:
        return f"no virtualenv at {folder} (run without --skip-install to create it)"
    if folder.exists():
        shutil.rmtree(folder)  # a half-made one
    folder.parent.mkdir(parents=True, exist_ok=True)
    say(f"{name}: creating the virtualenv {folder} and installing {' '.join(spec['packages'])} from PyPI (nice 19)")
    for cmd in (
        [sys.executable, "-m", "venv", str(folder)],
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *spec["packages"]],
        [str(py), "-c", f"import {spec['module']}"],
    ):
        r = run_child(cmd, nice=True, timeout=3600)
        if r["rc"] != 0:
            return f"installing failed: {' '.join(cmd[:4])}...: {tail(r['stderr'] or r['stdout'])}"
    marker.write_text(json.dumps({"packages": spec["packages"], "created": time.strftime("%Y-%m-%d %H:%M:%S")}))
    return None


def checkpoint_stamp(folder: Path) -> str:
    st = (folder / "model.safetensors").stat()
    return f"{folder.name}-{int(st.st_mtime)}-{st.st_size}"


def ensure_converted(cache: Path, name: str, folder: Path) -> tuple[dict | None, str | None]:
    """The peer's converted model files for the checkpoint in `folder` ({"model": ...} or {"talker", "codec"}),
    converted now (nice 19) when not cached; or (None, why not)."""
    out = cache / "models" / checkpoint_stamp(folder)
    out.mkdir(parents=True, exist_ok=True)
    py = str(venv_python(cache, name))
    if name == "vox":
        final = out / "vox-q8.tmod"
        if final.is_file():
            say(f"vox: reusing {final}")
            return {"model": str(final), "bytes": final.stat().st_size}, None
        tmp = out / "vox-q8.part.tmod"
        say(f"vox: converting with python -m vox.build --dtype bf16 --quant q8 (nice 19) -> {final}")
        cmd = [py, "-m", "vox.build", "--model", str(folder), "--dtype", "bf16", "--quant", "q8", "-o", str(tmp)]
        r = run_child(cmd, nice=True, timeout=7200)
        if r["rc"] != 0 or not tmp.is_file():
            return None, f"vox.build failed: {tail(r['stderr'] or r['stdout'])}"
        os.replace(tmp, final)
        say(f"vox: converted in {r['wall_s']:.0f} s")
        return {"model": str(final), "bytes": final.stat().st_size}, None
    from tests.benchmarks.peers_gguf import VERSION

    sub = out / "qwentts-Q8_0"
    stamp = sub / "converted.json"
    files = {"talker": str(sub / "talker-Q8_0.gguf"), "codec": str(sub / "codec-Q8_0.gguf")}
    try:
        if json.loads(stamp.read_text()).get("version") == VERSION and all(Path(p).is_file() for p in files.values()):
            say(f"qwentts: reusing {sub}")
            return {**files, "bytes": sum(Path(p).stat().st_size for p in files.values())}, None
    except (OSError, ValueError):
        pass
    say(f"qwentts: converting to GGUF Q8_0 with tests/benchmarks/peers_gguf.py (nice 19) -> {sub}")
    r = run_child([py, str(HERE / "peers_gguf.py"), str(folder), str(sub)], nice=True, timeout=7200)
    if r["rc"] != 0:
        return None, f"GGUF conversion failed: {tail(r['stderr'] or r['stdout'])}"
    stamp.write_text(r["stdout"].strip().splitlines()[-1])
    say(f"qwentts: converted in {r['wall_s']:.0f} s")
    return {**files, "bytes": sum(Path(p).stat().st_size for p in files.values())}, None


# ---- weight bytes per stage --------------------------------------------------------------------------------------


def stage_weights(folder: Path) -> dict:
    """Weights (counts) the talker step and one code-predictor call read: their attention and MLP linears plus the
    talker's codec head / one predictor head, from the checkpoint's safetensors header."""
    import struct

    with open(folder / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    cfg = json.loads((folder / "config.json").read_text())
    linear = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight")
    linear += (".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")

    def count(name: str) -> int:
        c = 1
        for d in header[name]["shape"]:
            c *= d
        return c

    talker = sum(count(k) for k in header if k.startswith("talker.model.layers.") and k.endswith(linear))
    talker += count("talker.codec_head.weight")
    call = sum(count(k) for k in header if k.startswith("talker.code_predictor.model.layers.") and k.endswith(linear))
    call += count("talker.code_predictor.lm_head.0.weight")
    return {"talker": talker, "predictor_call": call, "codes": cfg["talker_config"]["num_code_groups"] - 1}


def source_state() -> dict:
    """The commit leapvox ran from and its uncommitted runtime files (the numbers belong to that working tree)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = [ln[3:] for ln in git("status", "--porcelain", "--", "app", "engine", "models").splitlines() if ln]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": dirty}


# ---- leapvox's side ----------------------------------------------------------------------------------------------


def leapvox_worker(a: dict) -> dict:
    """In a fresh process: load the checkpoint in `weights`, warm up, speak exactly `frames` frames through the
    streaming path (bench.end_to_end), seed after seed until EOS does not cut the run short."""
    from dataclasses import replace

    import torch

    from tests.benchmarks.bench import end_to_end

    torch.set_num_threads(a["threads"])
    from leapvox.models.load import load_model

    try:
        from leapvox.engine.fast.quant import resolve_weights

        resolved = resolve_weights(a["weights"])
    except ImportError:
        resolved = a["weights"]
    t0 = time.perf_counter()
    model = load_model(Path(a["model"]), weights=a["weights"])
    load_s = time.perf_counter() - t0
    synth = model.synthesizer()
    opts = replace(model.defaults, runaway_guard=False, mode="ar", speaker=SPEAKER, language=LANGUAGE)
    end_to_end(synth, replace(opts, max_frames=4, seed=1000), a["text"])  # warm-up
    tries = []
    for k in range(5):
        run = end_to_end(synth, replace(opts, max_frames=a["frames"], seed=a["seed"] + k), a["text"])
        tries.append(a["seed"] + k)
        if run["frames"] >= a["frames"]:
            break
    out = {
        "frames": run["frames"],
        "stop_reason": run["stop_reason"],
        "audio_s": run["audio_s"],
        "elapsed_s": run["elapsed_s"],
        "xrt": run["xrt"],
        "first_audio_s": run["first_audio_s"],
        "prefill_ms": run["prefill_ms"],
        "talker_ms": run["talker_ms_per_frame"],
        "predictor_ms": run["predictor_ms_per_frame"],
        "codec_ms": run["codec_ms_per_frame"],
        "overhead_ms": run["overhead_ms_per_frame"],
        "seeds_tried": tries,
        "load_s": load_s,
        "threads": torch.get_num_threads(),
        "weights": resolved,
    }
    try:
        from leapvox.engine.fast import kernels

        out["kernel"] = kernels.describe()
    except ImportError:  # a leapvox before engine.kernels
        pass
    try:  # the bytes leapvox's own format reads (int8 codes + scales, or bf16 / fp32 weights)
        from leapvox.engine.fast.quant import linear_weight_bytes

        talker, cp = model.tts.talker, model.tts.talker.code_predictor
        out["talker_bytes"] = linear_weight_bytes(talker.model) + linear_weight_bytes(talker.codec_head)
        call = linear_weight_bytes(cp.model) + linear_weight_bytes(cp.lm_head[0])
        out["predictor_bytes"] = call * (cp.cfg.num_code_groups - 1)  # 15 calls per frame
    except Exception as e:  # noqa: BLE001 (the kernels are being rewritten: a missing helper must not lose the run)
        out["bytes_note"] = f"weight bytes not available: {e}"
    return out


# ---- one measurement -----------------------------------------------------------------------------------------------


def measure(engine: str, ctx: dict) -> dict:
    """One process of `engine` (a key of ctx["runs"]); its JSON result with peak_rss_mb, or {"error": ...}."""
    spec = ctx["runs"][engine]
    env = dict(os.environ, OMP_NUM_THREADS=str(ctx["threads"]), MKL_NUM_THREADS=str(ctx["threads"]))
    env.update(spec.get("env", {}))
    common = {"text": ctx["text"], "frames": ctx["frames"], "seed": ctx["seed"], "threads": ctx["threads"]}
    common.update(speaker=SPEAKER, language=LANGUAGE)
    if spec["kind"] == "leapvox":
        args = dict(common, model=str(ctx["folder"]), weights=spec["weights"])
        cmd = [sys.executable, "-m", "tests.benchmarks.peers", "--worker", json.dumps(args)]
    elif spec["kind"] in PEERS:
        args = dict(common, **spec["files"])
        cmd = [str(venv_python(ctx["cache"], spec["kind"])), str(HERE / "peers_workers.py"), spec["kind"]]
        cmd.append(json.dumps(args))
    else:  # the official package, through bench.py's runner (bench_official.py in the reference virtualenv)
        from tests.benchmarks import bench

        try:
            o = bench.run_official(ctx["folder"], "bf16", ctx["frames"], 1, text=ctx["text"], timeout=ctx["timeout"])
            r = o["runs"][0]
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as e:
            return {"error": str(e)}
        return {
            "frames": r["frames"],
            "audio_s": r["audio_s"],
            "elapsed_s": r["elapsed_s"],
            "xrt": r["xrt"],
            "first_audio_s": r["first_frame_s"],
            "first_audio_is_codes": True,
            "talker_ms": r["talker_step_ms"],
            "predictor_ms": r["predictor_frame_ms"],
            "codec_ms": r["codec_ms_per_frame"],
            "peak_rss_mb": o["peak_rss_mb"],
            "load_s": o["load_s"],
            "threads": o["threads"],
        }
    r = run_child(cmd, env=env, timeout=ctx["timeout"])
    if r["rc"] != 0:
        return {"error": f"exit {r['rc']}: {tail(r['stderr'])}"}
    try:
        out = last_json(r["stdout"])
    except ValueError:
        return {"error": f"no result: {tail(r['stderr'])}"}
    out["peak_rss_mb"] = r["peak_rss_mb"]
    return out


# ---- summary ---------------------------------------------------------------------------------------------------------

METRICS = ("talker_ms", "predictor_ms", "codec_ms", "xrt", "first_audio_s", "peak_rss_mb", "elapsed_s", "frames")


def summarize(result: dict) -> None:
    """Medians over rounds per engine, weight GB/s per stage, ratios to leapvox's fastest format."""
    bw = [b["read_gb_s"] for b in result["bandwidth"]]
    result["read_gb_s"] = statistics.median(bw) if bw else None
    w = result["weights_read"]
    for rec in result["engines"].values():
        ok = [r for r in rec["rounds"] if "error" not in r]
        med = {}
        for m in METRICS:
            vals = [r[m] for r in ok if r.get(m) is not None]
            med[m] = statistics.median(vals) if vals else None
        rec["median"] = med
        rec["ok_rounds"] = len(ok)
        if rec["kind"] == "leapvox":
            resolved = {r.get("weights") for r in ok} - {None, rec["weights"]}
            if resolved and "(" not in rec["label"]:
                rec["label"] += f" (= {', '.join(sorted(resolved))})"
            tb = next((r["talker_bytes"] for r in ok if "talker_bytes" in r), None)
            pb = next((r["predictor_bytes"] for r in ok if "predictor_bytes" in r), None)
        else:
            per = BYTES_PER_WEIGHT[rec["kind"]]
            tb, pb = w["talker"] * per, w["predictor_call"] * w["codes"] * per
        rec["talker_bytes"], rec["predictor_bytes"] = tb, pb
        for stage, b in (("talker", tb), ("predictor", pb)):
            ms = med.get(f"{stage}_ms")
            rec[f"{stage}_gb_s"] = b / (ms / 1e3) / 1e9 if b and ms else None
    ours = [r for r in result["engines"].values() if r["kind"] == "leapvox" and r["median"]["xrt"]]
    base = max(ours, key=lambda r: r["median"]["xrt"], default=None)  # leapvox's fastest format in this run
    result["leapvox_base"] = base["label"] if base else None
    if base:
        for rec in result["engines"].values():
            x = rec["median"]["xrt"]
            rec["leapvox_xrt_over_this"] = base["median"]["xrt"] / x if x else None


def table(result: dict) -> str:
    def f(v, fmt):
        return "—" if v is None else fmt.format(v)

    head = (
        "| engine, format | talker ms/frame | predictor ms/frame (15 codes) | codec ms/frame | ×RT | first audio "
        "| peak RSS | weight GB/s talker / predictor | runs |"
    )
    lines = [head, "|" + "---|" * 9]
    for rec in result["engines"].values():
        m = rec["median"]
        first = f(m["first_audio_s"], "{:.2f} s") + (" (codes)" if rec["kind"] == "official" else "")
        gbs = f"{f(rec['talker_gb_s'], '{:.1f}')} / {f(rec['predictor_gb_s'], '{:.1f}')}"
        runs = f"{rec['ok_rounds']}/{len(rec['rounds'])}"
        lines.append(
            f"| {rec['label']} | {f(m['talker_ms'], '{:.1f}')} | {f(m['predictor_ms'], '{:.1f}')} | "
            f"{f(m['codec_ms'], '{:.1f}')} | {f(m['xrt'], '{:.3f}')} | {first} | {f(m['peak_rss_mb'], '{:,.0f} MiB')} "
            f"| {gbs} | {runs} |"
        )
    bw = result.get("read_gb_s")
    lines.append("")
    lines.append(
        f"{result['frames']} frames per run, {result['threads']} threads, "
        f"{result.get('rounds_done', result['rounds'])} of {result['rounds']} interleaved round(s), "
        f"medians; machine read bandwidth (large sum, same run): {f(bw, '{:.1f}')} GB/s"
    )
    for rec in result["engines"].values():
        if rec.get("leapvox_xrt_over_this") and rec["kind"] != "leapvox":
            lines.append(f"  {result['leapvox_base']} ×RT / {rec['label']}: {rec['leapvox_xrt_over_this']:.2f}×")
        errors = [r["error"] for r in rec["rounds"] if "error" in r]
        if errors:
            lines.append(f"  {rec['label']}: {len(errors)} failed run(s): {errors[-1]}")
        short = [r["frames"] for r in rec["rounds"] if "error" not in r and r.get("frames") != result["frames"]]
        if short:
            lines.append(f"  {rec['label']}: run(s) with {short} frames instead of {result['frames']}")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)


# ---- command line ----------------------------------------------------------------------------------------------------


def parser():
    import argparse

    from tests.benchmarks.bench import TEXT

    p = argparse.ArgumentParser(
        prog="python3 -m tests.benchmarks.peers",
        description="Time leapvox next to vox-tts, qwentts.cpp and (when its virtualenv is given) the official "
        "qwen-tts on the same random-weight 0.6B checkpoint: interleaved rounds, exactly --frames frames, "
        "--threads threads, medians; installs and converts the peers once into --cache.",
    )
    p.add_argument(
        "--engines", default="leapvox,vox,qwentts,official", help="comma-separated, from " + ", ".join(ENGINES)
    )
    p.add_argument(
        "--weights", default="int8",
        help="leapvox weight formats, comma-separated, e.g. int8,w8a8,auto; w8a8-torch = w8a8 on torch's kernels, "
             "w8a8-unfused = w8a8 with each decoder layer through its modules (default int8)",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--frames", type=int, default=32, help="frames every engine speaks per run (default 32)")
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--seed", type=int, default=0, help="first sampling seed (a run cut short by EOS tries the next)")
    p.add_argument("--text", default=TEXT, help="the text (default: bench.py's 115-character sentence)")
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="virtualenvs and converted models (default $LEAPVOX_PEERS_CACHE or ~/.cache/leapvox/peers)",
    )
    p.add_argument("--skip-install", action="store_true", help="never create or fill a virtualenv; skip missing ones")
    p.add_argument(
        "--reference-python",
        type=Path,
        help="python of the official qwen-tts virtualenv "
        "(default $LEAPVOX_REFERENCE_PYTHON; none: the official side is skipped)",
    )
    p.add_argument("--quick", action="store_true", help="check the harness: 4 frames, 1 round, JSON into the cache")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one engine's run may take (default 1800)")
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write the results (default "
        "tests/benchmarks/peers-0.6b-2t.json; with --quick, peers-quick.json in the cache)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(json.dumps(leapvox_worker(json.loads(argv[1]))), flush=True)
        return 0
    args = parser().parse_args(argv)
    try:
        return run(args)
    except Usage as e:
        print(f"peers: error: {e}", file=sys.stderr, flush=True)
        return 2


def run(args) -> int:
    from tests.benchmarks import bench

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise Usage(f"unknown engine {bad[0] if bad else '(none)'!r} (hint: choose from {', '.join(ENGINES)})")
    weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    try:  # whatever leapvox's loader takes, `auto` included
        from leapvox.engine.fast.quant import WEIGHT_FORMATS

        known = (*WEIGHT_FORMATS, "auto", *VARIANTS)
    except ImportError:
        known = bench.WEIGHTS
    badw = [w for w in weights if w not in known]
    if badw or ("leapvox" in engines and not weights):
        raise Usage(f"unknown weight format {badw[0] if badw else '(none)'!r} (hint: {', '.join(known)})")
    if args.quick:
        args.frames, args.rounds = 4, 1
    if args.rounds < 1 or args.frames < 2 or args.threads < 1 or args.timeout <= 0:
        raise Usage("--rounds and --threads must be >= 1, --frames >= 2, --timeout > 0")
    if not args.text.strip():
        raise Usage("--text is empty")
    cache = (args.cache or default_cache()).expanduser().resolve()
    json_path = args.json or (cache / "peers-quick.json" if args.quick else HERE / f"peers-0.6b-{args.threads}t.json")
    if not json_path.expanduser().resolve().parent.is_dir() and not args.quick:
        raise Usage(f"cannot write {json_path}: its folder does not exist")
    if args.reference_python is not None:
        bench.REFERENCE_PYTHON = args.reference_python
    t_start = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)  # every child, the official too
    import torch

    torch.set_num_threads(args.threads)
    folder = bench.checkpoint_for("0.6b", say=say)
    say(f"checkpoint {folder}")
    cache.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)

    runs, skipped = {}, {}
    for e in engines:
        if e == "leapvox":
            for w in weights:
                runs[f"leapvox-{w}"] = {"kind": "leapvox", "weights": w, "label": f"leapvox {w}"}
                if w in VARIANTS:  # the same format with part of leapvox's compiled path turned off
                    fmt, env, what = VARIANTS[w]
                    runs[f"leapvox-{w}"].update(weights=fmt, env=env, label=f"leapvox {fmt}, {what}")
        elif e == "official":
            why = bench.official_available()
            if why:
                skipped[e] = why
                say(why)
            else:
                runs[e] = {"kind": "official", "label": "official qwen-tts, bf16"}
        else:
            why = ensure_venv(cache, e, install=not args.skip_install)
            files = None
            if why is None:
                files, why = ensure_converted(cache, e, folder)
            if why:
                skipped[e] = why
                say(f"{e}: skipped: {why}")
            else:
                runs[e] = {"kind": e, "label": PEERS[e]["label"], "files": files}
    if not runs:
        raise Usage("no engine left to run (see the lines above)")
    ctx = {"runs": runs, "folder": folder, "cache": cache, "text": args.text, "frames": args.frames}
    ctx.update(seed=args.seed, threads=args.threads, timeout=args.timeout)
    result = {
        "checkpoint": str(folder),
        "text": args.text,
        "frames": args.frames,
        "threads": args.threads,
        "rounds": args.rounds,
        "rounds_done": 0,
        "speaker": SPEAKER,
        "language": LANGUAGE,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "leapvox_source": source_state(),
        "weights_read": stage_weights(folder),
        "bandwidth": [],
        "skipped": skipped,
        "engines": {k: {**v, "rounds": []} for k, v in runs.items()},
    }
    for rec in result["engines"].values():
        rec.pop("files", None)
    from leapvox.models.files import write_text_atomic

    t_timing = time.perf_counter()
    for i in range(args.rounds):
        bw = bench.bandwidth()
        result["bandwidth"].append(bw)
        say(f"round {i + 1}/{args.rounds}: read bandwidth {bw['read_gb_s']:.1f} GB/s")
        for name in runs:
            t0 = time.perf_counter()
            out = measure(name, ctx)
            result["engines"][name]["rounds"].append(out)
            if "error" in out:
                say(f"round {i + 1}: {name}: failed: {out['error']}")
            else:
                say(
                    f"round {i + 1}: {name}: xRT {out['xrt']:.3f}, {out.get('frames')} frames, "
                    f"talker/predictor/codec ms {out.get('talker_ms') or 0:.1f}/{out.get('predictor_ms') or 0:.1f}/"
                    f"{out.get('codec_ms') or 0:.1f}, peak {out['peak_rss_mb']:.0f} MiB "
                    f"({time.perf_counter() - t0:.0f} s)"
                )
        result["rounds_done"] = i + 1
        if i + 1 < args.rounds:  # a run cut short leaves the rounds it finished
            summarize(result)
            write_text_atomic(json_path, json.dumps(result, indent=1))
    summarize(result)
    result["timing_wall_s"] = time.perf_counter() - t_timing
    result["wall_s"] = time.perf_counter() - t_start
    print(table(result), flush=True)
    write_text_atomic(json_path, json.dumps(result, indent=1))
    say(f"wrote {json_path} ({result['wall_s']:.0f} s in all, {result['timing_wall_s']:.0f} s timing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
