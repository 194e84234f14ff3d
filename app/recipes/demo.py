"""`leapvox recipe demo build-data|wer|train`: build the demo model's training data and measure intelligibility.

Both need the `demo` extra (pip install 'leapvox[demo]') and the Debian package fortunes; the espeak teacher
also the espeak-ng program.
Only argparse here at import time. Data on stdout (JSON), progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.util import find_spec
from pathlib import Path

from leapvox.engine.options import MODES
from leapvox.models.recipes.demo.sizes import SIZES


def add_commands(sub) -> None:
    """Register `demo` (build-data, wer, train) on `leapvox recipe`'s subparsers."""
    d = sub.add_parser("demo", help="build the demo model's data and codec; score intelligibility (WER)",
                       description="Recipes behind the bundled demo model; need pip install 'leapvox[demo]', "
                       "espeak-ng and fortunes.")
    dsub = d.add_subparsers(dest="demo_command", metavar="SUBCOMMAND")
    d.set_defaults(func=lambda args: _usage(d))

    p = dsub.add_parser("build-data", help="fortunes -> teacher speech -> demo codec fit + codes (train/test)")
    p.add_argument("--out", required=True, type=Path, help="output folder (e.g. /work/demo_data)")
    p.add_argument("--teacher", choices=["espeak", "hibari"], default="espeak",
                   help="who speaks the sentences: espeak (the espeak-ng program, IPA phonemes; the bundled model's "
                        "data) or hibari (hibari-tts from pip, voice heart, its G2P's phonemes) (default espeak; "
                        "--extra uses the folder's own teacher)")
    p.add_argument("--test-size", type=int, default=500, help="held-out sentences (default 500)")
    p.add_argument("--variants", type=int, default=3,
                   help="renditions per sentence: the canonical voice + random grid points (espeak: 3 speeds x 3 "
                        "pitches, 1-9; hibari: 5 speeds, 1-5) (default 3)")
    p.add_argument("--fit-sentences", type=int, default=2400, help="train sentences that fit the codec")
    p.add_argument("--limit", type=int, help="keep only this many train sentences (quick trials)")
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra", action="store_true",
                   help="add extra.pt to an already built --out: the sentences a looser filter admits (3-30 words, "
                        "any word), none equal to a train or test sentence, encoded with its codec")
    p.set_defaults(func=cmd_build_data)

    p = dsub.add_parser("wer", help="pocketsphinx WER on the test split: raw teacher, codec resynthesis, models")
    p.add_argument("--data", required=True, type=Path, help="folder written by build-data")
    p.add_argument("-n", type=int, default=300, help="test sentences to score (default 300)")
    p.add_argument("--what", default="teacher,codec",
                   help="comma list of: teacher (the data's teacher, raw), espeak, hibari (that teacher, raw), codec "
                        "(the data's teacher through the data's codec), and predictor (each --model's codes 1..15 "
                        "over the true code 0, talker teacher-forced; with the demo codec also the codec-space error "
                        "after each code) (default teacher,codec)")
    p.add_argument("--model", action="append", default=[],
                   help="also score this model's synthesis (repeatable; sentence i sampled with seed i)")
    p.add_argument("--true-codes", type=int, default=0, metavar="K",
                   help="with --what predictor: keep the true codes 1..K as well, so only codes K+1..15 are the "
                        "predictor's (default 0); shows which residual groups a gap sits in")
    p.add_argument("--mode", action="append", choices=[*MODES, "none"],
                   help="decoding mode(s) for --model (default ar); none: no synthesis, only --what predictor")
    p.add_argument("--window", type=int, help="windowed mode's window (default: the model's)")
    p.add_argument("--weights", help="weight format for --model where supported (e.g. fp32, bf16, int8)")
    p.add_argument("--temperature", type=float, help="sampling temperature for all codes (default: the model's)")
    p.add_argument("--top-k", type=int, help="keep the K most likely codes (default: the model's)")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling, for every code")
    p.add_argument("--out", type=Path, help="also write the report with every hypothesis to this JSON file")
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_wer)

    p = dsub.add_parser("train", help="train (or resume) the demo talker + code predictor on build-data's output")
    p.add_argument("--data", required=True, type=Path, help="folder written by build-data")
    p.add_argument("--out", required=True, type=Path, help="checkpoints + export/ (resumes from out/state.pt)")
    p.add_argument("--steps", type=int, default=20000, help="total optimizer steps (default 20000)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--save-every", type=int, default=500, help="checkpoint + export every N steps")
    p.add_argument("--size", choices=list(SIZES), default="small",
                   help="model size: " + "; ".join(f"{k} = talker {v['hidden']}x{v['layers']}, predictor "
                                                    f"{v['cp_hidden']}x{v['cp_layers']}" for k, v in SIZES.items())
                   + " (default small)")
    p.add_argument("--minutes", type=float,
                   help="wall-time budget: the schedule follows the elapsed share of it and the run stops, saves and "
                        "exports when it is used up (or at --steps, whichever comes first)")
    p.add_argument("--no-extra", action="store_true", help="ignore DATA/extra.pt (build-data --extra)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: CUDA when present, else CPU)")
    p.add_argument("--part", choices=["all", "predictor"], default="all",
                   help="what learns: the whole model (default), or only the code predictor's layers and heads "
                        "(the talker, and the code tables it shares with the predictor, frozen)")
    p.add_argument("--init", type=Path,
                   help="start from this run's state.pt weights, or a model folder such as models/assets/demo "
                        "(its config and tokenizer too; fresh optimizer, step 0)")
    p.add_argument("--predictor-layers", type=int,
                   help="code predictor depth (default: the size's); more than --init's run adds layers that start "
                        "as identities")
    p.add_argument("--talker-layers", type=int,
                   help="talker depth (default: the size's, or --init's); more than --init's run adds layers on top "
                        "that start as identities")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--dropout", type=float, default=0.1, help="residual-branch dropout (default 0.1)")
    p.add_argument("--cp-fraction", type=float,
                   help="share of frames that train the code predictor per batch (default 0.25; 1.0 with "
                        "--part predictor)")
    p.add_argument("--sampled-residuals", type=float, default=0.0, metavar="SHARE",
                   help="share of training utterances whose talker input carries codes 1..15 sampled by the model's "
                        "own code predictor, as at inference, instead of the codec's (default 0)")
    p.add_argument("--predictor-objective", choices=["ce", "distortion"], default="ce",
                   help="how codes 1..15 learn: cross-entropy on the codec's codes (default), or the expected codec "
                        "distortion of the predictor's choice, on its own draws (what the demo model ships with; "
                        "see models/recipes/demo/README.md)")
    p.add_argument("--frontend", choices=["espeak-ng-ipa", "hibari-g2p", "graphemes"],
                   help="text front end of a new model (default: the data's phonemes: espeak-ng-ipa for espeak data, "
                        "hibari-g2p for hibari data); graphemes = the text itself, no front end")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from leapvox.models.recipes.demo.train import train

    if args.init and not (args.init.is_file() or (args.init / "model.safetensors").is_file()):
        print(f"leapvox: no checkpoint at {args.init} (hint: point --init at another run's state.pt or a model "
              "folder)", file=sys.stderr)
        return 2
    for flag, n in (("--predictor-layers", args.predictor_layers), ("--talker-layers", args.talker_layers)):
        if n is not None and n < 1:
            print(f"leapvox: {flag} must be at least 1, got {n}", file=sys.stderr)
            return 2
    if not 0.0 <= args.sampled_residuals <= 1.0:
        print(f"leapvox: --sampled-residuals must be a share in [0, 1], got {args.sampled_residuals}", file=sys.stderr)
        return 2
    cp_fraction = args.cp_fraction if args.cp_fraction is not None else (1.0 if args.part == "predictor" else 0.25)
    out = train(str(args.data), str(args.out), steps=args.steps, batch=args.batch, save_every=args.save_every,
                size=args.size, threads=args.threads, device=args.device, lr=args.lr, dropout=args.dropout,
                cp_fraction=cp_fraction, part=args.part, init=str(args.init) if args.init else None,
                predictor_layers=args.predictor_layers, talker_layers=args.talker_layers, minutes=args.minutes,
                extra=not args.no_extra,
                sampled=args.sampled_residuals, objective=args.predictor_objective, frontend=args.frontend,
                log=lambda m: print(m, file=sys.stderr, flush=True))
    print(out)
    return 0


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_build_data(args) -> int:
    from leapvox.models.recipes.demo.data import build_data, dataset_teacher, max_variants

    teacher = args.teacher
    if args.extra:
        from leapvox.models.recipes.demo.data import build_extra

        if not (args.out / "train.pt").is_file():
            print(f"leapvox: no train.pt in {args.out} (hint: build the data first, without --extra)", file=sys.stderr)
            return 2
        manifest = args.out / "manifest.json"
        teacher = dataset_teacher(json.loads(manifest.read_text()) if manifest.is_file() else None)
    if not 1 <= args.variants <= max_variants(teacher):
        print(f"leapvox: --variants must be 1..{max_variants(teacher)} for the {teacher} teacher", file=sys.stderr)
        return 2
    if teacher == "hibari" and find_spec("hibari") is None:
        print("leapvox: the hibari teacher needs hibari-tts (hint: pip install 'leapvox[demo]')", file=sys.stderr)
        return 2
    if args.extra:
        print(json.dumps(build_extra(args.out, variants=args.variants, workers=args.workers, seed=args.seed,
                                     teacher=teacher), indent=2))
        return 0
    manifest = build_data(args.out, test_size=args.test_size, variants=args.variants,
                          fit_sentences=args.fit_sentences, workers=args.workers, seed=args.seed, limit=args.limit,
                          teacher=teacher)
    print(json.dumps({"out": str(args.out), "split": manifest["split"], "timings": manifest["timings"]}, indent=2))
    return 0


