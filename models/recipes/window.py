"""`leapvox recipe window`: adapt a full-attention model to windowed decoding (WAND-style), with distillation.

The student starts as a copy of the model and is trained under exactly the attention pattern of windowed mode
(engine/caches.py RingCache): every prompt row is visible to every later row, and frame row L+k sees frame rows
k-W+1 .. k only. Two schedules over the first `anneal` fraction of the steps make the change gradual:

  window   W(t) = W + (W0 - W) * (1 + cos(pi * t)) / 2, from W0 (default 128) down to the target W;
  softness frame keys beyond the window are not cut off but damped by log sigmoid((W(t) - 1/2 - d) / tau(t)),
           d = how many frames back the key is; tau(t) falls linearly from tau0 to 0 (the hard mask).

The rest of the steps train at the hard target window. Loss per step, on teacher-forced ground-truth frames:

  skewed KL  KL(p_T || a p_T + (1 - a) p_S) of code 0 (talker head) and of codes 1..15 (code predictor fed
             each model's own talker hidden), teacher = the frozen full-attention model, a = `alpha`;
  plus       `ce_weight` x cross-entropy on the ground truth (code 0 and codes 1..15).

The adapted checkpoint is the model's folder with new weights and `"leapvox_window": W` in config.json, which
windowed mode reads as its default window (and then stops calling itself an approximation).
Training data: a folder written by `leapvox recipe demo build-data` (text or phonemes + codes of the model's codec).
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from leapvox.engine.errors import InputError

NEG = -1e4  # finite "never": large enough to zero a softmax weight, safe in fp16/bf16


@dataclass
class WindowSchedule:
    window: int  # target W (frames)
    start: int = 128  # W0
    tau0: float = 4.0  # initial mask softness (frames)
    anneal: float = 0.7  # fraction of the steps spent annealing

    def at(self, step: int, steps: int) -> tuple[float, float]:
        """(window, tau) at `step` of `steps`; tau 0 means the hard mask."""
        t = min(1.0, step / max(1, self.anneal * steps))
        w = self.window + (max(self.start, self.window) - self.window) * 0.5 * (1 + math.cos(math.pi * t))
        return w, self.tau0 * (1 - t)


def window_bias(starts: list[int], length: int, window: float, tau: float = 0.0) -> torch.Tensor:
    """Additive attention bias [B, 1, S, S] of windowed mode for a teacher-forced batch.

    Causal everywhere; for frame queries (row >= L) over frame keys (col >= L), d = row - col frames back:
    kept when d <= W - 1 (hard, tau = 0), else damped by log sigmoid((W - 1/2 - d) / tau)."""
    row = torch.arange(length)[:, None]
    col = torch.arange(length)[None, :]
    d = (row - col).float()
    out = torch.empty(len(starts), 1, length, length)
    for b, L in enumerate(starts):
        frames = (row >= L) & (col >= L)
        if tau > 0:
            damp = F.logsigmoid((window - 0.5 - d) / tau).clamp(min=NEG)
        else:
            damp = torch.where(d <= window - 1, 0.0, NEG)
        bias = torch.where(frames, damp, torch.zeros(()))
        out[b, 0] = torch.where(col <= row, bias, torch.full((), NEG))
    return out


def skew_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """Mean over rows of KL(p || alpha p + (1 - alpha) q), p = softmax(teacher), q = softmax(student)."""
    logp = F.log_softmax(teacher_logits.float(), -1)
    logq = F.log_softmax(student_logits.float(), -1)
    logm = logq if alpha == 0 else torch.logsumexp(torch.stack([logp + math.log(alpha), logq + math.log(1 - alpha)]), 0)
    return (logp.exp() * (logp - logm)).sum(-1).mean()


def distill_losses(student, teacher, cfg, batch, window: float, tau: float, alpha: float, cp_fraction: float, rng,
                   dropout: float = 0.0) -> dict[str, torch.Tensor]:
    """The four loss terms of one batch (student under the window mask): skewed KL and CE, code 0 and 1..15."""
    from leapvox.models.recipes.demo.train import make_batch, pick_frames, predictor_logits

    x, target, starts, frames = make_batch(student, cfg, batch)
    h = student.talker.model.forward_train(x, dropout, window_bias(starts, x.shape[1], window, tau).to(x.device))
    with torch.no_grad():
        xt = make_batch(teacher, cfg, batch)[0]
        ht = teacher.talker.model.forward_train(xt)
    on = target.flatten() != -100
    s0 = student.talker.codec_head(h).flatten(0, 1)[on]
    with torch.no_grad():
        t0 = teacher.talker.codec_head(ht).flatten(0, 1)[on]
    out = {"kl0": skew_kl(t0, s0, alpha), "ce0": F.cross_entropy(s0, target.flatten()[on])}
    picks = pick_frames(batch, cp_fraction, rng) or [(0, 0)]
    scp, codes = predictor_logits(student, h, starts, frames, picks, dropout)
    with torch.no_grad():
        tcp, _ = predictor_logits(teacher, ht, starts, frames, picks)
    out["klcp"] = skew_kl(tcp.flatten(0, 1), scp.flatten(0, 1), alpha)
    out["cecp"] = F.cross_entropy(scp.flatten(0, 1), codes[:, 1:].flatten())
    return out


@torch.no_grad()
def heldout_ce(model, cfg, examples, window: int | None, batch: int = 16) -> dict[str, float]:
    """Teacher-forced held-out cross-entropy (code 0, codes 1..15) under the hard window mask (None: full)."""
    from leapvox.models.recipes.demo.train import make_batch, predictor_logits

    model.eval()
    tot0 = totcp = n0 = ncp = 0.0
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        x, target, starts, frames = make_batch(model, cfg, chunk)
        bias = None if window is None else window_bias(starts, x.shape[1], window).to(x.device)
        h = model.talker.model.forward_train(x, 0.0, bias)
        on = target.flatten() != -100
        tot0 += F.cross_entropy(model.talker.codec_head(h).flatten(0, 1)[on], target.flatten()[on],
                                reduction="sum").item()
        n0 += on.sum().item()
        picks = [(b, k) for b, e in enumerate(chunk) for k in range(len(e.codes))]
        logits, codes = predictor_logits(model, h, starts, frames, picks)
        totcp += F.cross_entropy(logits.flatten(0, 1), codes[:, 1:].flatten(), reduction="sum").item()
        ncp += codes[:, 1:].numel()
    return {"code0": round(tot0 / n0, 4), "codes1_15": round(totcp / ncp, 4)}


def load_split(loaded, data_dir: Path, split: str, max_frames: int):
    from leapvox.models.recipes.demo.train import load_examples

    if not (data_dir / f"{split}.pt").is_file():
        raise InputError(f"no {split}.pt in {data_dir}", hint="give a folder written by leapvox recipe demo build-data")
    return load_examples(data_dir, split, loaded.tokenizer, max_frames)


def train_window(model_path: str, data_dir: str, out_dir: str, window: int, steps: int = 400, batch: int = 8,
                 lr: float = 2e-4, alpha: float = 0.1, ce_weight: float = 0.5, schedule: WindowSchedule | None = None,
                 cp_fraction: float = 0.25, heldout: int = 64, seed: int = 0, log=print) -> dict:
    """Adapt `model_path` to `window` frames; writes the adapted checkpoint folder `out_dir`; returns the report."""
    from leapvox.models.load import load_model

    if window < 1 or steps < 1:
        raise InputError("--window and --steps must be >= 1")
    out = Path(out_dir)
    if out.resolve() == Path(model_path).resolve():
        raise InputError("--out must differ from the model folder", hint="the adapted model is a new checkpoint")
    schedule = schedule or WindowSchedule(window)
    torch.manual_seed(seed)
    loaded = load_model(model_path)
    cfg, teacher = loaded.config, loaded.tts.eval()
    if "leap" not in cfg.talker.spk_id or "english" not in cfg.talker.codec_language_id:
        raise InputError("recipe window builds the demo model's prompt (speaker 'leap', language 'english'), "
                         "which this model does not have", hint="adapt the demo model, or a model trained like it")
    student = copy.deepcopy(teacher).train()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = Path(data_dir)
    train = load_split(loaded, data, "train", 200)
    test = load_split(loaded, data, "test", 200)[:heldout]
    train.sort(key=lambda e: len(e.codes) + len(e.body))
    buckets = [train[i : i + batch] for i in range(0, len(train), batch)]
    rng = random.Random(seed)
    before = {"full": heldout_ce(teacher, cfg, test, None), "window": heldout_ce(teacher, cfg, test, window)}
    log(f"held-out CE before: full attention {before['full']}, window {window} {before['window']}")
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    t_start = time.time()
    history = []
    for step in range(steps):
        student.train()
        w, tau = schedule.at(step, steps)
        terms = distill_losses(student, teacher, cfg, rng.choice(buckets), w, tau, alpha, cp_fraction, rng)
        loss = terms["kl0"] + terms["klcp"] + ce_weight * (terms["ce0"] + terms["cecp"])
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 20)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        if (step + 1) % 25 == 0 or step + 1 == steps:
            rec = {"step": step + 1, "window": round(w, 1), "tau": round(tau, 2),
                   **{k: round(v.item(), 4) for k, v in terms.items()}}
            history.append(rec)
            per = (time.time() - t_start) / (step + 1)
            log(f"step {step + 1}/{steps}  W {w:5.1f}  tau {tau:4.2f}  kl0 {rec['kl0']:.3f}  klcp {rec['klcp']:.3f}  "
                f"ce0 {rec['ce0']:.3f}  {per:.2f} s/step, {per * (steps - step - 1):.0f} s left")
    after = {"full": heldout_ce(student, cfg, test, None), "window": heldout_ce(student, cfg, test, window)}
    log(f"held-out CE after: window {window} {after['window']} (unadapted {before['window']}, "
        f"full-attention teacher {before['full']})")
    report = {"window": window, "steps": steps, "batch": batch, "lr": lr, "alpha": alpha, "ce_weight": ce_weight,
              "schedule": {"start": schedule.start, "tau0": schedule.tau0, "anneal": schedule.anneal},
              "teacher": str(Path(model_path).resolve()), "heldout_sentences": len(test),
              "heldout_ce": {"teacher_full": before["full"], "teacher_window": before["window"],
                             "student_window": after["window"], "student_full": after["full"]},
              "seconds": round(time.time() - t_start, 1), "history": history}
    save_adapted(loaded.path, student, out, window, report)
    return report


def save_adapted(src: Path, model, out: Path, window: int, report: dict) -> Path:
    """Copy the checkpoint folder with the adapted weights (same dtype as the source) and the window in config."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src_weights = src / "model.safetensors"
    with safe_open(str(src_weights), "pt") as f:
        dtype = f.get_tensor(next(iter(f.keys()))).dtype
    tmp = out.with_name(out.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    skip = shutil.ignore_patterns("model.safetensors", "model-*.safetensors", "model.safetensors.index.json",
                                  "leapvox_*")
    shutil.copytree(src, tmp, ignore=lambda d, names: skip(d, names) if Path(d) == src else set())
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"leapvox_window": str(window)})
    cfg = json.loads((src / "config.json").read_text())
    cfg["leapvox_window"] = window
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / "leapvox_window_report.json").write_text(json.dumps(report, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return out
