"""`leapvox tune MODEL`: measure spec mode and the weight formats for one model on this machine and write the profile
that `--mode auto` and `--weights auto` follow (models/profile.py; the stages: models/recipes/tune.py; what is
decided and why: models/tune.py). Messages and progress on stderr; the report (or --json, the profile) on stdout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from leapvox.app.common import EXIT_OK, UsageError, interruption, say, stop_status, tell

STAGE_UNITS = {"frames": "sentences", "offsets": "steps", "tree": "trees", "formats": "formats"}


def add_commands(sub) -> None:
    from leapvox.models.tune import DEFAULT_UTTERANCES

    p = sub.add_parser(
        "tune", help="measure spec mode and the weight formats for a model on this machine (for --mode/--weights auto)",
        description="Measures, on this machine, what makes MODEL fastest without moving its codes beyond a measured "
        "threshold: the model speaks a set of sentences (its own sampled ar decoding), draft offsets are trained and "
        "kept only where they beat zero offsets on held-out sentences, the draft tree is timed here, and each weight "
        "format that runs here is compared with fp32 (code agreement, KL) and timed. The result is one profile per "
        "model and machine in leapvox's data folder (leapvox paths); --mode auto and --weights auto follow it. "
        "Minutes on a laptop (it says how many before it starts); Ctrl-C stops it and a rerun continues.",
        epilog="The profile is stale, and no longer followed, after a change of the model's weights, of leapvox or "
        "torch, or of CPU; rerun tune then.")
    p.add_argument("model", metavar="MODEL", help="catalog name (leapvox models list), Hub repo org/name[@revision] or "
                   "checkpoint folder; a Hub model must be downloaded first (leapvox models pull)")
    p.add_argument("--texts", type=Path, metavar="FILE", help="UTF-8 text file, one sentence per line, to speak "
                   "instead of the built-in set (a few sentences per language the model speaks)")
    p.add_argument("--utterances", type=int, default=DEFAULT_UTTERANCES, metavar="N",
                   help=f"sentences to speak, a quarter of them held out for measuring (default {DEFAULT_UTTERANCES}); "
                   "more gives tighter measurements and takes longer")
    p.add_argument("--threads", type=int, metavar="N", help="torch threads (default: torch's, usually the cores); "
                   "the profile's speeds hold for this count")
    p.add_argument("--force", action="store_true", help="tune again even if a finished, current profile exists")
    p.add_argument("--background", action="store_true", help="run in a detached, low-priority process that writes a "
                   "log beside the profile; returns at once (see --status)")
    p.add_argument("--status", action="store_true", help="say where a tune of MODEL stands (running, stopped part-way, "
                   "finished, stale) and print its log's last line")
    p.add_argument("--json", action="store_true", help="print the profile as JSON instead of the report")
    p.set_defaults(func=cmd_tune)


# ---- checks before any slow work ------------------------------------------------------------------------------


def _check_args(args) -> None:
    if not 2 <= args.utterances <= 2000:
        raise UsageError(f"--utterances {args.utterances} is outside 2..2000",
                         hint="2 is the least (one to train on, one held out); the default is 16")
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise UsageError(f"--threads {args.threads} must be at least 1", hint="leave it out for torch's default")
    if args.background and args.status:
        raise UsageError("--background and --status do not go together", hint="start with --background, then --status")


def read_lines(path: Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file, or a usage error that says what is wrong with it."""
    try:
        raw = path.expanduser().read_bytes()
    except IsADirectoryError:
        raise UsageError(f"--texts {path} is a folder", hint="give a text file, one sentence per line") from None
    except OSError as e:
        raise UsageError(f"cannot read --texts {path}: {e.strerror or e}", hint="check the path") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"--texts {path} is not UTF-8 text (byte {e.start})", hint="save it as UTF-8") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "\x00" not in ln]
    if not lines:
        raise UsageError(f"--texts {path} has no sentences", hint="one sentence per line")
    return lines


