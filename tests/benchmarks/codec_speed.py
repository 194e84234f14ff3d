"""Codec decoder speed and precision at the 0.6B codec's real shapes (random weights, no checkpoint needed).

    python3 -m tests.benchmarks.codec_speed --frames 16 --repeats 4 --variants fp32,lowered,bf16 --baseline 71fe4d1~1
    python3 -m tests.benchmarks.codec_speed --error

Speed: ms per 80 ms frame, one-shot (`chunked_decode`, as `Synthesizer.decode`) and streamed the way
`Synthesizer.stream` pushes (2, 4, 8, then 16 frames per push, official 300/25 chunking), variants interleaved
A B A B in one process, medians, wall and process CPU time (on a busy box the CPU time is the steadier figure);
and `first`, a fresh stream's 1-frame push (ms for that frame: the codec's part of the time to first audio).
Variants: fp32 (the working tree), lowered (`CodecDecoder.lower_precision()`), bf16 (the whole module in bf16, as
the bf16 weight format loads it), base (engine/nets/codec.py at git revision `--baseline`, fp32). Weights follow
bench.py's checkpoint recipe (bench.random_state, seed 1), so the timings are those of the benchmark checkpoint.

Error (`--error`): waveform error of the lowered and whole-bf16 codec vs fp32 on the full-size codec with lively
random weights (the recipe tests/test_codec.py uses, scaled up), and on the official tiny fixture's codec.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from leapvox.engine.fast.codec_ops import FastCodecOps
from leapvox.engine.nets.codec import CodecConfig, CodecDecoder
from leapvox.models.recipes.geometry import SPEECH_TOKENIZER

from .bench import random_state

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "fixtures" / "reference"


def codec_at(revision: str, source: str = "engine/nets/codec.py", name: str = "codec_base"):
    """`source` (a module of engine/) as of a git revision, imported as its own module `name`."""
    src = subprocess.run(["git", "show", f"{revision}:{source}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    src = re.sub(r"^from \.(\w)", r"from leapvox.engine.\1", src, flags=re.M)  # relative imports, made absolute:
    src = re.sub(r"^from \. import", "from leapvox.engine import", src, flags=re.M)  # it loads outside the package
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (1, 16, frames), generator=torch.Generator().manual_seed(seed))


def streamed(m, codes: torch.Tensor, first: int = 2, most: int = 16) -> torch.Tensor:
    s, out, i, size = m.stream(official_chunking=True), [], 0, first
    while i < codes.shape[-1]:
        out.append(s.push(codes[..., i : i + size]))
        i, size = i + size, min(2 * size, most)
    return torch.cat(out, dim=-1)


def kernels_for(variant: str):
    """`X-torch`: variant X with leapvox's compiled codec kernels off (engine/kernels: SnakeBeta, overlap-add)."""
    if not variant.endswith("-torch"):
        return contextlib.nullcontext()
    from leapvox.engine.fast import kernels

    return kernels.disabled()


def build(variant: str, base_module=None):
    variant = variant.removesuffix("-torch")
    module = base_module if variant == "base" else sys.modules[CodecDecoder.__module__]
    ops = () if variant == "base" else (FastCodecOps(),)  # as the loader builds it (an older codec takes none)
    m = module.CodecDecoder(module.CodecConfig.from_dict(SPEECH_TOKENIZER), *ops).eval()
    m.load_state_dict(random_state(m, torch.float32, seed=1))
    if variant == "lowered":
        m.lower_precision()
    elif variant == "bf16":
        m.to(torch.bfloat16)
    return m


@torch.inference_mode()
def speed(variants: list[str], frames: int, repeats: int, baseline: str | None) -> dict:
    base = codec_at(baseline) if "base" in variants else None
    models = {v: build(v, base) for v in variants}
    codes = random_codes(frames)
    # first: a fresh stream's 1-frame push, the codec's share of the time to first audio (ms for that one frame)
    calls = {"oneshot": lambda m: m.chunked_decode(codes), "stream": lambda m: streamed(m, codes),
             "first": lambda m: m.stream().push(codes[..., :1])}
    per = {"oneshot": frames, "stream": frames, "first": 1}
    wall, cpu = {}, {}
    for v, m in models.items():  # warm-up, and streaming == one-shot
        with kernels_for(v):
            a, b, _ = (fn(m) for fn in calls.values())
        print(f"{v}: streamed == one-shot: {torch.equal(a, b)}", flush=True)
    for _ in range(repeats):
        for v, m in models.items():
            for kind, fn in calls.items():
                with kernels_for(v):
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn(m)
                wall.setdefault((v, kind), []).append(1e3 * (time.perf_counter() - t0) / per[kind])
                cpu.setdefault((v, kind), []).append(1e3 * (time.process_time() - c0) / per[kind])
    out = {}
    for (v, kind), ts in wall.items():
        out[f"{v}/{kind}"] = {"wall_median_ms": statistics.median(ts), "wall_min_ms": min(ts),
                              "cpu_median_ms": statistics.median(cpu[(v, kind)]), "wall_all_ms": ts}
        print(f"{v:8s} {kind:8s} wall median {statistics.median(ts):7.1f} ms/frame (min {min(ts):6.1f})   "
              f"cpu median {statistics.median(cpu[(v, kind)]):7.1f}", flush=True)
    return out


