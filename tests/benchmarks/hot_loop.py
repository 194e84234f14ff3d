"""Developer benchmark: the hot loop of this tree against another copy of leapvox (BEFORE), interleaved.

    python3 -m tests.benchmarks.hot_loop --before-path DIR [--before-name leapvox_before] [--threads 2]
        [--rounds 6] [--steps 24] [--frames 8] [--formats w8a8,w4a8] [--json tests/benchmarks/hot-loop.json]

BEFORE is a copy of the package importable from DIR under another name (e.g. DIR/leapvox_before/{engine,models}
with `leapvox.` rewritten to `leapvox_before.` in its imports, and its kernels' torch namespace `leapvox_kernels`
renamed too, e.g. to `leapvox_kernels_before`: two libraries cannot register one namespace in a process, and the
tree whose library failed to load would run torch's fallback; each format's `setup` records which kernel each tree
ran and how many layers it fused). Both load the same random weights of the 0.6B
architecture (a small text vocabulary: the text table is not on the hot loop) and convert them as each one's loader
does (`quantize_model`, then `fused.fuse_decoder_layers` where the tree has it). Per format and round, BEFORE then
AFTER (A B A B ...): a talker step (one frame row through the 28 layers and the code-0 head, full cache, after a
48-row prompt; the median of `--steps` consecutive steps) and a predictor frame (the 15-code ar loop,
`predict_codes`, with sampling; the median of `--frames` frames). The table gives the median over rounds and the
ratio AFTER / BEFORE; on a shared machine the ratio is the figure to quote. Not a test: pytest collects nothing here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from leapvox.models.recipes.geometry import model_config


def _modules(pkg: str) -> dict:
    """The tree's modules by short name: engine/nets/ and engine/fast/ since the layout of issue #38, engine/ before."""
    where = {"config": ("",), "caches": ("",), "sampling": ("",), "talker": ("nets.", ""), "quant": ("fast.", ""),
             "predictor": ("fast.", ""), "fused": ("fast.", ""), "kernels": ("fast.", "")}
    mods = {}
    for name, places in where.items():
        for place in places:
            try:
                mods[name] = importlib.import_module(f"{pkg}.engine.{place}{name}")
                break
            except ImportError:
                mods[name] = None
    return mods


def random_state(cfg_dict: dict, seed: int = 0) -> dict:
    """One random state dict of the model, shared by both trees."""
    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.talker import TTSModel

    from .bench import random_state as state_of

    with torch.device("meta"):
        tts = TTSModel(TTSConfig.from_dict(cfg_dict).talker)
    return state_of(tts, torch.float32, seed)


def build(mods: dict, cfg_dict: dict, state: dict, weights: str):
    """The talker of one tree in `weights`, converted as that tree's loader converts it."""
    tts = mods["talker"].TTSModel(mods["config"].TTSConfig.from_dict(cfg_dict).talker).eval()
    tts.load_state_dict(state)
    mods["quant"].quantize_model(tts, weights)
    f = mods["fused"]
    if f is not None and hasattr(f, "fuse_decoder_layers"):
        f.fuse_decoder_layers(tts)
    layers = [*tts.talker.model.layers, *tts.talker.code_predictor.model.layers]
    if f is not None and hasattr(f, "FusedDecoderLayer"):  # issue #38's layout: layers swapped at load
        fused = sum(isinstance(layer, f.FusedDecoderLayer) for layer in layers)
    elif f is not None and hasattr(f, "fused_layer"):  # before it: the network asked fused.fused_layer per call
        fused = sum(f.fused_layer(layer) is not None for layer in layers)
    else:
        fused = 0
    return tts.talker, fused


def kernel_of(mods: dict) -> str:
    """Which w8a8 kernel the tree runs here (its kernels.describe()): both trees must name leapvox's own, or the
    ratio compares a kernel with its fallback."""
    k = mods.get("kernels")
    return k.describe() if k is not None and hasattr(k, "describe") else "unknown"


