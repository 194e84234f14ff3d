"""`leapvox recipe window` (adapt a model to windowed mode: models/recipes/window.py) and `leapvox recipe
bench-window`: per-step talker latency and KV bytes vs frames generated, ar vs windowed.

The benchmark runs on a random-weight talker of the 0.6B architecture (the decoder stack and code-0 head; no text
embedding, no code predictor worth the name) fed random embeddings, so it needs no checkpoint. A step's cost depends
only on how many keys it attends to, not on their values, so each sample point is timed by placing one step at that
frame (ar: slot and position L+n over L+n+1 keys; windowed: ring slot, position L+n over L+W keys) rather than by
generating every frame before it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from leapvox.models.recipes import geometry

TALKER_0_6B = {  # the 0.6B talker's layers (models/recipes/geometry.py) with stub embeddings and code predictor
    **geometry.TALKER_0_6B,
    "text_vocab_size": 1, "text_hidden_size": 8,  # unused: the benchmark feeds embeddings
    "code_predictor_config": {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                              "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 8},
}


def add_commands(sub) -> None:
    t = sub.add_parser(
        "window",
        help="adapt a model to windowed mode: distil the full-attention model into a windowed student",
        description="Fine-tune a copy of the model under windowed mode's attention mask (global prompt, last W "
        "frames), annealing the window from --start-window down to --window on a cosine schedule with a "
        "soft-to-hard mask, with skewed-KL distillation from the full-attention model plus cross-entropy on the "
        "ground truth. Writes an adapted checkpoint folder; windowed mode then defaults to its window.",
    )
    t.add_argument("--model", required=True, help="checkpoint folder or catalog name of the full-attention model")
    t.add_argument("--data", required=True, type=Path, help="training data (a leapvox recipe demo build-data folder)")
    t.add_argument("--out", required=True, type=Path, help="where to write the adapted checkpoint folder")
    t.add_argument("--window", type=int, default=48, help="target window W in frames (default 48)")
    t.add_argument("--start-window", type=int, default=128, help="window at the start of the anneal (default 128)")
    t.add_argument("--steps", type=int, default=400, help="optimizer steps (default 400)")
    t.add_argument("--batch", type=int, default=8, help="utterances per step (default 8)")
    t.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (default 2e-4)")
    t.add_argument("--alpha", type=float, default=0.1, help="skew of the KL: KL(p || a p + (1-a) q) (default 0.1)")
    t.add_argument("--ce-weight", type=float, default=0.5, help="weight of the ground-truth cross-entropy (0.5)")
    t.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    t.set_defaults(func=cmd_train_window)

    b = sub.add_parser("bench-window", help="benchmark windowed vs ar talker steps: latency and KV bytes vs length")
    b.add_argument("--frames", type=int, default=3000, help="longest utterance to sample, in frames (default 3000)")
    b.add_argument("--every", type=int, default=100, help="sample every N frames (default 100)")
    b.add_argument("--window", type=int, default=48, help="windowed mode's window, in frames (default 48)")
    b.add_argument("--prompt", type=int, default=64, help="prompt rows L (default 64, a two-sentence prompt)")
    b.add_argument("--repeats", type=int, default=5, help="timed steps per sample point; the median is kept")
    b.add_argument("--json", type=Path, default=Path("bench-window.json"), help="where to write the raw numbers")
    b.set_defaults(func=cmd_bench_window)


def random_talker(spec: dict | None = None):
    """A random-weight Talker of the given architecture (default: the 0.6B talker), eval mode, fp32."""
    import torch

    from leapvox.engine.config import TalkerConfig
    from leapvox.engine.nets.talker import Talker

    torch.manual_seed(0)
    return Talker(TalkerConfig.from_dict(spec or TALKER_0_6B)).eval()


def _median_ms(step, x, n: int, repeats: int) -> float:
    step(x, n)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(x, n)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def bench_window(talker, frames: int, every: int, window: int, prompt: int, repeats: int = 5) -> dict:
    """Median talker step ms and KV bytes in use at frames every, 2*every, .. frames, for windowed and ar."""
    import torch

    from leapvox.engine.caches import FullCache, RingCache

    points = list(range(every, frames + 1, every))
    g = torch.Generator().manual_seed(0)
    h = talker.cfg.hidden_size
    x_prompt, x = torch.randn(1, prompt, h, generator=g), torch.randn(1, 1, h, generator=g)
    out = {"frames": points, "window": window, "prompt": prompt, "threads": torch.get_num_threads(), "modes": {}}
    with torch.inference_mode():
        for mode in ("windowed", "ar"):  # windowed first: its cache is allocated at L+W, not reused from ar's
            cache = RingCache(talker, prompt, window) if mode == "windowed" else FullCache(talker, prompt, frames)
            cache.prefill(x_prompt)
            model = talker.model
            out["modes"][mode] = {
                "step_ms": [_median_ms(cache.step, x, n - 1, repeats) for n in points],  # the step after frame n
                "kv_bytes": [cache.kv_bytes(n - 1) for n in points],
                "attn_span": [cache.span(n - 1) for n in points],
                "allocated_bytes": model.kv_bytes(model.cache_len),
            }
    return out


def table(out: dict) -> str:
    w, a = out["modes"]["windowed"], out["modes"]["ar"]
    heads = ("ar ms", 8), ("win ms", 8), ("ar KV MiB", 10), ("win KV MiB", 10), ("ar keys", 8), ("win keys", 8)
    lines = [f"{'frames':>6} " + " ".join(f"{h:>{n}}" for h, n in heads)]
    for i, n in enumerate(out["frames"]):
        lines.append(f"{n:6d} {a['step_ms'][i]:8.1f} {w['step_ms'][i]:8.1f} {a['kv_bytes'][i] / 2**20:10.1f} "
                     f"{w['kv_bytes'][i] / 2**20:10.1f} {a['attn_span'][i]:8d} {w['attn_span'][i]:8d}")
    return "\n".join(lines)


def plot(out: dict, path: Path) -> bool:
    """Step latency and KV MiB vs frames; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))
    for mode, rec in out["modes"].items():
        a.plot(out["frames"], rec["step_ms"], label=mode)
        b.plot(out["frames"], [v / 2**20 for v in rec["kv_bytes"]], label=mode)
    a.set_title("talker step (ms)")
    b.set_title("KV cache in use (MiB)")
    for ax in (a, b):
        ax.set_xlabel("frames generated")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def cmd_bench_window(args) -> int:
    from leapvox.app.common import UsageError
    from leapvox.models.files import write_text_atomic

    if min(args.frames, args.every, args.window, args.prompt, args.repeats) < 1:
        raise UsageError("--frames, --every, --window, --prompt and --repeats must all be >= 1")
    print(f"random-weight 0.6B talker, prompt {args.prompt} rows, window {args.window}", file=sys.stderr, flush=True)
    out = bench_window(random_talker(), args.frames, args.every, args.window, args.prompt, args.repeats)
    print(table(out))
    write_text_atomic(args.json, json.dumps(out, indent=1))
    png = args.json.with_suffix(".png")
    print(f"wrote {args.json}" + (f" and {png}" if plot(out, png) else ""), file=sys.stderr, flush=True)
    return 0


