"""The compiled fp32 decoder layer (`kernels/fp32.cpp`, `fused.fuse_fp32_layers`) against the module path, for a
narrow fp32 model (not a test):

    python3 -m tests.benchmarks.fused_fp32 [--model DIR] [--threads 2] [--rounds 5]
        [--json tests/benchmarks/fused-fp32-demo.json]

One process, the model loaded once in fp32 as `leapvox speak` loads it (its layers fused where the kernel is built);
per round the module path (`fused.disabled()`, as LEAPVOX_FUSED=0) then the compiled layers, or the other way round
on odd rounds: a predictor frame (the 15-code ar loop with sampling; median of 30), a talker step (one frame row
through the talker's layers after a 48-row prompt; median of 30) and a whole `ar` synthesis of two sentences with
fixed seeds (xRT = audio seconds / wall seconds, the codec included). Medians over rounds, the ratio, a table and
JSON (written atomically).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

SENTENCES = ["The river rose slowly through the night.", "She packed the lamps, the bread and the blue coat."]


def measure(model, reps: int) -> dict:
    from leapvox.engine.caches import FullCache
    from leapvox.engine.fast.predictor import predict_codes
    from leapvox.engine.sampling import SamplingParams

    talker = model.tts.talker
    cp, h = talker.code_predictor, talker.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    th, e = torch.randn(1, 1, h, generator=g), torch.randn(1, 1, h, generator=g)
    params = SamplingParams(do_sample=True, temperature=0.8, top_k=50)
    out = {}
    with torch.inference_mode():
        predict_codes(cp, th, e, params, g)  # builds the loop for this setting
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            predict_codes(cp, th, e, params, g)
            times.append(time.perf_counter() - t0)
        out["predictor_frame_ms"] = 1e3 * statistics.median(times)
        cache = FullCache(talker, 48, reps + 1)
        cache.prefill(torch.randn(1, 48, h, generator=g))
        x, times = torch.randn(1, 1, h, generator=g), []
        for k in range(reps):
            t0 = time.perf_counter()
            cache.step(x, k)
            times.append(time.perf_counter() - t0)
        out["talker_step_ms"] = 1e3 * statistics.median(times)
    syn = model.synthesizer()
    audio, t0 = 0.0, time.perf_counter()
    for i, text in enumerate(SENTENCES):
        result = syn.synthesize(text, replace(model.defaults, mode="ar", seed=i + 1))
        audio += result.duration_s
    out["xrt"] = audio / (time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    from leapvox.engine.fast import fused as fusion
    from leapvox.engine.fast import kernels
    from leapvox.models.catalog import ASSETS
    from leapvox.models.checkpoint import load_checkpoint
    from leapvox.models.files import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ASSETS / "demo", help="a narrow model folder (default: the demo)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30, help="frames and steps timed per round and path")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels.fp32_layer_op()  # built here and now where it is not yet (the loader would only start it)
    model = load_checkpoint(args.model, "fp32")
    layers = [*model.tts.talker.model.layers, *model.tts.talker.code_predictor.model.layers]
    fused = sum(isinstance(layer, fusion.FusedDecoderLayer) for layer in layers)
    if not fused:
        print(f"no layer is fused here ({kernels.fp32_unavailable_reason() or 'not a narrow fp32 model'})",
              file=sys.stderr)
        return 1
    paths = {"module": fusion.disabled, "compiled": contextlib.nullcontext}
    res = {name: [] for name in paths}
    for r in range(args.rounds):
        order = list(paths) if r % 2 == 0 else list(paths)[::-1]
        for name in order:
            with paths[name]():
                res[name].append(measure(model, args.reps))
        last = {n: res[n][-1] for n in paths}
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} predictor {v['predictor_frame_ms']:.2f} ms, talker {v['talker_step_ms']:.2f} ms, xRT {v['xrt']:.2f}"
            for n, v in last.items()), file=sys.stderr)
    keys = ("predictor_frame_ms", "talker_step_ms", "xrt")
    med = {n: {k: statistics.median(x[k] for x in runs) for k in keys} for n, runs in res.items()}
    print(f"{'measure':<20} {'module':>9} {'compiled':>9} {'ratio':>7}")
    for k in keys:
        a, b = med["module"][k], med["compiled"][k]
        print(f"{k:<20} {a:>9.2f} {b:>9.2f} {b / a:>7.3f}")
    record = {"model": str(args.model), "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
              "fused_layers": f"{fused} of {len(layers)}", "torch": torch.__version__, "medians": med,
              "ratio_compiled_over_module": {k: med["compiled"][k] / med["module"][k] for k in keys}, "rounds_raw": res}
    if args.json:
        write_text_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
