"""Developer benchmark: the batch-1..16 weight-product routes on this CPU, as GB/s of weights read.

    python3 -m tests.benchmarks.kernels [--threads 2] [--rows 1,2,4,5,8,16] [--rounds 5] [--json FILE]

The weights are the seven linears of the 0.6B code predictor's decoder layer x 5 layers (q 2048x1024, k/v
1024x1024, o 1024x2048, gate/up 3072x1024, down 1024x3072): 80 M parameters, more than the L3 cache, as in a real
predictor call. Random weights and activations. Every route computes x [M, K] @ W^T for all 35 linears in a row;
the rounds interleave the routes (A B C A B C ...) and the table gives the median over rounds of each round's best
of a few repetitions, the effective weight read rate (bytes of the route's weight format / time), the time relative
to M = 1, and the machine's read bandwidth from a large sum measured in the same run (the floor: bytes / bandwidth).

Routes (each only where this torch runs it):
  fp32, bf16      F.linear on fp32 / bf16 weights (bf16 activations for bf16)
  int8            aten._weight_int8pack_mm: int8 weights, per-channel scales, bf16 activations (`--weights int8`)
  w8a8            `--weights w8a8` as leapvox builds it (the rotated down-projection included): int8 weights,
                  activations quantized to 8 bits per call, integer products; where leapvox's compiled kernel runs
                  (engine.kernels) two routes: w8a8-leapvox (that kernel) and w8a8-fbgemm (torch's
                  quantized::linear_dynamic, FBGEMM / QNNPACK), else one, w8a8 (torch's)
  fp16-fbgemm     quantized::linear_dynamic_fp16: fp16 weights, fp32 activations
  int4            aten._weight_int4pack_mm_for_cpu: 4-bit weights in groups of 64, bf16 activations
Not a test: pytest collects nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.fast import kernels
from leapvox.engine.fast.quant import Int8Linear, quantize_weight, quantized_linear

SHAPES = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072)]
NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYERS = 5


def _int4_route(weights):
    packed = []
    for w in weights:
        n, k = w.shape
        g = 64
        wg = w.view(n, k // g, g)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-8)
        q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.int32).view(n, k)
        qp = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack([scale.squeeze(-1).t(), (lo + 8 * scale).squeeze(-1).t()], -1).to(torch.bfloat16)
        packed.append((qp, sz.contiguous(), g))
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    return lambda xs: [mm(x, qp, g, sz) for x, (qp, sz, g) in zip(xs, packed, strict=True)]


def routes(weights: list[torch.Tensor]) -> dict:
    """name -> (bytes per weight, activation dtype, fn(list of x) -> outputs)."""
    out = {}
    out["fp32"] = (4, torch.float32, lambda xs: [F.linear(x, w) for x, w in zip(xs, weights, strict=True)])
    wb = [w.bfloat16() for w in weights]
    out["bf16"] = (2, torch.bfloat16, lambda xs: [F.linear(x, w) for x, w in zip(xs, wb, strict=True)])
    i8 = [Int8Linear(*quantize_weight(w)) for w in weights]
    out["int8"] = (1, torch.bfloat16, lambda xs: [
        torch.ops.aten._weight_int8pack_mm(x, q.codes, q.scales) for x, q in zip(xs, i8, strict=True)])
    linears, linears_fp = [], []
    for w, name in zip(weights, NAMES * LAYERS, strict=True):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data = w
        linears_fp.append(lin)
        linears.append(quantized_linear(lin, "w8a8", name))
    out["w8a8"] = (1, torch.float32, lambda xs: [q(x) for x, q in zip(xs, linears, strict=True)])
    if kernels.w8a8_op() is not None:  # the default above is leapvox's kernel here; torch's as well, for the A/B
        out["w8a8-leapvox"] = out.pop("w8a8")
        with kernels.disabled():
            fb = [quantized_linear(lin, "w8a8", name) for lin, name in zip(linears_fp, NAMES * LAYERS, strict=True)]
        out["w8a8-fbgemm"] = (1, torch.float32, lambda xs: [q(x) for x, q in zip(xs, fb, strict=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p16 = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]
    out["fp16-fbgemm"] = (2, torch.float32, lambda xs: [
        torch.ops.quantized.linear_dynamic_fp16(x, p) for x, p in zip(xs, p16, strict=True)])
    out["int4"] = (0.5, torch.bfloat16, _int4_route(weights))
    return out


def bandwidth(mbytes: int = 256) -> float:
    a = torch.ones(mbytes * 2**20 // 4)
    a.sum()
    best = min(_time(lambda: a.sum(), 1) for _ in range(5))
    return a.numel() * 4 / best / 1e9


def _time(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: torch's)")
    p.add_argument("--rows", default="1,2,4,5,8,16", help="comma-separated row counts M")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per round (best kept)")
    p.add_argument("--routes", default="", help="comma-separated routes (default all that run here)")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.02 for n, k in SHAPES * LAYERS]
    params = sum(w.numel() for w in weights)
    available, skipped = {}, {}
    for name, route in routes(weights).items():
        if args.routes and name not in args.routes.split(","):
            continue
        try:
            route[2]([torch.randn(1, w.shape[1]).to(route[1]) for w in weights])
            available[name] = route
        except Exception as e:  # a kernel this torch or CPU lacks
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    inputs = {m: {n: [torch.randn(m, w.shape[1], generator=g).to(r[1]) for w in weights]
                  for n, r in available.items()} for m in rows}
    samples: dict = {n: {m: [] for m in rows} for n in available}
    bw = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            bw.append(bandwidth())
            for m in rows:
                for name, (_, _, fn) in available.items():
                    xs = inputs[m][name]
                    fn(xs)
                    samples[name][m].append(min(_time(lambda fn=fn, xs=xs: fn(xs), 1) for _ in range(args.reps)))
    read = statistics.median(bw)
    result = {"threads": args.threads, "params": params, "read_gb_s": read, "rounds": args.rounds,
              "cpu": _cpu_name(), "torch": torch.__version__, "skipped": skipped, "routes": {}}
    lines = [f"read bandwidth {read:.1f} GB/s (a {256} MB sum), {args.threads} threads, {params / 1e6:.0f} M weights, "
             f"median of {args.rounds} interleaved rounds",
             "| route | " + " | ".join(f"M={m}" for m in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for name, (bpw, _, _) in available.items():
        per = {}
        for m in rows:
            t = statistics.median(samples[name][m])
            first = statistics.median(samples[name][rows[0]])
            per[m] = {"ms": 1e3 * t, "gb_s": params * bpw / t / 1e9, "vs_m1": t / first,
                      "floor_ratio": t / (params * bpw / read / 1e9)}
        result["routes"][name] = {"bytes_per_weight": bpw, "rows": per}
        cells = [f"{per[m]['ms']:.2f} ms, {per[m]['gb_s']:.1f} GB/s"
                 + (f", {per[m]['vs_m1']:.2f}x" if m != rows[0] else "") for m in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, why in skipped.items():
        lines.append(f"{name}: not run here ({why})")
    print("\n".join(lines))
    if args.json:
        tmp = f"{args.json}.part"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json)
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