def _check_writable(folder: Path) -> None:
    """The profile's folder can be made and written, or a one-line error naming it."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as e:
        raise UsageError(f"cannot write leapvox's data folder {folder}: {e.strerror or e}",
                         hint="set LEAPVOX_HOME to a writable folder") from None


# ---- the command --------------------------------------------------------------------------------------------------


def cmd_tune(args) -> int:
    _check_args(args)
    lines = read_lines(args.texts) if args.texts else None
    from leapvox.models.load import open_model
    from leapvox.models.profile import profile_path, work_dir
    from leapvox.models.recipes.tune import Settings, check_model, running_pid

    opened = open_model(args.model)  # a missing or damaged model: a one-line error with a hint
    check_model(opened.config)
    folder, path = opened.path, profile_path(opened.path)
    if args.status:
        return print_status(args.model, folder)
    _check_writable(path.parent)
    if pid := running_pid(work_dir(folder)):
        raise UsageError(f"a tune of {args.model} is already running (process {pid})",
                         hint=f"leapvox tune {args.model} --status")
    if args.background:
        return start_background(args, path)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = Settings(utterances=args.utterances, lines=lines)
    from leapvox.engine.fast.fused import prepare_fp32_layers

    prepare_fp32_layers(opened.config.talker.hidden_size)  # every format timed as a later speak would run it
    return run_tune(args, opened, settings)


def run_tune(args, opened, settings) -> int:
    from leapvox.models import tune as T
    from leapvox.models.recipes.tune import Tune, model_bytes

    bars = Bars()
    t = Tune(opened.path, settings, say=tell, progress=bars.update)
    state, why = t.state()
    if state == "finished" and not args.force:
        t.begin()
        tell(f"{args.model} is tuned already on this machine ({t.profile.created}; --force tunes again)")
        print(t.profile.to_json() if args.json else report(t.profile, t.path))
        return EXIT_OK
    if state == "restart":
        tell(f"tuning {args.model} afresh: {why}")
    t.begin(force=args.force)
    pid_file = t.work / "pid"
    t.work.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))
    try:
        todo = t.todo()
        if state == "resume":
            tell(f"continuing the tune of {args.model}: {', '.join(t.profile.stages_done) or 'nothing'} done")
        if "frames" in todo:
            tell("timing one frame here to estimate how long this takes")
        frame_s = t.probe() if "frames" in todo else t.profile.frames.get("seconds_per_frame")
        texts = t.sentences(opened.config)
        frames = sum(T.expected_frames(text, settings.max_frames) for text, _ in texts)
        est = T.estimate(model_bytes(opened.path), frames, len(T.formats_here(settings.formats)), frame_s,
                         stages=tuple(todo))
        parts = ", ".join(f"{s} {_minutes(v)}" for s, v in est.per_stage.items() if v >= 1)
        tell(f"tuning {args.model} here: about {_minutes(est.seconds)} ({parts}; {frame_s * 1000:.0f} ms a frame "
             f"measured); Ctrl-C stops it and a rerun continues")
        bars.expected = est.per_stage
        t.run()
    except (KeyboardInterrupt, RuntimeError) as e:
        if (stop := interruption(e)) is None:
            raise
        bars.close()
        done = ", ".join(t.profile.stages_done) or "no stage"
        word, status = stop_status(stop)
        tell(f"{word}; kept {done} finished and the current stage's finished parts in {t.work}; "
             f"continue with: leapvox tune {args.model}")
        return status
    finally:
        bars.close()
        pid_file.unlink(missing_ok=True)
    tell(f"profile written: {t.path}")
    print(t.profile.to_json() if args.json else report(t.profile, t.path))
    return EXIT_OK


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class Bars:
    """One progress bar per stage on stderr (tqdm, with its ETA) on a terminal; elsewhere (a log) a line at most
    every 20 s and at the end of each stage."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.stage, self.bar, self.last, self.start = None, None, 0.0, 0.0
        self.expected: dict[str, float] = {}

    def update(self, stage: str, done: float, total: float) -> None:
        if stage != self.stage:
            self.close()
            self.stage, self.start, self.last = stage, time.monotonic(), 0.0
            if self.tty:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=stage, unit=STAGE_UNITS.get(stage, "it"), file=sys.stderr,
                                leave=True, dynamic_ncols=True)
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            self.bar.refresh()
            return
        now = time.monotonic()
        if (done >= total and self.last != -1) or (done < total and now - self.last >= 20):
            self.last = -1 if done >= total else now
            elapsed = now - self.start
            eta = elapsed / done * (total - done) if done else self.expected.get(stage, 0.0)
            say(f"leapvox: {stage}: {done:g}/{total:g} {STAGE_UNITS.get(stage, '')}, {elapsed:.0f} s, "
                f"about {_minutes(eta)} left")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.stage = None, None


# ---- background and status ------------------------------------------------------------------------------------


def log_path(profile: Path) -> Path:
    return profile.with_suffix(".log")


def start_background(args, profile: Path) -> int:
    """This command again without --background, detached (its own session, stdin closed, niceness +10), appending to
    the log beside the profile."""
    argv = [sys.executable, "-m", "leapvox.app.cli", "tune", args.model, "--utterances", str(args.utterances)]
    argv += ["--texts", str(args.texts.expanduser().resolve())] if args.texts else []
    argv += ["--threads", str(args.threads)] if args.threads else []
    argv += ["--force"] if args.force else []
    log = log_path(profile)
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} leapvox tune {args.model}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                preexec_fn=_lower_priority if hasattr(os, "nice") else None)
    tell(f"tuning {args.model} in the background (process {proc.pid}, low priority); log: {log}")
    tell(f"see where it stands: leapvox tune {args.model} --status")
    return EXIT_OK


def _lower_priority() -> None:
    os.nice(10)


