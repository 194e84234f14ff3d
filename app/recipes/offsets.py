"""`leapvox recipe offsets|tree|bench-spec`: spec mode's draft offsets and draft tree, and its benchmark."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

# A small built-in corpus for models without an audio encoder: codes come from the model's own generations.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A journey of a thousand miles begins with a single step.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "It was the best of times, it was the worst of times.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "The rain in Spain stays mainly in the plain.",
    "We choose to go to the moon in this decade and do the other things.",
    "Every morning the baker opens his shop before the sun rises.",
    "Turn left at the second light and the library will be on your right.",
    "Music gives a soul to the universe, wings to the mind, and flight to the imagination.",
    "Could you tell me the way to the train station, please?",
    "The committee will announce its decision at the end of the month.",
    "Bright stars filled the sky above the quiet mountain village.",
    "He opened the window and let the cool evening air into the room.",
    "Reading a good book is like having a conversation with the author.",
    "The new bridge will connect the two halves of the city by next summer.",
    "Thank you for your patience while we look into the problem.",
    "Children were playing in the park while their parents watched from the benches.",
    "After the storm, the fishermen repaired their nets on the beach.",
]


VARIANTS = ("ce", "ce-pp", "kl", "kl-pp", "tv", "tv-pp")


def add_commands(sub) -> None:
    from leapvox.app.common import model_args

    t = sub.add_parser("offsets", help="train spec mode's draft offsets for a model (frozen model)")
    model_args(t)
    t.add_argument("--texts", type=Path, help="text file, one sentence per line (default: a built-in set)")
    t.add_argument("--utterances", type=int, default=20, help="how many sentences to generate frames from")
    t.add_argument("--data", type=Path, help="use ground-truth codes from a `leapvox recipe demo build-data` folder "
                   "(train split) instead of the model's own generations")
    t.add_argument("--held-out", type=int, help="with --data: test-split utterances to measure on "
                   "(default utterances / 4)")
    t.add_argument("--self-sampled", action="store_true", help="re-draw the training frames' codes 1..15 with the "
                   "predictor itself, so the offsets learn on the prefixes spec mode meets at inference")
    t.add_argument("--variants", default=",".join(VARIANTS), help="comma list of objectives to train: ce, kl, tv, "
                   "each optionally with -pp (per-position offsets); default all")
    t.add_argument("--steps", type=int, default=400, help="Adam steps per variant (default 400)")
    t.add_argument("--depth", type=int, default=3,
                   help="draft depth K: offsets for codes k+1..k+K (default 3, the paper's); spec mode's default tree "
                        "then drafts this deep")
    t.add_argument("--json", type=Path, help="also write the per-variant acceptance table here")
    t.set_defaults(func=cmd_train_offsets)

    c = sub.add_parser("tree", help="measure acceptance and choose spec mode's draft tree for this CPU")
    model_args(c)
    c.add_argument("--texts", type=Path, help="text file, one sentence per line (default: a built-in set)")
    c.add_argument("--utterances", type=int, default=10)
    c.add_argument("--data", type=Path, help="ground-truth codes from a build-data folder (test split)")
    c.add_argument("--json", type=Path, help="also write the measurements here")
    from leapvox.app.common import backend_args

    backend_args(c, default="cpu", help="where the verify call's cost is timed: cpu = torch here (default); "
                     "ane = this Mac's Core ML, exporting the verify function at each N (one conversion per N, "
                     "minutes each); auto = ane where Core ML runs. Trees are stored per model, backend and device")
    c.set_defaults(func=cmd_calibrate_tree)

    b = sub.add_parser("bench-spec", help="benchmark spec vs ar decoding of the code predictor (table + JSON)")
    model_args(b)
    b.add_argument("--texts", type=Path)
    b.add_argument("--utterances", type=int, default=8)
    b.add_argument("--data", type=Path, help="ground-truth codes from a build-data folder (test split)")
    b.add_argument("--json", type=Path, default=Path("bench-spec.json"), help="where to write the raw numbers")
    b.add_argument("--cost-only", choices=["qwen3-tts-0.6b"], help="no model: time the verify call of a random-weight "
                   "code predictor of this architecture (the cost side only)")
    b.set_defaults(func=cmd_bench_spec)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(args):
    from leapvox.app.common import require_model
    from leapvox.models.hub import resolve_model_path
    from leapvox.models.load import load_model

    folder = resolve_model_path(require_model(args), pull=False)
    return folder, load_model(folder, weights=args.weights)


def _texts(args) -> list[str]:
    lines = SENTENCES if args.texts is None else [ln.strip() for ln in args.texts.read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    return (lines * (1 + args.utterances // max(1, len(lines))))[: args.utterances]


def _frames(model, args):
    from leapvox.models.recipes.spec import collect_frames

    if getattr(args, "data", None):
        return _data_frames(model, args.data / "test.pt", args.utterances)


    def progress(i, n, frames):
        if sys.stderr.isatty():
            print(f"\rgenerating frames: {i}/{n} utterances, {frames} frames", end="", file=sys.stderr, flush=True)

    frames = collect_frames(model.synthesizer(), _texts(args), replace(model.defaults, seed=0), progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return frames


def _data_frames(model, path: Path, utterances: int):
    """Teacher-forced frames over ground-truth codes of encoded speech (the paper's recipe)."""
    import torch

    from leapvox.models.recipes.spec import Frames, teacher_forced_frames

    d = torch.load(path, weights_only=False)
    synth, parts = model.synthesizer(), []
    for u in range(min(utterances, len(d["sentence"]))):
        codes = d["codes"][d["offsets"][u] : d["offsets"][u + 1]].long()
        parts.append(teacher_forced_frames(synth, d["text"][int(d["sentence"][u])], codes, model.defaults))
    return Frames(*(torch.cat([getattr(p, f) for p in parts]) for f in ("hidden", "code0_embed", "codes")))


def cmd_train_offsets(args) -> int:
    import numpy as np

    from leapvox.engine.spec import DraftPlan, default_tree
    from leapvox.models.recipes.spec import acceptance_rate, run_spec, self_sampled, train_offsets
    from leapvox.models.recipes.stats import paired_ratio_delta, ratio_ci
    from leapvox.models.spec_assets import offsets_path, save_offsets

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not names or any(v not in VARIANTS for v in names):
        _say(f"leapvox: error: --variants takes a comma list of {', '.join(VARIANTS)}")
        return 2
    if not 1 <= args.depth <= 14:
        _say(f"leapvox: error: --depth {args.depth} is outside 1..14 (hint: 3 is the paper's K)")
        return 2
    tree = default_tree(args.depth)
    folder, model = _load(args)
    cp = model.tts.talker.code_predictor
    params = model.defaults.predictor
    if args.data:  # ground truth: fit on the train split, measure on the held-out test split
        train = _data_frames(model, args.data / "train.pt", args.utterances)
        held = _data_frames(model, args.data / "test.pt", args.held_out or max(1, args.utterances // 4))
    else:
        train, held = _frames(model, args).split(0.8)
    if args.self_sampled:
        train = self_sampled(cp, train, params, seed=1)
    # The exact acceptance rate is measured on held-out prefixes drawn by the predictor, as at inference.
    held_prefixes = self_sampled(cp, held, params, seed=2)
    _say(f"{len(train.codes)} training frames{' (codes 1..15 self-sampled)' if args.self_sampled else ''}, "
         f"{len(held.codes)} held-out frames")
    variants = {"zero": None}
    for name in names:
        kind, per_position = name.split("-")[0], name.endswith("-pp")
        t0 = time.perf_counter()
        variants[name] = train_offsets(cp, train, depth=args.depth, kind=kind, per_position=per_position,
                                       steps=args.steps, params=params)
        _say(f"trained {name} in {time.perf_counter() - t0:.0f} s")
    rows, runs, alphas = {}, {}, {}
    for name, b in variants.items():
        runs[name] = run_spec(cp, held, DraftPlan(tree, b), params)
        alphas[name] = acceptance_rate(cp, held_prefixes, b, args.depth, params)  # [N, K]
        r, a = runs[name], alphas[name]
        rows[name] = {"tokens_per_call": round(r.tokens_per_call, 4),
                      "acceptance_per_depth": [round(v, 4) for v in r.per_depth],
                      "exact_draft_acceptance_per_depth": [round(float(v), 4) for v in a.mean(0)]}
        if name != "zero":
            z = runs["zero"]
            rows[name]["vs_zero_tokens_per_call"] = paired_ratio_delta(z.tokens, z.calls, r.tokens, r.calls)
            d = (a - alphas["zero"]).mean(1).numpy()  # per frame (mean over depths): already paired
            lo, hi = ratio_ci(d, np.ones_like(d))
            rows[name]["vs_zero_exact_acceptance"] = {"delta": round(float(d.mean()), 4),
                                                      "ci95": [round(lo, 4), round(hi, 4)]}
    print(f"{'offsets':<10} {'tok/call':>8} {'vs zero (95% CI)':>26}  {'exact draft acceptance per depth':>32}"
          f"  {'vs zero (95% CI)':>24}")
    for name, r in rows.items():
        tc, ea = r.get("vs_zero_tokens_per_call"), r.get("vs_zero_exact_acceptance")
        cmp_t = f"{tc['delta']:+.3f} ({tc['ci95'][0]:+.3f} .. {tc['ci95'][1]:+.3f})" if tc else ""
        cmp_a = f"{ea['delta']:+.4f} ({ea['ci95'][0]:+.4f} .. {ea['ci95'][1]:+.4f})" if ea else ""
        acc = " / ".join(f"{v:.3f}" for v in r["exact_draft_acceptance_per_depth"])
        print(f"{name:<10} {r['tokens_per_call']:8.3f} {cmp_t:>26}  {acc:>32}  {cmp_a:>24}")
    # Keep the best variant only when its tokens-per-call gain over zero offsets is clear of sampling noise.
    winners = [n for n in rows if n != "zero" and rows[n]["vs_zero_tokens_per_call"]["ci95"][0] > 0]
    best = max(winners, key=lambda n: rows[n]["tokens_per_call"], default=None)
    if best:
        path = save_offsets(offsets_path(folder), variants[best], {"variant": best, "depth": args.depth, **rows[best]})
        _say(f"kept {best}: {path}")
    else:
        _say("no trained variant beat zero offsets on the held-out frames beyond noise (paired 95% CI); nothing saved")
    if args.json:
        out = {"held_out_frames": len(held.codes), "training_frames": len(train.codes), "depth": args.depth,
               "self_sampled": args.self_sampled, "variants": rows, "kept": best}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def cmd_calibrate_tree(args) -> int:
    from leapvox.models.recipes.spec import expected_tokens_per_call, grow_tree, rank_acceptance, verify_over_ar
    from leapvox.models.spec_assets import load_offsets, save_tree, tree_path

    from .coreml import calibration_backend

    backend, device = calibration_backend(args)  # --backend ane off macOS: exit 2 here
    if backend == "ane":
        args.weights = "fp32"  # the Core ML export converts fp32 weights
    folder, model = _load(args)
    cp = model.tts.talker.code_predictor
    offsets, _ = load_offsets(folder, cp.cfg.hidden_size)
    frames = _frames(model, args)
    depth = 3 if offsets is None else offsets.shape[-2]
    acc = rank_acceptance(cp, frames, offsets, depth, ranks=16)
    results = []
    trees = [grow_tree(acc, n) for n in (4, 8, 16, 32, 64)]
    ane = None
    if backend == "ane":  # the exported verify function at each N, timed by Core ML on this Mac
        from leapvox.models.recipes.coreml_export import profile_verify

        ane = profile_verify(model.tts.talker, trees, offsets, args.compute_units, say=_say)
    for tree in trees:
        ratio = ane[tree.size]["verify_over_ar"] if ane else verify_over_ar(cp, tree.size)
        tokens = expected_tokens_per_call(tree, acc, cp.num_heads)
        results.append({"N": tree.size, "expected_tokens_per_call": tokens, "speedup_estimate": tokens / ratio,
                         "verify_over_ar_cost": ratio, "paths": tree.paths()[1:]})
    print(f"{'N':>3} {'E[tok/call]':>11} {'verify/ar':>9} {'est. speedup':>12}")
    for r in results:
        print(f"{r['N']:3d} {r['expected_tokens_per_call']:11.3f} {r['verify_over_ar_cost']:9.2f} "
              f"{r['speedup_estimate']:12.3f}")
    best = max(results, key=lambda r: r["speedup_estimate"])
    from leapvox.engine.spec import DraftTree

    path = save_tree(tree_path(folder, backend, device), DraftTree.from_paths(tuple(p) for p in best["paths"]),
                     {"N": best["N"], "rank_acceptance": acc, "measured": results, "backend": backend,
                      "device": device, **({"compute_units": args.compute_units} if ane else {})})
    _say(f"chose N={best['N']}: {path}")
    if ane:
        _say(f"the ane backend runs the tree of its export: leapvox recipe coreml --model {args.model} (re-export)")
    if args.json:
        args.json.write_text(json.dumps({"rank_acceptance": acc, "trees": results}, indent=1))
    return 0


def bench_verify_cost(threads: int | None = None) -> dict:
    """Median seconds of a verify call over N draft nodes vs an ar step, random 0.6B-size code predictor."""
    import torch

    from leapvox.engine.config import CodePredictorConfig
    from leapvox.engine.nets.code_predictor import CodePredictor
    from leapvox.models.recipes.geometry import PREDICTOR_0_6B, TALKER_0_6B
    from leapvox.models.recipes.spec import verify_cost, verify_over_ar

    torch.manual_seed(0)
    cp = CodePredictor(CodePredictorConfig(**PREDICTOR_0_6B), talker_hidden=TALKER_0_6B["hidden_size"]).eval()
    ns = (4, 8, 16, 32, 64)
    return {"threads": torch.get_num_threads(), "ar_call_s": verify_cost(cp, 0),
            "verify_s": {n: verify_cost(cp, n) for n in ns}, "verify_over_ar": {n: verify_over_ar(cp, n) for n in ns}}


def cmd_bench_spec(args) -> int:
    if args.cost_only:
        out = bench_verify_cost()
        print(f"ar call: {out['ar_call_s'] * 1000:.2f} ms ({out['threads']} threads)")
        print(f"{'N':>3} {'verify ms':>9} {'verify/ar':>9}")
        for n, t in out["verify_s"].items():
            print(f"{n:3d} {t * 1000:9.2f} {out['verify_over_ar'][n]:9.2f}")
        args.json.write_text(json.dumps(out, indent=1))
        _say(f"wrote {args.json}")
        return 0
    from leapvox.engine.spec import DraftPlan
    from leapvox.models.recipes.spec import measure_ar, measure_spec, verify_over_ar
    from leapvox.models.spec_assets import load_offsets, load_tree

    folder, model = _load(args)
    cp = model.tts.talker.code_predictor
    offsets, opath = load_offsets(folder, cp.cfg.hidden_size)
    tree, tpath = load_tree(folder, offsets=offsets)
    frames = _frames(model, args)
    out = {"model": str(folder), "frames": len(frames.codes), "offsets": str(opath), "tree": str(tpath), "rows": []}
    for name, b in (("zero offsets", None), ("trained offsets", offsets)):
        if name == "trained offsets" and b is None:
            continue
        for params in (model.defaults.predictor, replace(model.defaults.predictor, do_sample=False)):
            plan = DraftPlan(tree, b)
            t_ar = measure_ar(cp, frames, params)
            tpc, per_depth, t_spec = measure_spec(cp, frames, plan, params)
            out["rows"].append({"offsets": name, "sampling": params.do_sample, "tokens_per_call": tpc,
                                "acceptance_per_depth": per_depth, "ar_s": t_ar, "spec_s": t_spec,
                                "inner_loop_speedup": t_ar / t_spec})
    out["verify_over_ar_cost"] = {n: verify_over_ar(cp, n) for n in (4, 8, 16, 32, 64)}
    print(f"{'offsets':<16} {'sampling':>8} {'tok/call':>8} {'ar s':>7} {'spec s':>7} {'speedup':>7}  acceptance/depth")
    for r in out["rows"]:
        print(f"{r['offsets']:<16} {str(r['sampling']):>8} {r['tokens_per_call']:8.3f} {r['ar_s']:7.2f} "
              f"{r['spec_s']:7.2f} {r['inner_loop_speedup']:7.2f}  "
              + " ".join(f"{a:.2f}" for a in r["acceptance_per_depth"]))
    print("verify/ar cost ratio by N: " + ", ".join(f"{n}: {v:.2f}" for n, v in out["verify_over_ar_cost"].items()))
    args.json.write_text(json.dumps(out, indent=1))
    _say(f"wrote {args.json}")
    return 0
