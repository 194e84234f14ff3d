"""`--mode auto` against each fixed mode (not a test): with the model's tune profile here, is auto at least as fast as
the best fixed mode? xRT of auto, ar and spec, interleaved (the order rotates each round: A B C, B C A, ...), medians
over the rounds, a table, and JSON.

    python3 -m tests.benchmarks.auto_speed --model demo --tune --rounds 5 --weights fp32,w8a8 \
        --json tests/benchmarks/auto-speed-demo.json
    python3 -m tests.benchmarks.auto_speed --model demo --profile spec:int8 --rounds 5   # a profile written here

Runs under its own leapvox home (a temporary folder, or --home), so no profile of the real data folder is read or
written. `--tune` makes the profile with `leapvox tune MODEL` there (minutes: it says how many); `--profile MODE:FMT`
writes that decision instead (say so wherever its numbers are quoted), into the profile an unfinished tune run left
in --home (its offsets, tree and measurements kept) or a new one; `--home` with neither reuses the profile there.
The fixed modes run in the format auto chose (and in each `--weights` format besides), so the rows differ only in
the mode. Auto's time includes choosing (models.auto.choose: the profile read and the
weights' fingerprint, once per request as speak does); every run synthesises the same sentences with the same seeds.
Speed on a shared machine is noisy: read it with the load average printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

SENTENCES = [
    "The river rose slowly through the night.",
    "She packed the lamps, the bread and the blue coat.",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--home", type=Path, help="leapvox home to use (default: a temporary one)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--tune", action="store_true", help="make the profile with leapvox tune MODEL first")
    how.add_argument("--profile", metavar="MODE:FMT", help="write a profile deciding MODE (ar, spec) in FMT")
    p.add_argument("--weights", default="", help="comma-separated formats to run ar and spec in besides auto's")
    p.add_argument("--max-frames", type=int, help="frame cap per sentence (a random-weight checkpoint never says EOS: "
                                                  "without a cap it runs to the runaway guard)")
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def write_profile(folder: Path, mode: str, weights: str) -> None:
    import torch

    from leapvox.models.paths import model_key
    from leapvox.models.profile import (
        STAGES,
        Decision,
        Profile,
        fingerprint,
        machine_id,
        profile_path,
        save_profile,
        versions,
    )

    path = profile_path(folder)
    try:  # a tune run's measurements there (an unfinished run's offsets and tree), kept: only the decision is ours
        profile = Profile.from_json(path.read_text())
        kept = profile.fingerprint == fingerprint(folder)
    except (OSError, ValueError, TypeError, KeyError):
        kept = False
    if not kept:
        profile = Profile(model_key=model_key(folder), fingerprint=fingerprint(folder), machine=machine_id(),
                          versions=versions(), threads=torch.get_num_threads(),
                          created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    measured = f"{profile.tokens_per_call} tokens/call, verify {profile.verify_over_ar}x an ar call measured by " \
        f"leapvox tune, " if kept and profile.tokens_per_call else ""
    why = f"{mode}, {weights}: {measured}decided by tests/benchmarks/auto_speed.py --profile"
    profile.stages_done, profile.decision = list(STAGES), Decision(mode, weights, why)
    save_profile(path, profile)


def run_once(synth, opts_for, choose=None) -> tuple[float, float]:
    """(audio seconds, wall seconds) of every sentence, one after another; `choose()` (auto) timed in."""
    audio = wall = 0.0
    for i, text in enumerate(SENTENCES):
        t0 = time.perf_counter()
        opts = opts_for(i, choose() if choose else None)
        result = synth.synthesize(text, opts)
        wall += time.perf_counter() - t0
        audio += result.stats.audio_s
    return audio, wall


def main(argv=None) -> int:
    args = parse_args(argv)
    from leapvox.engine.fast import kernels

    session_kernels = kernels.cache_dir()
    home = args.home or Path(tempfile.mkdtemp(prefix="leapvox-auto-speed-"))
    os.environ["LEAPVOX_HOME"] = str(home)
    if session_kernels.is_dir() and not (home / "cache" / "kernels").exists():  # no second build of the kernels
        (home / "cache").mkdir(parents=True, exist_ok=True)
        (home / "cache" / "kernels").symlink_to(session_kernels, target_is_directory=True)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dataclasses import replace

    from leapvox.engine.options import build_options, validate
    from leapvox.models.auto import choose
    from leapvox.models.load import load_model, open_model

    folder = open_model(args.model)
    tune_s = None
    if args.tune:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "leapvox.app.cli", "tune", args.model]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        subprocess.run(cmd, check=True)
        tune_s = time.perf_counter() - t0
    elif args.profile:
        mode, _, weights = args.profile.partition(":")
        write_profile(folder.path, mode, weights)
    choice = choose(folder.path, "auto", "auto", "cpu", args.model)
    print(f"auto: {choice.line()}", file=sys.stderr)
    formats = [choice.weights] + [w for w in args.weights.split(",") if w and w != choice.weights]
    models = {w: load_model(folder, w) for w in formats}
    settings = {"seed": 0} if args.max_frames is None else {"seed": 0, "max_frames": args.max_frames}
    base = validate(build_options(settings, folder.defaults), folder.config)

    def fixed(mode):
        return lambda i, _c: replace(base, mode=mode, seed=i)

    def auto_opts(i, c):
        return replace(base, mode=c.mode, seed=i)

    configs = [("auto", models[choice.weights].synthesizer(), auto_opts,
                lambda: choose(folder.path, "auto", "auto", "cpu", args.model))]
    for w in formats:
        configs += [(f"{mode} {w}", models[w].synthesizer(), fixed(mode), None) for mode in ("ar", "spec")]
    for _name, synth, opts_for, c in configs:  # warm-up: first calls, allocations
        synth.synthesize(SENTENCES[0][:20], replace(opts_for(0, c() if c else None), max_frames=4))
    load_before = os.getloadavg()
    runs = {name: [] for name, *_ in configs}
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for name, synth, opts_for, c in order:
            audio, wall = run_once(synth, opts_for, c)
            runs[name].append({"audio_s": audio, "wall_s": wall, "xrt": audio / wall})
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {runs[n][-1]['xrt']:.3f}" for n in runs),
              file=sys.stderr)
    load_after = os.getloadavg()
    med = {name: median(x["xrt"] for x in rs) for name, rs in runs.items()}
    best = max((n for n in med if n != "auto"), key=med.get)
    width = max(map(len, med))
    print(f"{'config':<{width}}  median xRT  min    max")
    for name, rs in runs.items():
        xs = [x["xrt"] for x in rs]
        print(f"{name:<{width}}  {med[name]:10.3f}  {min(xs):.3f}  {max(xs):.3f}")
    print(f"auto / best fixed ({best}): {med['auto'] / med[best]:.3f}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; {torch.get_num_threads()} threads")
    record = {"model": args.model, "choice": {"mode": choice.mode, "weights": choice.weights, "why": choice.why,
                                              "source": choice.source},
              "profile": "leapvox tune" if args.tune else f"written: {args.profile}" if args.profile else "reused",
              "tune_s": tune_s, "sentences": SENTENCES,
              "max_frames": args.max_frames, "rounds": args.rounds, "threads": torch.get_num_threads(),
              "median_xrt": med, "best_fixed": best, "auto_over_best": med["auto"] / med[best],
              "load_average": {"before": load_before, "after": load_after}, "runs": runs,
              "cpu": _cpu(), "when": time.strftime("%Y-%m-%d %H:%M")}
    if args.json:
        from leapvox.models.files import write_text_atomic

        write_text_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


def _cpu() -> str:
    from leapvox.models.profile import machine_id

    return machine_id()


if __name__ == "__main__":
    sys.exit(main())
