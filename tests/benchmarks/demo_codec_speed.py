"""The demo codec's decode (mel inversion + Griffin-Lim, `engine/nets/demo_codec.py`) against the same file at
another git revision, interleaved (not a test):

    python3 -m tests.benchmarks.demo_codec_speed --baseline REV [--threads 2] [--rounds 5]
        [--json tests/benchmarks/demo-codec-speed.json]

Both load one codec's weights and decode the same codes: with `--data DIR` (a folder `leapvox recipe demo
build-data` wrote) its own codec and the first utterances of its test.pt, else the bundled demo model's codec
(`models/assets/demo/speech_tokenizer`, or `--codec`) and codes drawn at random. Per round, BASE then TREE or the
other way round: streamed the way `Synthesizer.stream` pushes (1 frame, then doubling to 16), pushes of a fixed 4
frames, and one-shot; ms per 80 ms frame, medians over rounds, the ratio TREE / BASE. Quality beside it: the mean
log-mel distance of each decode from the log-mel the codes stand for (Griffin-Lim's own inconsistency; the same for
both means nothing audible moved). A table and JSON (written atomically).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .codec_speed import ROOT, codec_at

SOURCE = "engine/nets/demo_codec.py"


def pushes(total: int, first: int = 1, most: int = 16) -> list[int]:
    """Synthesizer.stream's chunk sizes: `first`, doubling after each, up to `most`."""
    sizes, size = [], first
    while sum(sizes) < total:
        sizes.append(min(size, total - sum(sizes)))
        size = min(2 * size, most)
    return sizes


def decode(codec, codes: torch.Tensor, how: str) -> torch.Tensor:
    if how == "oneshot":
        return codec(codes)
    sizes = pushes(codes.shape[-1]) if how == "stream" else [4] * -(-codes.shape[-1] // 4)
    s, at, out = codec.stream(), 0, []
    for n in sizes:
        out.append(s.push(codes[..., at : at + n]))
        at += n
    return torch.cat(out, dim=-1)


def logmel_distance(codec, wav: torch.Tensor, codes: torch.Tensor) -> float:
    target = codec.codes_to_logmel(codes)[0]  # [n_mels, 8T]
    got = codec.features(wav.flatten()).reshape(-1, codec.config.n_mels).t()
    return (got - target).abs().mean().item()


def test_codes(data: Path | None, codec, n: int) -> list[torch.Tensor]:
    if data is not None:
        split = torch.load(data / "test.pt", weights_only=False)
        off, codes = split["offsets"], split["codes"].long()
        return [codes[off[i] : off[i + 1]].t()[None] for i in range(n)]
    g = torch.Generator().manual_seed(0)
    return [torch.stack([torch.randint(0, k, (60 + 10 * i,), generator=g) for k in codec.config.codebook_sizes])[None]
            for i in range(n)]


@torch.inference_mode()
def main(argv: list[str] | None = None) -> int:
    from leapvox.engine.nets import demo_codec
    from leapvox.models.catalog import ASSETS
    from leapvox.models.files import write_text_atomic
    from leapvox.models.recipes.demo.codec_fit import load_codec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help=f"git revision whose {SOURCE} is BASE")
    ap.add_argument("--codec", type=Path, default=None, help="a demo codec folder (default: --data's, or the bundled)")
    ap.add_argument("--data", type=Path, default=None, help="a demo data folder: decode its test.pt's codes")
    ap.add_argument("--utterances", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.codec = args.codec or (args.data / "speech_tokenizer" if args.data else ASSETS / "demo" / "speech_tokenizer")
    tree = load_codec(args.codec)
    base_module = codec_at(args.baseline, SOURCE, "demo_codec_base")
    base = base_module.DemoCodec(base_module.DemoCodecConfig.from_dict(tree.config.to_dict())).eval()
    base.load_state_dict(tree.state_dict())
    codecs = {"base": base, "tree": tree}
    utts = test_codes(args.data, tree, args.utterances)
    frames = sum(u.shape[-1] for u in utts)
    kinds = ("stream", "push4", "oneshot")
    times = {(v, k): [] for v in codecs for k in kinds}
    quality = {(v, k): statistics.mean(logmel_distance(tree, decode(c, u, k), u) for u in utts)
               for v, c in codecs.items() for k in kinds}  # also the warm-up
    for r in range(args.rounds):
        for v in (list(codecs) if r % 2 == 0 else list(codecs)[::-1]):
            for k in kinds:
                t0 = time.perf_counter()
                for u in utts:
                    decode(codecs[v], u, k)
                times[(v, k)].append(1e3 * (time.perf_counter() - t0) / frames)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{v} {k} {times[(v, k)][-1]:.2f}" for v in codecs
                                                          for k in kinds), file=sys.stderr)
    med = {f"{v}/{k}": statistics.median(ts) for (v, k), ts in times.items()}
    print(f"{'decode':<8} {'base ms/frame':>13} {'tree ms/frame':>13} {'ratio':>6} {'log-mel dist base':>18} "
          f"{'tree':>7}")
    for k in kinds:
        a, b = med[f"base/{k}"], med[f"tree/{k}"]
        print(f"{k:<8} {a:>13.2f} {b:>13.2f} {b / a:>6.3f} {quality[('base', k)]:>18.4f} {quality[('tree', k)]:>7.4f}")
    if args.json:
        record = {"baseline": args.baseline, "codec": str(args.codec.resolve().relative_to(ROOT))
                  if args.codec.resolve().is_relative_to(ROOT) else str(args.codec),
                  "codes": f"test.pt of {args.data}" if args.data else "random", "utterances": len(utts),
                  "frames": frames, "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
                  "demo_codec_module": demo_codec.__name__, "median_ms_per_frame": med,
                  "ratio_tree_over_base": {k: med[f"tree/{k}"] / med[f"base/{k}"] for k in kinds},
                  "logmel_distance": {f"{v}/{k}": q for (v, k), q in quality.items()},
                  "rounds_ms_per_frame": {f"{v}/{k}": ts for (v, k), ts in times.items()}}
        write_text_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