def lively(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights under which the audio depends on the codes without saturating (tests/test_codec.py's)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            leaf, noise = name.rsplit(".", 1)[-1], torch.randn(p.shape, generator=g)
            if leaf == "embedding_sum":
                p.copy_(0.1 * noise)
            elif leaf == "cluster_usage":
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=g))
            elif leaf in ("alpha", "beta"):
                p.copy_(0.1 * noise)
            elif leaf in ("scale", "gamma"):
                p.copy_(0.3 + 0.2 * torch.rand(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.01 * noise)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * noise)
            else:
                transposed = "block.1.conv" in name or ("upsample" in name and ".0.conv" in name)
                fan_in = 2 * p.shape[0] if transposed else p[0].numel()
                gain = 0.3 if ("conv2" in name or name.startswith("decoder.6")) else 1.0
                p.copy_(gain * noise / math.sqrt(fan_in))
    return m


def error_stats(ref: torch.Tensor, x: torch.Tensor) -> dict:
    ref, x = ref.float().flatten(), x.float().flatten()
    e = x - ref
    win = torch.hann_window(1024)

    def power(w):
        return torch.stft(w, 1024, 256, window=win, return_complex=True).abs().pow(2).clamp_min(1e-10)

    lsd = (10 * (power(ref).log10() - power(x).log10())).pow(2).mean(0).sqrt().mean().item()
    return {"snr_db": 10 * math.log10(ref.pow(2).mean().item() / max(e.pow(2).mean().item(), 1e-30)),
            "max_abs": e.abs().max().item(), "rms_err": e.pow(2).mean().sqrt().item(), "lsd_db": lsd}


@torch.inference_mode()
def error() -> dict:
    out = {}
    m = lively(CodecDecoder(CodecConfig.from_dict(SPEECH_TOKENIZER), FastCodecOps()).eval())
    codes = random_codes(40, seed=5)
    ref = m.chunked_decode(codes)
    for name, low in (("lowered", copy.deepcopy(m).lower_precision()), ("bf16", copy.deepcopy(m).to(torch.bfloat16))):
        out[f"full-size lively, 40 frames, {name}"] = error_stats(ref, low.chunked_decode(codes))
    folder = REFERENCE / "tiny-0b6" / "speech_tokenizer"
    if (REFERENCE / "expected.safetensors").exists() and (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        t = CodecDecoder(CodecConfig.from_dict(json.loads((folder / "config.json").read_text())), FastCodecOps()).eval()
        weights = load_file(str(folder / "model.safetensors"))
        t.load_state_dict({k.removeprefix("decoder."): v for k, v in weights.items() if k.startswith("decoder.")})
        expected = load_file(str(REFERENCE / "expected.safetensors"))
        c = expected["codec/T350/codes"].long()
        c = c[None] if c.shape[0] == 16 else c.T[None]
        wav = expected["codec/T350/wav"].float()
        for name, mm in (("fp32", t), ("lowered", copy.deepcopy(t).lower_precision())):
            out[f"official tiny fixture, T=350 vs official wav, {name}"] = error_stats(
                wav, mm.chunked_decode(c).reshape(-1)[: wav.numel()])
    for k, v in out.items():
        print(k, {a: round(b, 4) for a, b in v.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=16, help="frames decoded per timing (default 16)")
    p.add_argument("--repeats", type=int, default=4, help="interleaved rounds (default 4)")
    p.add_argument("--variants", default="fp32,lowered",
                   help="comma list of fp32, lowered, bf16, base; X-torch: X with leapvox's codec kernels off")
    p.add_argument("--baseline", default=None, help="git revision for the 'base' variant's engine/nets/codec.py")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--error", action="store_true", help="measure waveform error instead of speed")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = [v for v in args.variants.split(",") if v]
    plain = {v.removesuffix("-torch") for v in variants}
    if plain - {"fp32", "lowered", "bf16", "base"} or ("base" in plain and not args.baseline):
        p.error("variants are fp32, lowered, bf16 and base (base needs --baseline REV)")
    result = error() if args.error else speed(variants, args.frames, args.repeats, args.baseline)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
