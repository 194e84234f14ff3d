"""Developer benchmark: the bundled demo's drift from fp32 per weight format, on `leapvox tune`'s fidelity scale.

    python3 -m tests.benchmarks.tune_fidelity [--sentences 20] [--json tests/benchmarks/tune-fidelity-demo.json]

The figures models/tune.py argues its threshold from: the demo model speaks --sentences English sentences with fp32
sampled ar (seed i for sentence i, at most 75 frames each); each format is then teacher-forced on those codes and
compared with fp32 as tune's formats stage does (argmax agreement, KL of the code distributions at the sampling
temperature, code 0 and codes 1..15). Besides the formats that run here, `w8a8-vnni` and `w4a8-vnni` compute every
quantized product with the arithmetic of leapvox's compiled kernels (their float64 references: 8-bit activations
per row with a zero point; 4-bit weights and 8-bit activations per group of 64; the rotated down projection), the
kernels the demo's WER per format was measured with (tests/benchmarks/wer-demo-*.json), so the figures are those
of the WER runs on any CPU. Not a test: pytest collects nothing from this folder.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn


def w8a8_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """leapvox's w8a8 kernel in float64: x [M, K] to u8 per row with a zero point, exact integer dots."""
    lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
    sx = (hi - lo) / 255
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    zx = torch.round(-lo / sx).clamp(0, 255)
    qx = (torch.round(x / sx[:, None]) + zx[:, None]).clamp(0, 255).double()
    w = codes.double()
    return sx[:, None].double() * scales.double() * (qx @ w.T - zx[:, None].double() * w.sum(1))


class Emulated(nn.Module):
    """A linear layer computed with a compiled kernel's arithmetic (see the module docstring)."""

    def __init__(self, linear: nn.Linear, kind: str, rotate: int):
        from leapvox.engine.fast import kernels
        from leapvox.engine.fast.quant import quantize_weight, rotated_weight

        super().__init__()
        w, self.rotation = rotated_weight(linear, rotate)
        self.bias = None if linear.bias is None else linear.bias.detach().double()
        self.kind, self.out_features = kind, linear.out_features
        self.parts = kernels.quantize4(w) if kind == "w4" else quantize_weight(w, torch.float32, 127.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from leapvox.engine.fast import kernels

        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        if self.rotation is not None:
            x2 = (x2.reshape(-1, self.rotation.shape[0]) @ self.rotation).reshape(-1, shape[-1])
        y = kernels.w4a8_reference(x2, *self.parts) if self.kind == "w4" else w8a8_reference(x2, *self.parts)
        y = y if self.bias is None else y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


def emulate(model, weights: str) -> int:
    """Swap the fp32 `model`'s quantizable linears for kernel-arithmetic ones as quant.quantized_linear would for
    `weights` (w8a8 or w4a8); returns how many were 4-bit."""
    from leapvox.engine.fast.quant import (
        ROTATED_LAYERS,
        W4_LAYERS,
        Int8Linear,
        W4A8Linear,
        quantizable_linears,
        rotation_block,
    )

    fours = 0
    for parent, name, linear in quantizable_linears(model.tts):
        kind = "w4" if weights == "w4a8" and name in W4_LAYERS and W4A8Linear.fits(linear) else "w8"
        rotate = rotation_block(linear.in_features) if name in ROTATED_LAYERS else 0
        if name in ROTATED_LAYERS and not rotate:
            setattr(parent, name, Int8Linear.from_linear(linear))
            continue
        setattr(parent, name, Emulated(linear, kind, rotate))
        fours += kind == "w4"
    return fours


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.tune_fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=20, help="held-out sentences the demo speaks (default 20)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=Path("tests/benchmarks/tune-fidelity-demo.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from leapvox.app.recipes.offsets import SENTENCES
    from leapvox.engine.fast.quant import format_unavailable_reason
    from leapvox.engine.options import validate
    from leapvox.models import tune as T
    from leapvox.models.load import load_model
    from leapvox.models.recipes.tune import Utterance, code_logits, fidelity

    ref_model = load_model("demo", weights="fp32")
    synth = ref_model.synthesizer()
    texts = (T.TEXTS["english"] + SENTENCES)[: args.sentences]
    utts = []
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        opts = validate(replace(ref_model.defaults, seed=i, max_frames=75), ref_model.config)
        codes, _, _ = synth.generate_codes(text, opts)
        utts.append(Utterance(text, "auto", i, codes))
    frames = sum(len(u.codes) for u in utts)
    print(f"{len(utts)} sentences, {frames} frames spoken in {time.perf_counter() - t0:.0f} s")
    ref = code_logits(ref_model, utts)
    rows = {}
    for name in ("w8a8-vnni", "w4a8-vnni", "bf16", "int8", "w8a8", "int4", "w4a8"):
        if name.endswith("-vnni"):
            m = load_model("demo", weights="fp32")
            emulate(m, name.split("-")[0])
        elif format_unavailable_reason(name):
            rows[name] = {"unavailable": format_unavailable_reason(name)}
            continue
        else:
            m = load_model("demo", weights=name)
        rows[name] = fidelity(ref, code_logits(m, utts), m.defaults)
        rows[name]["passes"] = T.passes(rows[name]["kl_talker"], rows[name]["kl_predictor"])
        print(f"{name:<10} " + "  ".join(f"{k} {v}" for k, v in rows[name].items()), flush=True)
    wer = {}
    for w in ("fp32", "w8a8", "w4a8"):
        path = Path(__file__).parent / f"wer-demo-{w}.json"
        if path.is_file():
            d = json.loads(path.read_text())["demo:ar"]
            wer[w] = {"wer": d["wer"], "ci95": d["ci95"]}
    out = {"model": "demo", "sentences": len(utts), "frames": frames, "threads": args.threads,
           "thresholds": {"kl_talker": T.MAX_KL_TALKER, "kl_predictor": T.MAX_KL_PREDICTOR},
           "formats": rows, "wer": wer}
    args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
