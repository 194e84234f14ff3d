"""`leapvox tune`'s stages (issue #39): one model on this machine, measured and decided, into its profile
(models/profile.py). What is decided and why lives in models/tune.py; this is the measuring.

Stages, in models.profile.STAGES order; each finished one is recorded in the profile (`stages_done`) and its data
kept in the work folder (`models.profile.work_dir`), so a rerun continues where a run stopped:

- frames: the model speaks the sentences with its own sampled `ar` decoding in its default weight format; one file
  per sentence (codes, text, language, seed). The last HELD_OUT_SHARE of the sentences are held out.
- offsets: the teacher-forced frames (`frames.pt`, the default format, as spec will run); draft offsets trained on
  the training sentences
  (codes 1..15 re-drawn by the predictor, the bundled demo's recipe), kept only where spec's tokens per call on the
  held-out sentences beat zero offsets with a paired 95 % interval above zero (as `leapvox recipe offsets`).
  Offsets shipped beside the model are what spec mode reads first: they are measured, not replaced.
- tree: rank acceptance on the training frames, verify calls of trees of TREE_SIZES nodes timed against an ar call
  in the default format; the tree with the best estimated speed-up is stored where spec mode reads it; tokens per
  call and per-depth acceptance measured with it on the held-out frames.
- formats: every weight format that runs here against fp32 on the held-out sentences, teacher-forced (argmax
  agreement and KL of the code distributions, talker and predictor), and its speed: ar and spec frames of one
  held-out sentence, interleaved; one file per format.
- decision: models.tune.decide.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from leapvox.engine.errors import InputError, LeapvoxError
from leapvox.engine.options import validate
from leapvox.engine.sampling import suppress_mask_for
from leapvox.engine.spec import DraftPlan, DraftTree, default_tree
from leapvox.models import profile as P
from leapvox.models import tune as T
from leapvox.models.auto import auto_weights
from leapvox.models.files import write_bytes_atomic, write_text_atomic
from leapvox.models.load import load_model
from leapvox.models.spec_assets import BESIDE, load_offsets, offsets_path, save_offsets, save_tree, tree_path

from . import spec as S
from .stats import paired_ratio_delta

OFFSET_VARIANTS = ("tv",)  # the objective the bundled demo kept (of tv and ce): the acceptance rate itself
OFFSET_DEPTH = 3  # drafted codes ahead (the paper's K)
OFFSET_STEPS = 200
TREE_SIZES = (4, 8, 16, 32)
SPEED_FRAMES = 12  # frames per timed utterance in the formats stage
SPEED_ROUNDS = 3  # ar, spec, ar, spec ...


class TuneError(LeapvoxError):
    """A tune that cannot go on (exit 1), with a hint."""


@dataclass
class Settings:
    """What a run is asked for; a rerun with different settings starts afresh."""

    utterances: int = T.DEFAULT_UTTERANCES
    lines: list[str] | None = None  # the user's sentences (--texts), else the built-in set
    max_frames: int = T.MAX_FRAMES
    formats: tuple[str, ...] | None = None  # None: every weight format that runs here (fp32 always)
    offset_steps: int = OFFSET_STEPS

    def key(self) -> dict:
        """The settings as recorded in the profile, with torch's thread count (the timings hold for it)."""
        texts = None if self.lines is None else hashlib.sha1("\n".join(self.lines).encode()).hexdigest()[:12]
        return {"utterances": self.utterances, "texts": texts or "built-in", "max_frames": self.max_frames,
                "formats": "all" if self.formats is None else list(self.formats), "offset_steps": self.offset_steps,
                "threads": torch.get_num_threads()}


@dataclass
class Utterance:
    text: str
    language: str
    seed: int
    codes: torch.Tensor  # [F, 16]
    seconds: float = 0.0

    def options(self, defaults):
        return replace(defaults, seed=self.seed, language=self.language, mode="ar")