def print_status(name: str, folder: Path) -> int:
    """Where a tune of the model stands, on stdout; exit 0 (1 when no profile exists and none is running)."""
    from leapvox.models.profile import Profile, profile_path, stale_reason, work_dir
    from leapvox.models.recipes.tune import running_pid

    path = profile_path(folder)
    pid = running_pid(work_dir(folder))
    print(f"profile: {path}")
    if pid:
        print(f"running: process {pid}")
    try:
        profile = Profile.from_json(path.read_text()) if path.is_file() else None
    except (OSError, ValueError, TypeError, KeyError) as e:
        print(f"unreadable ({e}); leapvox tune {name} --force makes it again")
        profile = None
    if profile is None and not path.is_file():
        print("not tuned on this machine" + ("" if pid else f" (leapvox tune {name})"))
    elif profile is not None:
        stale, d = stale_reason(profile, folder), profile.decision
        if stale:
            print(f"stale, not followed: {stale} (leapvox tune {name} makes it again)")
        elif d is not None:
            print(f"finished {profile.created}: --mode auto = {d.mode}, --weights auto = {d.weights} ({d.why})")
        else:
            done = ", ".join(profile.stages_done) or "nothing"
            print(f"{'in progress' if pid else 'stopped part-way'}: {done} done"
                  + ("" if pid else f" (leapvox tune {name} continues)"))
    log = log_path(path)
    if log.is_file():
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        print(f"log: {log}" + (f"\n  {tail[0].strip()}" if tail else ""))
    return EXIT_OK if (pid or path.is_file()) else 1


# ---- the report ---------------------------------------------------------------------------------------------------


def report(p, path: Path) -> str:
    """What the tune measured and chose, for people."""
    fr, trial = p.frames, p.offsets_trial
    out = [f"profile: {path}", f"machine: {p.machine}, {p.threads} threads; measured in {p.measured_in}"]
    if fr:
        out.append(f"frames:  {fr['sentences'] - fr['held_out_sentences']} training sentences "
                   f"({fr['training_frames']} frames), {fr['held_out_sentences']} held out ({fr['held_out_frames']})")
    for name, r in trial.get("candidates", {}).items():
        ci = r["vs_zero"]["ci95"]
        out.append(f"offsets: {name:<8} {r['tokens_per_call']:.2f} tokens/call vs {r['zero_tokens_per_call']:.2f} "
                   f"with zero offsets ({r['vs_zero']['delta']:+.2f}, 95% CI {ci[0]:+.2f} .. {ci[1]:+.2f})"
                   + ("  kept" if name == trial.get("kept") else ""))
    if trial and not trial.get("kept"):
        out.append("offsets: none beat zero offsets beyond noise; spec drafts with "
                   + ("the shipped ones" if "shipped" in trial.get("candidates", {}) else "zero offsets"))
    if p.tree_size:
        out.append(f"tree:    {p.tree_size} draft nodes, a verify call {p.verify_over_ar:.2f}x an ar call here")
        out.append(f"spec:    {p.tokens_per_call:.2f} tokens per call (expected by draft depth: "
                   + " ".join(f"{v:.2f}" for v in p.tokens_per_call_by_depth) + "; acceptance by depth: "
                   + " ".join(f"{v:.2f}" for v in p.acceptance_by_depth) + f"); the predictor ~{p.spec_gain:.2f}x in "
                   f"{p.measured_in}")
    if p.formats:
        out.append("formats: weights  agree(c0)  agree(c1-15)  KL talker  KL predictor  ms/frame (talker+predictor)"
                   "  spec predictor ms  verify/ar  passes")
        for f in p.formats:
            out.append(f"         {f.weights:<7} {f.code0_agreement:9.3f}  {f.codes_agreement:12.3f}  "
                       f"{f.kl_talker:9.4f}  {f.kl_predictor:12.4f}  {f.frame_ms:8.1f} ({f.talker_ms:.1f}+"
                       f"{f.predictor_ms:.1f})  {f.spec_predictor_ms:17.1f}  {f.verify_over_ar:9.2f}  "
                       f"{'yes' if f.passes else 'no'}")
    for note in p.notes:
        out.append(f"note:    {note}")
    if p.decision:
        d = p.decision
        out.append(f"chosen:  --mode auto = {d.mode}, --weights auto = {d.weights}: {d.why}")
    return "\n".join(out)


def offer_line(folder: Path, name: str) -> str | None:
    """The line `leapvox models pull` ends with: tune's estimated time here for this model (None when it is tuned
    already, or its config cannot be read)."""
    from leapvox.models import tune as T
    from leapvox.models.checkpoint import load_config
    from leapvox.models.profile import load_profile

    try:
        if load_profile(folder)[0] is not None:
            return None
        cfg = load_config(folder)
    except Exception:  # noqa: BLE001 - the offer is a courtesy; pull has succeeded whatever happens here
        return None
    if cfg.tts_model_type == "base":
        return None
    size = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
    texts = T.texts_for(cfg.talker.codec_language_id, T.DEFAULT_UTTERANCES)
    est = T.estimate(size, sum(T.expected_frames(t) for t, _ in texts), T.likely_formats())  # builds nothing
    return (f"`leapvox tune {name}` measures spec mode and the weight formats for this model here, for "
            f"--mode/--weights auto: about {est.minutes} min (not run automatically; --background runs it detached)")