def _load_for_wer(name: str, weights: str | None):
    from leapvox.models.hub import resolve_model_path
    from leapvox.models.load import load_model

    folder = resolve_model_path(name, pull=False)
    return load_model(folder, weights or "fp32")


def _sampling(opts, args):
    """The model's defaults with --greedy / --temperature / --top-k applied to code 0 and codes 1..15."""
    from leapvox.app.common import flag_values
    from leapvox.engine.options import SAMPLED, build_options

    return build_options(flag_values(args, ("greedy", *SAMPLED)), opts)


def cmd_wer(args) -> int:
    from dataclasses import replace

    import torch

    from leapvox.models.files import output_problem, write_text_atomic
    from leapvox.models.recipes.demo import quality
    from leapvox.models.recipes.demo.codec_fit import load_codec

    wanted = [w for w in args.what.split(",") if w]
    if not 0 <= args.true_codes <= 15:
        print(f"leapvox: --true-codes {args.true_codes} is out of range (0..15: codes 1..K stay the true ones)",
              file=sys.stderr)
        return 2
    if args.true_codes and "predictor" not in wanted:
        print("leapvox: --true-codes applies to the predictor diagnostic (hint: add --what predictor)", file=sys.stderr)
        return 2
    if args.out is not None and (problem := output_problem(args.out)):  # before minutes of synthesis
        print(f"leapvox: cannot write {args.out}: {problem}", file=sys.stderr)
        return 2
    modes = args.mode or ["ar"]
    if "none" in modes:
        if len(modes) > 1 or "predictor" not in wanted:
            print("leapvox: --mode none skips the models' synthesis, so it goes alone and with --what predictor "
                  "(hint: --what predictor --mode none)", file=sys.stderr)
            return 2
        modes = []
    torch.set_num_threads(1)
    split = torch.load(args.data / "test.pt")
    teacher = split.get("teacher", "espeak")
    texts = split["text"][: args.n]
    results, report = {}, {"sentences": len(texts), "teacher": teacher}
    for what in wanted:
        if what in ("teacher", "espeak", "hibari"):
            results[what] = quality.score_teacher(texts, teacher if what == "teacher" else what, args.workers)
        elif what == "codec":
            results[what] = quality.score_codec(texts, load_codec(args.data / "speech_tokenizer"), args.workers,
                                                teacher)
        elif what == "predictor":
            continue  # per --model, below
        else:
            print(f"leapvox: unknown --what {what!r} (teacher, espeak, hibari, codec, predictor)", file=sys.stderr)
            return 2
        report[what] = results[what].summary()
    if args.model and modes:
        ref_frames = quality.canonical_frames(split, len(texts))
    for name in args.model:
        loaded = _load_for_wer(name, args.weights)
        synth = loaded.synthesizer()
        if "predictor" in wanted:
            key = f"{name}:predictor" + (f":true1-{args.true_codes}" if args.true_codes else "")
            defaults = _sampling(loaded.defaults, args)
            with torch.inference_mode():
                codes = quality.teacher_forced_codes(loaded, split, len(texts), defaults.predictor, args.true_codes)
                results[key] = quality.score_codes(texts, codes, loaded.codec, args.workers)
            report[key] = results[key].summary()
            distortion = quality.codec_space_error(codes, split, loaded.codec)
            if distortion:
                report[key]["codec_space_error"] = distortion
        for mode in modes:
            key = f"{name}:{mode}" + (f":w{args.window}" if mode == "windowed" and args.window else "")
            opts = _sampling(replace(loaded.defaults, mode=mode, window=args.window or loaded.defaults.window), args)
            results[key], extra = quality.score_model(texts, synth, opts, ref_frames, args.workers)
            report[key] = dict(results[key].summary(), **extra)
    keys = list(results)
    for i, a in enumerate(keys):  # every pair, paired over the same sentences
        for b in keys[i + 1 :]:
            report[f"{b} minus {a}"] = quality.paired_delta(results[a], results[b])
    print(json.dumps(report, indent=2))
    if args.out:
        full = dict(report, hypotheses={k: r.hyps for k, r in results.items()}, references=texts)
        write_text_atomic(args.out, json.dumps(full, indent=1) + "\n")
    return 0