def _quiet(*args) -> None:
    pass


@dataclass
class Tune:
    """One tune of the model in `folder` on this machine. `say(line)` reports; `progress(stage, done, total)`
    advances the stage's bar (units: sentences, steps, formats ...)."""

    folder: Path
    settings: Settings = field(default_factory=Settings)
    say: Callable[[str], None] = _quiet
    progress: Callable[[str, float, float], None] = _quiet
    path: Path = field(init=False)
    work: Path = field(init=False)
    profile: P.Profile = field(init=False)

    def __post_init__(self):
        self.folder = Path(self.folder)
        self.path, self.work = P.profile_path(self.folder), P.work_dir(self.folder)
        self._models: dict[str, object] = {}
        self._frames = None
        self.default_weights = auto_weights(self.folder)

    # ---- state -------------------------------------------------------------------------------------------------

    def state(self) -> tuple[str, str | None]:
        """("fresh" | "resume" | "finished" | "restart", why) for the profile on disk."""
        if not self.path.is_file():
            return "fresh", None
        try:
            old = P.Profile.from_json(self.path.read_text())
        except (OSError, ValueError, TypeError, KeyError) as e:
            return "restart", f"its profile is unreadable ({e})"
        why = P.stale_reason(old, self.folder)
        if why:
            return "restart", f"its profile is stale: {why}"
        if old.decision is not None:
            return "finished", None
        now = self.settings.key()
        if old.settings and old.settings != now:
            diff = ", ".join(f"{k} {old.settings.get(k)}, now {v}" for k, v in now.items() if old.settings.get(k) != v)
            return "restart", f"the unfinished run was asked for other settings ({diff})"
        return "resume", None

    def begin(self, force: bool = False) -> str:
        """Load or start the profile; returns the state it found (see `state`)."""
        state, _ = self.state()
        if state == "resume" or (state == "finished" and not force):
            self.profile = P.Profile.from_json(self.path.read_text())
            return state
        if self.work.exists():
            shutil.rmtree(self.work)
        self.profile = P.Profile(
            model_key=P.model_key(self.folder), fingerprint=P.fingerprint(self.folder), machine=P.machine_id(),
            versions=P.versions(), threads=torch.get_num_threads(),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), settings=self.settings.key(),
            measured_in=self.default_weights,
        )
        self.save()
        return state

    def save(self) -> None:
        P.save_profile(self.path, self.profile)

    def todo(self) -> list[str]:
        return [s for s in P.STAGES if s not in self.profile.stages_done]

    def run(self) -> P.Profile:
        """Every stage not done yet, in order; the profile is saved after each."""
        self.work.mkdir(parents=True, exist_ok=True)
        for stage in self.todo():
            t0 = time.perf_counter()
            getattr(self, f"stage_{stage}")()
            self.profile.stage_seconds[stage] = round(time.perf_counter() - t0, 1)
            self.profile.stages_done.append(stage)
            self.save()
        self._release(keep=())
        return self.profile

    # ---- models ------------------------------------------------------------------------------------------------

    def model(self, weights: str):
        if weights not in self._models:
            self._release(keep=())
            self._models[weights] = load_model(self.folder, weights=weights)
        return self._models[weights]

    def _release(self, keep) -> None:
        for w in [w for w in self._models if w not in keep]:
            del self._models[w]
        gc.collect()

    # ---- frames ------------------------------------------------------------------------------------------------

    def sentences(self, cfg) -> list[tuple[str, str]]:
        return T.texts_for(cfg.talker.codec_language_id, self.settings.utterances, self.settings.lines)

    def held_out_count(self) -> int:
        n = self.settings.utterances
        return min(n - 1, max(1, round(n * T.HELD_OUT_SHARE)))

    def probe(self, frames: int = 4) -> float:
        """Seconds per frame of the default format here: `frames` frames of the first sentence after two frames of
        warm-up (a model's first calls after loading are several times slower), prefill excluded."""
        m = self.model(self.default_weights)
        text, lang = self.sentences(m.config)[0]
        synth, stats = m.synthesizer(), None
        for n in (2, frames):
            opts = validate(replace(m.defaults, seed=0, language=lang, max_frames=n, runaway_guard=False), m.config)
            _, stats, _ = synth.generate_codes(text, opts)
        return (stats.talker_s + stats.predictor_s) / max(1, stats.frames)

    def stage_frames(self) -> None:
        m = self.model(self.default_weights)
        synth, todo = m.synthesizer(), self.sentences(m.config)
        out = self.work / "utterances"
        out.mkdir(parents=True, exist_ok=True)
        self.progress("frames", 0, len(todo))
        for i, (text, lang) in enumerate(todo):
            path = out / f"{i:04d}.pt"
            if not path.is_file():
                opts = validate(replace(m.defaults, seed=i, language=lang, max_frames=self.settings.max_frames,
                                        mode="ar"), m.config)
                t0 = time.perf_counter()
                codes, _, _ = synth.generate_codes(text, opts)
                _save_pt(path, {"text": text, "language": lang, "seed": i, "codes": codes,
                                "seconds": time.perf_counter() - t0})
            self.progress("frames", i + 1, len(todo))
        train, held = self.utterances()
        if not sum(len(u.codes) for u in train) or not sum(len(u.codes) for u in held):
            raise TuneError("the model spoke no frames for the training or the held-out sentences",
                            hint="give more sentences (--utterances) or other ones (--texts)")
        self.profile.frames = {"sentences": len(train) + len(held), "held_out_sentences": len(held),
                               "training_frames": sum(len(u.codes) for u in train),
                               "held_out_frames": sum(len(u.codes) for u in held),
                               "seconds_per_frame": round(sum(u.seconds for u in train + held)
                                                          / max(1, sum(len(u.codes) for u in train + held)), 4)}

    def utterances(self) -> tuple[list[Utterance], list[Utterance]]:
        """(training, held-out) sentences from the frames stage's files."""
        files = sorted((self.work / "utterances").glob("*.pt"))
        if len(files) != self.settings.utterances:
            raise TuneError(f"the frames stage's files in {self.work} are incomplete",
                            hint="run leapvox tune again with --force")
        us = [Utterance(**torch.load(f, weights_only=True)) for f in files]
        k = len(us) - self.held_out_count()
        return us[:k], us[k:]

    def teacher_frames(self) -> tuple[S.Frames, S.Frames]:
        """Teacher-forced (training, held-out) frames in the default format, computed once (`frames.pt`)."""
        if self._frames is None:
            path = self.work / "frames.pt"
            if path.is_file():
                d = torch.load(path, weights_only=True)
            else:
                m, (train, held) = self.model(self.default_weights), self.utterances()
                synth = m.synthesizer()
                d = {}
                for name, us in (("train", train), ("held", held)):
                    parts = [S.teacher_forced_frames(synth, u.text, u.codes, u.options(m.defaults))
                             for u in us if len(u.codes)]
                    d[name] = {f: torch.cat([getattr(p, f) for p in parts]) for f in ("hidden", "code0_embed", "codes")}
                _save_pt(path, d)
            self._frames = S.Frames(**d["train"]), S.Frames(**d["held"])
        return self._frames

    # ---- offsets -----------------------------------------------------------------------------------------------

    def stage_offsets(self) -> None:
        train, held = self.teacher_frames()
        m = self.model(self.default_weights)
        cp, params = m.tts.talker.code_predictor, m.defaults.predictor
        existing, where = load_offsets(self.folder, cp.cfg.hidden_size)
        shipped = where is not None and where.name == BESIDE and where.parent == self.folder
        candidates: dict[str, torch.Tensor] = {}
        if existing is not None:
            candidates["shipped" if shipped else "stored"] = existing
        variants = () if shipped else OFFSET_VARIANTS
        steps = self.settings.offset_steps
        total = len(variants) * steps + len(candidates) + len(variants)
        self.progress("offsets", 0, total)
        if variants:
            sampled = S.self_sampled(cp, train, params, seed=1)
            for v, kind in enumerate(variants):
                def tick(step, n, loss, v=v):
                    self.progress("offsets", v * steps + step, total)

                with warnings.catch_warnings():  # its progress reads float(loss) of a tensor that needs grad
                    warnings.simplefilter("ignore", UserWarning)
                    candidates[kind] = S.train_offsets(cp, sampled, depth=OFFSET_DEPTH, kind=kind, steps=steps,
                                                       params=params, progress=tick)
        rows, zero_runs, done = {}, {}, len(variants) * steps
        for name, b in candidates.items():
            tree = default_tree(max(1, min(b.shape[-2], 14)))
            if tree not in zero_runs:
                zero_runs[tree] = S.run_spec(cp, held, DraftPlan(tree, None), params)
            z, r = zero_runs[tree], S.run_spec(cp, held, DraftPlan(tree, b), params)
            rows[name] = {"depth": int(b.shape[-2]), "tokens_per_call": round(r.tokens_per_call, 4),
                          "zero_tokens_per_call": round(z.tokens_per_call, 4),
                          "vs_zero": paired_ratio_delta(z.tokens, z.calls, r.tokens, r.calls)}
            done += 1
            self.progress("offsets", done, total)
        winners = [n for n, r in rows.items() if r["vs_zero"]["ci95"][0] > 0]
        best = max(winners, key=lambda n: rows[n]["tokens_per_call"], default=None)
        kept = None
        if best in OFFSET_VARIANTS:
            kept = save_offsets(offsets_path(self.folder), candidates[best],
                                {"variant": best, "depth": OFFSET_DEPTH, "by": "leapvox tune", **rows[best]})
        elif best is not None:
            kept = where
        elif existing is not None and not shipped:  # an earlier file that does not beat zero: spec would read it
            aside = where.with_name(where.name + ".replaced-by-tune")
            where.replace(aside)
            self.profile.notes.append(f"moved {where} (no better than zero offsets here) to {aside.name}")
        elif shipped:
            self.profile.notes.append(f"the offsets shipped with the model ({where}) did not beat zero offsets on "
                                      "these held-out frames; spec mode still reads them")
        self.profile.offsets_path = None if kept is None else str(kept)
        self.profile.offsets_trial = {"candidates": rows, "kept": best}
        if best:
            r = rows[best]
            self.say(f"offsets: {best} kept, {r['tokens_per_call']:.2f} tokens/call on the held-out sentences against "
                     f"{r['zero_tokens_per_call']:.2f} with zero offsets")
        else:
            self.say("offsets: none beat zero offsets on the held-out sentences beyond noise")
        self.progress("offsets", total, total)

    # ---- tree --------------------------------------------------------------------------------------------------

    def stage_tree(self) -> None:
        train, held = self.teacher_frames()
        m = self.model(self.default_weights)
        cp, params = m.tts.talker.code_predictor, m.defaults.predictor
        offsets, _ = load_offsets(self.folder, cp.cfg.hidden_size)
        depth = OFFSET_DEPTH if offsets is None else max(1, min(offsets.shape[-2], 14))
        self.progress("tree", 0, len(TREE_SIZES) + 1)
        acc = S.rank_acceptance(cp, train, offsets, depth, ranks=16)
        rows = []
        for i, n in enumerate(TREE_SIZES):
            tree = S.grow_tree(acc, n)
            ratio = verify_ratio(cp, tree.size)
            tokens = S.expected_tokens_per_call(tree, acc, cp.num_heads)
            rows.append({"N": tree.size, "expected_tokens_per_call": round(tokens, 4),
                         "verify_over_ar": round(ratio, 4), "speedup_estimate": round(tokens / ratio, 4),
                         "paths": tree.paths()[1:]})
            self.progress("tree", i + 1, len(TREE_SIZES) + 1)
        best = max(rows, key=lambda r: r["speedup_estimate"])
        tree = DraftTree.from_paths(tuple(p) for p in best["paths"])
        path = save_tree(tree_path(self.folder), tree, {"N": best["N"], "rank_acceptance": acc, "measured": rows,
                                                       "backend": "cpu", "device": "cpu", "by": "leapvox tune",
                                                       "weights": self.default_weights})
        run = S.run_spec(cp, held, DraftPlan(tree, offsets), params)
        p = self.profile
        p.tree_path, p.tree_size, p.verify_over_ar = str(path), tree.size, best["verify_over_ar"]
        p.tokens_per_call = round(run.tokens_per_call, 4)
        p.acceptance_by_depth = [round(a, 4) for a in run.per_depth]
        p.tokens_per_call_by_depth = [round(S.expected_tokens_per_call(tree.pruned(d), acc, cp.num_heads), 4)
                                      for d in range(1, tree.max_depth + 1)]
        p.spec_gain = round(run.tokens_per_call / best["verify_over_ar"], 4)
        self.progress("tree", len(TREE_SIZES) + 1, len(TREE_SIZES) + 1)

    # ---- formats -----------------------------------------------------------------------------------------------

    def stage_formats(self) -> None:
        self._release(keep=())  # a model loaded before the offsets and tree were stored drafts without them
        _, held = self.utterances()
        held = [u for u in held if len(u.codes)]
        names = T.formats_here(self.settings.formats)
        out = self.work / "formats"
        out.mkdir(parents=True, exist_ok=True)
        ref = None
        results = []
        self.progress("formats", 0, len(names))
        for i, w in enumerate(names):
            path = out / f"{w}.json"
            if path.is_file():
                results.append(P.FormatResult(**json.loads(path.read_text())))
            else:
                if ref is None:
                    ref = code_logits(self.model("fp32"), held)
                m = self.model(w)
                fid = fidelity(ref, code_logits(m, held) if w != "fp32" else ref, m.defaults)
                speed = format_speed(m, held[0], self.settings.max_frames)
                r = P.FormatResult(weights=w, **fid, **speed,
                                   passes=T.passes(fid["kl_talker"], fid["kl_predictor"]))
                write_text_atomic(path, json.dumps(asdict(r), indent=1))
                results.append(r)
            self.progress("formats", i + 1, len(names))
        self.profile.formats = results

    # ---- decision ----------------------------------------------------------------------------------------------

    def stage_decision(self) -> None:
        p = self.profile
        p.decision = T.decide(p.formats, p.tokens_per_call, p.verify_over_ar)