@torch.inference_mode()
def talker_step(mods: dict, talker, steps: int, prompt: int = 48) -> float:
    """Median seconds of `steps` consecutive talker steps after a `prompt`-row prefill."""
    g = torch.Generator().manual_seed(0)
    h = talker.cfg.hidden_size
    cache = mods["caches"].FullCache(talker, prompt, steps + 1)
    cache.prefill(torch.randn(1, prompt, h, generator=g))
    x = torch.randn(1, 1, h, generator=g)
    times = []
    for k in range(steps):
        t0 = time.perf_counter()
        cache.step(x, k)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def predictor_frame(mods: dict, talker, frames: int) -> float:
    """Median seconds of `frames` calls of the 15-code ar loop (sampling on)."""
    cp = talker.code_predictor
    g = torch.Generator().manual_seed(0)
    th = talker.cfg.hidden_size
    h, e = torch.randn(1, 1, th, generator=g), torch.randn(1, 1, th, generator=g)
    params = mods["sampling"].SamplingParams(do_sample=True, temperature=0.9, top_k=50)
    predict = mods["predictor"].predict_codes
    predict(cp, h, e, params, g)  # builds the loop
    times = []
    for _ in range(frames):
        t0 = time.perf_counter()
        predict(cp, h, e, params, g)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(before: str, formats: list[str], rounds: int, steps: int, frames: int) -> dict:
    cfg_dict = model_config("0.6b")
    cfg_dict["talker_config"]["text_vocab_size"] = 1024  # the text table is not on the hot loop
    state = random_state(cfg_dict)
    trees = {"before": _modules(before), "after": _modules("leapvox")}
    out = {}
    for weights in formats:
        why = trees["after"]["quant"].format_unavailable_reason(weights)
        if why:
            out[weights] = {"unavailable": why}
            print(f"{weights}: not measured here ({why})", file=sys.stderr)
            continue
        built = {name: build(mods, cfg_dict, state, weights) for name, mods in trees.items()}
        talkers = {name: b[0] for name, b in built.items()}
        setup = {name: {"kernel": kernel_of(mods), "fused_layers": built[name][1]} for name, mods in trees.items()}
        for name, what in setup.items():
            print(f"{weights} {name}: {what['kernel']}; {what['fused_layers']} layers fused", file=sys.stderr)
        for name, mods in trees.items():  # warm-up: kernels, loops, caches
            talker_step(mods, talkers[name], 4)
            predictor_frame(mods, talkers[name], 2)
        res = {m: {"before": [], "after": []} for m in ("talker_step_ms", "predictor_frame_ms")}
        for r in range(rounds):
            for name in ("before", "after"):
                mods = trees[name]
                res["talker_step_ms"][name].append(1e3 * talker_step(mods, talkers[name], steps))
                res["predictor_frame_ms"][name].append(1e3 * predictor_frame(mods, talkers[name], frames))
            t, f = res["talker_step_ms"], res["predictor_frame_ms"]
            print(f"{weights} round {r + 1}/{rounds}: talker step {t['before'][-1]:.2f} -> {t['after'][-1]:.2f} ms, "
                  f"predictor frame {f['before'][-1]:.2f} -> {f['after'][-1]:.2f} ms", file=sys.stderr)
        for m in res.values():
            m["median_before"], m["median_after"] = statistics.median(m["before"]), statistics.median(m["after"])
            m["ratio"] = m["median_after"] / m["median_before"]
            m["round_ratios"] = [a / b for a, b in zip(m["after"], m["before"], strict=True)]
        out[weights] = {**res, "setup": setup}
        del talkers, built
    return out


def table(result: dict) -> str:
    lines = ["format  measure              before ms  after ms  after/before  per-round ratios (min..max)"]
    for weights, res in result["formats"].items():
        if "unavailable" in res:
            lines.append(f"{weights:<7} not measured: {res['unavailable']}")
            continue
        for name, m in res.items():
            if name == "setup":
                continue
            lo, hi = min(m["round_ratios"]), max(m["round_ratios"])
            lines.append(f"{weights:<7} {name:<20} {m['median_before']:>9.2f} {m['median_after']:>9.2f} "
                         f"{m['ratio']:>13.3f}  {lo:.3f}..{hi:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-path", required=True, help="the folder holding the BEFORE package")
    ap.add_argument("--before-name", default="leapvox_before", help="the BEFORE package's import name")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--formats", default="w8a8,w4a8")
    ap.add_argument("--json", default=str(Path(__file__).with_name("hot-loop.json")))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.before_path)
    formats = run(args.before_name, args.formats.split(","), args.rounds, args.steps, args.frames)
    result = {"threads": args.threads, "rounds": args.rounds, "steps": args.steps, "frames": args.frames,
              "model": "0.6b random weights", "torch": torch.__version__, "formats": formats}
    print(table(result))
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