def cmd_train_window(args) -> int:
    import torch

    from leapvox.app.common import UsageError
    from leapvox.models.hub import resolve_model_path
    from leapvox.models.recipes.window import WindowSchedule, train_window

    if args.window < 1 or args.steps < 1 or args.batch < 1 or args.start_window < args.window:
        raise UsageError("need --window >= 1, --steps >= 1, --batch >= 1 and --start-window >= --window")
    if not 0 <= args.alpha < 1:
        raise UsageError("--alpha must be in [0, 1)")
    if args.threads:
        torch.set_num_threads(args.threads)
    report = train_window(
        str(resolve_model_path(args.model)), str(args.data), str(args.out), args.window, steps=args.steps,
        batch=args.batch, lr=args.lr, alpha=args.alpha, ce_weight=args.ce_weight,
        schedule=WindowSchedule(args.window, args.start_window),
        log=lambda m: print(f"leapvox: {m}", file=sys.stderr, flush=True),
    )
    ce = report["heldout_ce"]
    print(f"adapted checkpoint: {args.out}")
    print(f"held-out CE code 0 / codes 1-15, window {args.window}: unadapted {ce['teacher_window']['code0']:.3f} / "
          f"{ce['teacher_window']['codes1_15']:.3f}, adapted {ce['student_window']['code0']:.3f} / "
          f"{ce['student_window']['codes1_15']:.3f}; full-attention teacher {ce['teacher_full']['code0']:.3f} / "
          f"{ce['teacher_full']['codes1_15']:.3f}")
    return 0