def _save_pt(path: Path, obj) -> None:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes_atomic(path, buf.getvalue())


# ---- what the formats stage measures --------------------------------------------------------------------------


@torch.inference_mode()
def code_logits(model, utterances: list[Utterance]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's teacher-forced logits on the utterances' codes: code 0 [F, V] (control ids masked out as in
    decoding) and codes 1..15 [F, 15, Vc], fp32."""
    synth, talker = model.synthesizer(), model.tts.talker
    cp, tc = talker.code_predictor, model.config.talker
    mask = suppress_mask_for(tc.vocab_size, tc.suppressed_ids, tc.codec_eos_token_id)
    c0s, rests = [], []
    for u in utterances:
        fr = S.teacher_forced_frames(synth, u.text, u.codes, u.options(model.defaults))
        c0s.append(talker.codec_head(fr.hidden).float().masked_fill(mask, float("-inf")))
        hid = S.predictor_hidden(cp, fr)  # [F, 16, Hc]
        rests.append(torch.stack([cp.lm_head[j](hid[:, j + 1]).float() for j in range(cp.num_heads)], dim=1))
    return torch.cat(c0s), torch.cat(rests)


def _kl(ref: torch.Tensor, other: torch.Tensor, temperature: float) -> float:
    """Mean KL(softmax(ref / T) || softmax(other / T)) over the rows, nats; ids impossible under both are left out."""
    lp, lq = torch.log_softmax(ref / temperature, -1), torch.log_softmax(other / temperature, -1)
    p = lp.exp()
    terms = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))
    return float(terms.sum(-1).mean())


def fidelity(ref: tuple[torch.Tensor, torch.Tensor], other: tuple[torch.Tensor, torch.Tensor], defaults) -> dict:
    """Argmax agreement and KL at the sampling temperatures of `other`'s logits against `ref`'s (code_logits)."""
    (a0, ar), (b0, br) = ref, other
    return {"code0_agreement": round(float((a0.argmax(-1) == b0.argmax(-1)).float().mean()), 4),
            "codes_agreement": round(float((ar.argmax(-1) == br.argmax(-1)).float().mean()), 4),
            "kl_talker": round(_kl(a0, b0, defaults.talker.temperature), 6),
            "kl_predictor": round(_kl(ar.flatten(0, 1), br.flatten(0, 1), defaults.predictor.temperature), 6)}


def format_speed(model, u: Utterance, max_frames: int) -> dict:
    """ms per frame of one held-out sentence in ar and spec (the profile's offsets and tree), SPEED_ROUNDS rounds
    interleaved, each figure from its least disturbed round (see verify_ratio): talker step, predictor frame, spec's
    predictor frame; spec's tokens per call; and the verify call over the model's tree against an ar call."""
    synth = model.synthesizer()
    frames = min(SPEED_FRAMES, max_frames)
    t, pr, sp, tokens, calls = [], [], [], 0, 0
    for r in range(SPEED_ROUNDS):
        for mode in ("ar", "spec"):
            opts = validate(replace(model.defaults, seed=u.seed + r, language=u.language, max_frames=frames,
                                    mode=mode, runaway_guard=False), model.config)
            _, st, _ = synth.generate_codes(u.text, opts)
            n = max(1, st.frames)
            if mode == "ar":
                t.append(1000 * st.talker_s / n)
                pr.append(1000 * st.predictor_s / n)
            else:
                sp.append(1000 * st.predictor_s / n)
                tokens, calls = tokens + st.spec.tokens, calls + st.spec.calls
    return {"frame_ms": round(min(t) + min(pr), 3), "talker_ms": round(min(t), 3), "predictor_ms": round(min(pr), 3),
            "spec_predictor_ms": round(min(sp), 3), "tokens_per_call": round(tokens / max(1, calls), 4),
            "verify_over_ar": round(verify_ratio(model.tts.talker.code_predictor, model.plan.tree.size), 4)}


@torch.inference_mode()
def verify_ratio(cp, nodes: int, prefix: int = 8, repeats: int = 40) -> float:
    """One verify call over `nodes` drafts / one ar call, on the predictor's hot loop as spec and ar run them: each
    timed `repeats` times back to back, the ratio of their fastest. The fastest repeat is the call's cost without
    interruptions; on a busy machine a descheduled repeat takes a time slice longer, which a median of the ratios
    (recipes/spec.verify_over_ar) picks up whenever that happens to half of one kind of call."""
    ar, verify = S.call_timings(cp, nodes, prefix, repeats)
    return min(verify) / min(ar)


def check_model(cfg) -> None:
    """A model tune can speak with: not a Base model (it needs a cloned voice)."""
    if cfg.tts_model_type == "base":
        raise InputError("leapvox tune speaks the model's built-in voices; a Base model has none",
                         hint="tune the CustomVoice model of the same size: its talker and predictor are the ones "
                              "to measure")


def model_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def running_pid(work: Path) -> int | None:
    """The process id of a tune running on this work folder, if one is alive."""
    try:
        pid = int((work / "pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid if pid != os.getpid() else None
