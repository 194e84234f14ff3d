"""Training recipe for the demo model: a small Qwen3-TTS-architecture talker + code predictor on espeak speech.

Same networks (engine/nets/talker.py) and the same non-streaming CustomVoice prompt as Qwen3-TTS; the text track
carries espeak-ng IPA phonemes through a tiny byte-level BPE tokenizer in the Qwen2 file format. Teacher
forcing: loss = CE(code 0, talker) + mean CE(codes 1..15, code predictor on a random 25 % of frames), or with
`objective="distortion"` the predictor's expected codec-space error instead of its CE (`excess_distortion`).
Resumable: `state.pt` in the output folder holds model, optimizer and step; `export()` writes the official
folder layout (config.json, model.safetensors, tokenizer files, speech_tokenizer/).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from leapvox.engine.config import TTSConfig
from leapvox.engine.errors import InputError
from leapvox.engine.fast.predictor import predict_codes_reference
from leapvox.engine.nets.talker import TTSModel
from leapvox.engine.sampling import SamplingParams

from .sizes import SIZES
from .tokenizer_files import write_tokenizer

SPEAKER, LANGUAGE = "leap", "english"


def _layer(h: int, heads: int) -> dict:
    return dict(hidden_size=h, intermediate_size=3 * h, num_attention_heads=heads, num_key_value_heads=heads // 2,
                head_dim=h // heads, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096)


def demo_config(text_vocab_size: int, special_ids: dict[str, int], assistant_id: int, size: str = "small",
                predictor_layers: int | None = None, frontend: str = "espeak-ng-ipa",
                talker_layers: int | None = None) -> dict:
    """config.json for the demo model: code 0 in 0..1023, control ids in the suppressed range 1024..2047.
    `predictor_layers` and `talker_layers` override the size's depths; `frontend` is its text front end
    (models/frontend.py)."""
    z = SIZES[size]
    cp_layers = predictor_layers or z["cp_layers"]
    talker = dict(
        _layer(z["hidden"], z["heads"]), num_hidden_layers=talker_layers or z["layers"], vocab_size=2048,
        text_vocab_size=text_vocab_size, text_hidden_size=z["hidden"],
        num_code_groups=16, codec_pad_id=1100, codec_bos_id=1101, codec_eos_token_id=1102, codec_think_id=1103,
        codec_nothink_id=1104, codec_think_bos_id=1105, codec_think_eos_id=1106,
        codec_language_id={LANGUAGE: 1110}, spk_id={SPEAKER: 1200}, spk_is_dialect={SPEAKER: False},
        code_predictor_config=dict(_layer(z["cp_hidden"], max(4, z["cp_hidden"] // 64)), num_hidden_layers=cp_layers,
                                   vocab_size=256, num_code_groups=16),
    )
    return {
        "model_type": "qwen3_tts", "tts_model_type": "custom_voice", "tts_model_size": "demo",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "leapvox_text_frontend": frontend,
        "im_start_token_id": special_ids["<|im_start|>"], "im_end_token_id": special_ids["<|im_end|>"],
        "assistant_token_id": assistant_id, "tts_pad_token_id": special_ids["<tts_pad>"],
        "tts_bos_token_id": special_ids["<tts_text_bos>"], "tts_eos_token_id": special_ids["<tts_text_eod>"],
        "talker_config": talker,
    }


@dataclass
class Example:
    role: list[int]  # 3 ids
    body: list[int]  # N phoneme token ids
    codes: torch.Tensor  # [F, 16] int64


def make_batch(model: TTSModel, cfg: TTSConfig, batch: list[Example], speaker: str = SPEAKER,
               language: str = LANGUAGE, residuals: dict[int, torch.Tensor] | None = None):
    """Input embeddings [B, S, H], code-0 targets [B, S] (-100 = no loss) and frame bookkeeping: `starts[b]` is
    the prompt length L of example b (its frame k sits at row L + k, as in engine.prompt's non-streaming layout).
    `residuals[b]` [F, 15], when given, replaces example b's codes 1..15 in the input rows only (`frames`, which
    the code predictor learns from, keeps the true codes)."""
    talker, tc = model.talker, cfg.talker
    control = [tc.codec_think_id, tc.codec_think_bos_id, tc.codec_language_id[language], tc.codec_think_eos_id,
               tc.spk_id[speaker], tc.codec_pad_id]
    pad_t, bos_t, eos_t = cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id
    lens = [len(e.role) + len(control) + len(e.body) + 2 + len(e.codes) for e in batch]
    S, B = max(lens), len(batch)
    text = torch.full((B, S), pad_t, dtype=torch.long)
    text_on = torch.zeros(B, S, dtype=torch.bool)
    codec = torch.zeros(B, S, dtype=torch.long)
    codec_on = torch.zeros(B, S, dtype=torch.bool)
    frames = torch.zeros(B, S, 16, dtype=torch.long)
    frame_on = torch.zeros(B, S, dtype=torch.bool)
    target = torch.full((B, S), -100, dtype=torch.long)
    starts = []
    for b, e in enumerate(batch):
        f = len(e.codes)
        tids = e.role + [pad_t] * (len(control) - 1) + [bos_t] + e.body + [eos_t, pad_t]
        text[b, : len(tids)] = torch.tensor(tids)
        text_on[b, : len(tids)] = True
        L = len(tids)
        codec[b, 3 : 3 + len(control)] = torch.tensor(control)
        codec[b, 3 + len(control) : L - 1] = tc.codec_pad_id
        codec[b, L - 1] = tc.codec_bos_id
        codec_on[b, 3:L] = True
        frames[b, L : L + f] = e.codes
        frame_on[b, L : L + f] = True
        text_on[b, L : L + f] = True  # PAD rides on every frame
        target[b, L - 1 : L - 1 + f] = e.codes[:, 0]
        target[b, L - 1 + f] = tc.codec_eos_token_id
        starts.append(L)
    dev = talker.device  # built on the host, embedded where the model lives (CPU or CUDA)
    text, text_on, codec, codec_on = text.to(dev), text_on.to(dev), codec.to(dev), codec_on.to(dev)
    frames, frame_on, target = frames.to(dev), frame_on.to(dev), target.to(dev)
    x = torch.where(text_on[..., None], talker.embed_text(text), 0.0)
    x = x + torch.where(codec_on[..., None], talker.embed_codec(codec), 0.0)
    tables = talker.code_predictor.model.codec_embedding
    read = with_residuals(frames, starts, residuals)
    fsum = talker.embed_codec(read[..., 0]) + sum(tables[g](read[..., g + 1]) for g in range(15))
    x = x + torch.where(frame_on[..., None], fsum, 0.0)
    return x, target, starts, frames


def with_residuals(frames: torch.Tensor, starts: list[int], residuals: dict[int, torch.Tensor] | None) -> torch.Tensor:
    """make_batch's `frames` [B, S, 16] with example b's codes 1..15 replaced by `residuals[b]` [F, 15]."""
    if not residuals:
        return frames
    read = frames.clone()
    for b, res in residuals.items():
        read[b, starts[b] : starts[b] + len(res), 1:] = res.to(read.device)
    return read


def pick_frames(batch: list[Example], fraction: float, rng) -> list[tuple[int, int]]:
    """(example, frame) pairs for the code-predictor loss: a random `fraction` of all frames."""
    return [(b, k) for b, e in enumerate(batch) for k in range(len(e.codes)) if rng.random() < fraction]


def picked_rows(picks, starts: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(example, row) index tensors of the picked frames' rows in make_batch's layout."""
    return (torch.tensor([b for b, _ in picks], device=device),
            torch.tensor([starts[b] + k for b, k in picks], device=device))


def predictor_logits(model: TTSModel, h: torch.Tensor, starts: list[int], frames: torch.Tensor, picks,
                     dropout: float = 0.0, prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced code-predictor logits [M, 15, V] of the picked frames, and their codes [M, 16].

    The predictor's rows are [h_{L-1+k}, C(c0_k), E(c1..c14)]: the talker hidden that produced code 0 of frame k.
    `prefix` [B, S, 16], when given, supplies the codes 1..14 the rows read (e.g. the predictor's own draws)
    in place of `frames`' true ones; the returned codes are still the true ones."""
    talker = model.talker
    cp = talker.code_predictor
    bi, ki = picked_rows(picks, starts, h.device)
    codes = frames[bi, ki]  # [M, 16]
    read = codes if prefix is None else prefix[bi, ki]
    rows = [cp.prefill_rows(h[bi, ki - 1][:, None], talker.embed_codec(codes[:, :1]))]
    rows += [cp.embed(g, read[:, g : g + 1]) for g in range(1, 15)]
    hc = cp.model.forward_train(torch.cat(rows, 1), dropout)  # [M, 16, Hc]
    return torch.stack([cp.lm_head[g](hc[:, g + 1]) for g in range(15)], 1), codes


def excess_distortion(logits: torch.Tensor, codes: torch.Tensor, prefix: torch.Tensor,
                      books: list[torch.Tensor]) -> torch.Tensor:
    """The predictor's expected excess codec distortion, averaged over frames and codes 1..15 (the `distortion`
    objective). Frame m's target is z = the sum of its true codewords (codec space); code g's residual is what
    the codewords of its `prefix` (the true code 0, then the codes 1..g-1 the predictor read) leave of z, and
    choosing codeword c for it costs d(c) = |residual - book_g[c]|^2. The loss is E_p[d] - min_c d, the code's
    softmax-weighted cost above the best codeword, over the mean residual energy of code g in the batch.

    Cross-entropy on the true codes makes the predictor's distribution the data's: sampled where it is unsure,
    it adds codewords unrelated to the frame (measured: scored from the talker teacher-forced, the predictor's
    codes 2..15 raise the codec-space error above leaving them out). Here being unsure costs what the codeword
    costs, so the distribution moves to the codewords that are cheap whatever the frame holds.

    In fp32 even under autocast: the costs are differences of energies in the hundreds, which bf16 would blur."""
    with torch.autocast(logits.device.type, enabled=False):
        books = [b.float() for b in books]
        z = sum(books[g][codes[:, g]] for g in range(len(books)))  # [M, D]
        acc = books[0][codes[:, 0]]
        total = logits.new_zeros((), dtype=torch.float32)
        for g in range(1, len(books)):
            r = z - acc  # [M, D]
            d = (r * r).sum(1, keepdim=True) - 2 * r @ books[g].t() + (books[g] * books[g]).sum(1)  # [M, K]
            p = torch.softmax(logits[:, g - 1].float(), -1)
            excess = (p * d).sum(1) - d.min(1).values
            total = total + excess.mean() / (r * r).sum(1).mean().clamp_min(1e-6)
            if g < len(books) - 1:
                acc = acc + books[g][prefix[:, g]]
        return total / (len(books) - 1)


# The exported generation_config's sampling for codes 1..15, which the talker meets at inference.
SUBTALKER = SamplingParams(do_sample=True, temperature=0.8, top_k=50)


@torch.no_grad()
def sampled_residuals(model: TTSModel, cfg: TTSConfig, batch: list[Example], which: list[int],
                      generator: torch.Generator | None, params: SamplingParams = SUBTALKER,
                      chunk: int = 4096) -> dict[int, torch.Tensor]:
    """Codes 1..15 [F, 15] for examples `which` of `batch`, drawn by the model's own code predictor from the talker
    run teacher-forced over the true frames: at inference the talker reads the predictor's codes of past frames,
    not the codec's, and a talker trained only on the codec's leans on them (held-out code-0 loss 0.71 with the
    true codes 1..15 against 2.20 with sampled ones, for the stage-4 model on the 276 held-out utterances)."""
    if not which:
        return {}
    talker, cp = model.talker, model.talker.code_predictor
    sub = [batch[b] for b in which]
    x, _, starts, frames = make_batch(model, cfg, sub)
    h = talker.model.forward_train(x, 0.0)
    rows = torch.cat([h[i, L - 1 : L - 1 + len(e.codes)] for i, (e, L) in enumerate(zip(sub, starts, strict=True))])
    code0 = torch.cat([frames[i, L : L + len(e.codes), 0] for i, (e, L) in enumerate(zip(sub, starts, strict=True))])
    drawn = []
    for i in range(0, len(rows), chunk):
        r, c = rows[i : i + chunk, None], code0[i : i + chunk, None]
        cp.model.setup_cache(cp.cfg.num_code_groups, batch=len(r), dtype=r.dtype)
        drawn.append(predict_codes_reference(cp, r, talker.embed_codec(c).to(r.dtype), params, generator))
    drawn = torch.cat(drawn)
    out, at = {}, 0
    for b, e in zip(which, sub, strict=True):
        out[b] = drawn[at : at + len(e.codes)]
        at += len(e.codes)
    return out


def loss_on(model: TTSModel, cfg: TTSConfig, batch: list[Example], dropout: float, cp_fraction: float, rng,
            talker_frozen: bool = False, sampled: float = 0.0, generator: torch.Generator | None = None,
            books: list[torch.Tensor] | None = None):
    """(code-0 loss, codes 1..15 loss) of one batch. With `talker_frozen` the talker runs without dropout or
    gradients (the predictor-only stage) and the code-0 loss is still reported. A share `sampled` of the examples
    (each drawn with that probability) has the talker read codes 1..15 sampled by the model's own predictor
    instead of the true ones (`sampled_residuals`); the predictor still learns the true codes.

    With the codec's codebooks `books`, the codes 1..15 loss is `excess_distortion` instead of cross-entropy,
    on policy: every example's codes 1..15 are drawn by the predictor, the talker reads them (whatever
    `sampled` says) and so do the predictor's own rows."""
    talker = model.talker
    which = [b for b in range(len(batch)) if books is not None or (sampled and rng.random() < sampled)]
    residuals = sampled_residuals(model, cfg, batch, which, generator)
    x, target, starts, frames = make_batch(model, cfg, batch, residuals=residuals)
    with torch.set_grad_enabled(torch.is_grad_enabled() and not talker_frozen):
        h = talker.model.forward_train(x, 0.0 if talker_frozen else dropout)  # [B, S, H]
        logits = talker.codec_head(h)
        l0 = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
    picks = pick_frames(batch, cp_fraction, rng)
    if not picks:
        return l0, torch.zeros(())
    if books is None:
        cp_logits, codes = predictor_logits(model, h, starts, frames, picks, dropout)
        return l0, F.cross_entropy(cp_logits.flatten(0, 1), codes[:, 1:].flatten())
    read = with_residuals(frames, starts, residuals)
    cp_logits, codes = predictor_logits(model, h, starts, frames, picks, dropout, prefix=read)
    bi, ki = picked_rows(picks, starts, h.device)
    return l0, excess_distortion(cp_logits, codes, read[bi, ki], books)


def split_frontend(split: dict) -> str:
    """The phoneme front end a build-data split's `phonemes` were made with (espeak-ng-ipa before teachers)."""
    return split.get("frontend", "espeak-ng-ipa")


def model_texts(split: dict, frontend: str | None = None) -> list[str]:
    """Per sentence, the string the model's tokenizer reads under text front end `frontend` (default: the split's
    own phonemes): the stored phonemes for the front end that made them, `graphemes` of the text, or any other
    front end run on the text now. "" marks a sentence to skip (phonemes that did not come out)."""
    from leapvox.models.frontend import FRONTENDS

    frontend = frontend or split_frontend(split)
    if frontend == split_frontend(split):
        return list(split["phonemes"])
    if frontend not in FRONTENDS:
        raise InputError(f"unknown text front end {frontend!r}", hint=f"one of {', '.join(FRONTENDS)}")
    return [FRONTENDS[frontend](t) for t in split["text"]]


def load_examples(data_dir: Path, split: str, tokenize, max_frames: int = 200,
                  sentences: range | None = None, frontend: str | None = None) -> list[Example]:
    """The utterances of `split`.pt (only those of the sentence indices in `sentences` when given), their text
    through `frontend` (`model_texts`)."""
    from .data import EXCLUDED_SOURCES

    d = torch.load(data_dir / f"{split}.pt", weights_only=False)
    texts = model_texts(d, frontend)
    role = tokenize("<|im_start|>assistant\n")
    out = []
    for u in range(len(d["sentence"])):
        s = int(d["sentence"][u])
        if sentences is not None and s not in sentences:
            continue
        codes = d["codes"][d["offsets"][u] : d["offsets"][u + 1]].long()
        if not texts[s] or len(codes) > max_frames or d["source"][s] in EXCLUDED_SOURCES:
            continue
        out.append(Example(role, tokenize(texts[s]), codes))
    return out


GROWN_STACKS = ("talker.model.layers.", "talker.code_predictor.model.layers.")  # stacks that may gain layers


def load_grown(model: TTSModel, state: dict) -> dict[str, int]:
    """Load `state` into `model`, which may have more talker or code-predictor layers than `state`; those extra
    layers (on top of the stack) get zero output projections (attention o_proj, MLP down_proj), so each is an
    identity on the residual stream and the grown model computes exactly what the smaller one did.
    Returns how many layers were added per stack ("talker", "predictor")."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError:  # shapes differ: another size
        raise InputError("checkpoint does not fit this model: its layers have other shapes",
                         hint="pass the --size it was trained with, or --init its run's export/ folder") from None
    if any(k.startswith(GROWN_STACKS) for k in unexpected):
        raise InputError("the checkpoint has more layers than this model: layers can be added, not removed",
                         hint="leave out --talker-layers / --predictor-layers, or give at least the checkpoint's")
    wrong = [k for k in missing if not k.startswith(GROWN_STACKS)] + list(unexpected)
    if wrong:
        raise ValueError(f"checkpoint does not fit this model: {wrong[:3]} ...")
    added = {}
    stacks = {"talker": model.talker.model.layers, "predictor": model.talker.code_predictor.model.layers}
    for (name, layers), prefix in zip(stacks.items(), GROWN_STACKS, strict=True):
        new_layers = sorted({int(k[len(prefix):].split(".")[0]) for k in missing if k.startswith(prefix)})
        with torch.no_grad():
            for i in new_layers:
                layers[i].self_attn.o_proj.weight.zero_()
                layers[i].mlp.down_proj.weight.zero_()
        added[name] = len(new_layers)
    return added


def lr_factor(step: int, steps: int, warmup: int = 150, floor: float = 0.1, progress: float | None = None) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `floor` of the peak at the last step (or at
    `progress` = 1 when the schedule runs on a time budget)."""
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup) if progress is None else progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


def curriculum_cap(step: int, batch: int = 16) -> int:
    """Longest utterance (frames) a batch may hold: short sentences first, where alignment is easiest to find (a run
    from --init, whose model already reads its text, skips it).
    The thresholds count utterances seen, in steps of 16 (the CPU recipe's batch)."""
    seen = step * batch // 16
    return 60 if seen < 800 else 110 if seen < 2000 else 10_000


def export(model: TTSModel, cfg_dict: dict, tok_dir: Path, codec_dir: Path, out: Path, meta: dict) -> Path:
    """Write the official folder layout (weights in bf16 like the real checkpoints). The folder is written beside
    `out` and swapped in whole, so an interrupted export never leaves a half-written model."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={k: str(v) for k, v in meta.items()})
    (tmp / "model.safetensors").chmod(0o644)  # safetensors writes it owner-only; a model folder is for sharing
    (tmp / "config.json").write_text(json.dumps(cfg_dict, indent=1))
    gen = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
           "subtalker_dosample": True, "subtalker_temperature": 0.8, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
           "max_new_tokens": 2048}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, tmp / f)
    shutil.copytree(codec_dir, tmp / "speech_tokenizer")
    old = out.with_name(out.name + ".old")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    if old.exists():
        shutil.rmtree(old)
    return out


BEST_BY = "l0s+lcp"  # what state.pt's "best" measures (with the distortion objective: "l0s+distortion")
OBJECTIVES = ("ce", "distortion")  # the codes 1..15 loss: cross-entropy, or `excess_distortion`
HELD_OUT_SENTENCES = range(400, 500)  # test sentences for the held-out loss; WER reports use the first 100-300


def train(data_dir: str, out_dir: str, steps: int = 20000, batch: int = 16, lr: float = 1e-3,
          dropout: float = 0.1, cp_fraction: float = 0.25, save_every: int = 500, seed: int = 0,
          threads: int | None = None, size: str = "small", device: str | None = None, log=print,
          part: str = "all", init: str | None = None, predictor_layers: int | None = None,
          talker_layers: int | None = None,
          minutes: float | None = None, extra: bool = True, sampled: float = 0.0, objective: str = "ce",
          frontend: str | None = None) -> Path:
    """Train (or resume) the demo model on `device` (default: CUDA when present, else CPU); returns the export.

    Data: `train.pt`, plus `extra.pt` (build-data --extra) when present and `extra`. The held-out loss is
    measured on the test split's sentences 400-499 (all renditions), never on the sentences WER is reported on
    (a test split that small falls back to its first 64 utterances);
    `out/best/` keeps the export with the lowest held-out loss (code 0 + codes 1..15), `out/export/` the latest.
    On CUDA the forward pass runs under bf16 autocast. `minutes` caps the run's wall time: the cosine schedule
    then follows the elapsed share of it (or of `steps`, whichever is further along), and the run stops, saves
    and exports when either is used up.

    `part="predictor"` is a second stage: the talker's own weights are frozen (no dropout, no gradients) and only
    the code predictor learns, from the code-1..15 loss on `cp_fraction` of the frames. Its code embedding tables
    stay frozen too: the talker reads them for codes 1..15 of past frames, so the talker's input and code-0 loss
    do not move. `init` starts a fresh run (step 0, new optimizer) from another run's state.pt weights, or from a
    model folder (an export, or the bundled demo model), whose config and tokenizer it then keeps; an existing
    out/state.pt still takes precedence (resume).
    With more `predictor_layers` or `talker_layers` than the `init` run had, the extra layers start as identities
    (their output projections zero), so the grown model begins exactly where the smaller one stopped.

    `sampled` is the share of training examples whose talker input carries codes 1..15 drawn by the model's own
    predictor (`loss_on`). The held-out loss is reported both ways (`l0` true codes 1..15, `l0s` sampled, as at
    inference); `best/` is chosen by l0s + lcp.

    `objective="distortion"` trains codes 1..15 by `excess_distortion` (on policy, the predictor reading its own
    draws) instead of cross-entropy; `lcp` then reports that loss.

    `frontend` is the text front end of a new model (written into its config.json): default the data's own
    phonemes (espeak-ng-ipa or hibari-g2p), or `graphemes` (the text itself). A model from `init` keeps its
    config's front end."""
    if part not in ("all", "predictor"):
        raise ValueError(f"part must be 'all' or 'predictor', got {part!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    from leapvox.models.tokenizer import TextTokenizer

    if threads:
        torch.set_num_threads(threads)
    data, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "tokenizer"
    splits = ["train"] + (["extra"] if extra and (data / "extra.pt").is_file() else [])
    init_dir = Path(init) if init and Path(init).is_dir() else None
    # a model folder, or beside another run's state.pt that run's export/: its tokenizer and config (a symbol the
    # tokenizer lacks falls back to byte tokens), so the weights fit whatever --size says
    cfg_src = init_dir or (Path(init).parent / "export" if init else None)
    if cfg_src and (cfg_src / "config.json").is_file():
        tok_dir.mkdir(exist_ok=True)
        for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy(cfg_src / f, tok_dir / f)
        cfg_dict = json.loads((cfg_src / "config.json").read_text())
        if frontend and frontend != cfg_dict.get("leapvox_text_frontend"):
            raise InputError(f"--frontend {frontend} differs from {cfg_src}'s {cfg_dict.get('leapvox_text_frontend')}",
                             hint="a model keeps the front end its tokenizer was made for; train a new one instead")
        if predictor_layers:
            cfg_dict["talker_config"]["code_predictor_config"]["num_hidden_layers"] = predictor_layers
        if talker_layers:
            cfg_dict["talker_config"]["num_hidden_layers"] = talker_layers
        log(f"config and tokenizer from {cfg_src} (--size ignored)")
    else:
        loaded = [torch.load(data / f"{name}.pt", weights_only=False) for name in splits]
        frontend = frontend or split_frontend(loaded[0])
        ids = write_tokenizer(tok_dir, [t for d in loaded for t in model_texts(d, frontend)])
        del loaded
        cfg_dict = demo_config(ids["vocab_size"], ids["special"], ids["assistant"], size, predictor_layers, frontend,
                               talker_layers)
    tokenizer = TextTokenizer(tok_dir)
    frontend = cfg_dict.get("leapvox_text_frontend", "espeak-ng-ipa")
    cfg = TTSConfig.from_dict(cfg_dict)
    torch.manual_seed(seed)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = TTSModel(cfg.talker).to(device)
    books = None
    if objective == "distortion":
        from .codec_fit import load_codec

        books = [b.detach().to(device) for b in load_codec(data / "speech_tokenizer").codebooks]
    examples = [e for name in splits for e in load_examples(data, name, tokenizer, frontend=frontend)]
    held_out = (load_examples(data, "test", tokenizer, sentences=HELD_OUT_SENTENCES, frontend=frontend)
                or load_examples(data, "test", tokenizer, frontend=frontend)[:64])  # small test split (trials)
    frozen = part == "predictor"
    if frozen:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in model.talker.code_predictor.parameters():
            p.requires_grad_(True)
        # the talker reads these tables for codes 1..15 of past frames: learning them would move its input
        for p in model.talker.code_predictor.model.codec_embedding.parameters():
            p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.98),
                            weight_decay=0.01, fused=device.type == "cuda")  # one kernel per step on a GPU
    step, best, elapsed, state = 0, math.inf, 0.0, out / "state.pt"
    best_by = BEST_BY if objective == "ce" else "l0s+distortion"
    if init and not state.is_file():
        if init_dir:
            from safetensors.torch import load_file

            weights = {k: v.float() for k, v in load_file(str(init_dir / "model.safetensors"), str(device)).items()}
        else:
            weights = torch.load(init, weights_only=False, map_location=device)["model"]
        grown = ", ".join(f"{n} new {stack} layers" for stack, n in load_grown(model, weights).items() if n)
        log(f"initialised from {init}" + (f" ({grown} start as identities)" if grown else ""))
    if state.is_file():
        s = torch.load(state, weights_only=False, map_location=device)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, elapsed = s["step"], s.get("elapsed", 0.0)
        # runs saved before best/ was chosen by l0s + lcp kept l0 + lcp, a different scale: start that over
        best = s.get("best", math.inf) if s.get("best_by") == best_by else math.inf
        log(f"resumed at step {step}")
    rng = random.Random(seed + step)
    gen = torch.Generator(device).manual_seed(seed + step)
    examples.sort(key=lambda e: len(e.codes) + len(e.body))
    buckets = [examples[i : i + batch] for i in range(0, len(examples), batch)]
    longest = [max(len(e.codes) for e in b) for b in buckets]
    n_params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"{len(examples)} training utterances ({' + '.join(splits)}), {len(held_out)} held-out, {n_params:,} params "
        f"({trained:,} trained), text front end {frontend}, on {device}")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    budget = minutes * 60 if minutes else None
    t_start, t0 = time.time() - elapsed, time.time()

    def progress() -> float:
        return max(step / steps, (time.time() - t_start) / budget if budget else 0.0)

    while progress() < 1:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr * lr_factor(step, steps, progress=progress() if budget else None)
        cap = curriculum_cap(step, batch) if not init else 10_000  # a model from --init already reads its text
        allowed = [b for b, n in zip(buckets, longest, strict=True) if n <= cap] or buckets
        with autocast:
            l0, lcp = loss_on(model, cfg, rng.choice(allowed), dropout, cp_fraction, rng, frozen, sampled, gen,
                              books)
        opt.zero_grad()
        (lcp if frozen else l0 + lcp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            log(f"step {step}  l0 {l0.item():.3f}  lcp {lcp.item():.3f}  {(time.time() - t0) / 50:.3f} s/step")
            t0 = time.time()
        done = progress() >= 1
        if step % save_every == 0 or done:
            model.eval()
            with torch.no_grad(), autocast:
                v0, vcp = (v.item() for v in loss_on(model, cfg, held_out, 0.0, 1.0, random.Random(0)))
                v0s, vdist = (v.item() for v in loss_on(model, cfg, held_out, 0.0, 1.0 if books else 0.0,
                                                        random.Random(0), sampled=1.0, books=books,
                                                        generator=torch.Generator(device).manual_seed(0)))
            meta = {"step": step, "held_out_l0": round(v0, 4), "held_out_l0_sampled": round(v0s, 4),
                    "held_out_lcp": round(vcp, 4), "predictor_objective": objective}
            note = ""
            if books is not None:  # lcp is the objective's loss (on the same draws as l0s); cross-entropy beside it
                meta["held_out_lcp_ce"], meta["held_out_lcp"], vcp = meta["held_out_lcp"], round(vdist, 4), vdist
                note = f"  (cross-entropy {meta['held_out_lcp_ce']:.3f})"
            improved = v0s + vcp < best
            best = min(best, v0s + vcp)
            log(f"step {step}  held-out l0 {v0:.3f}  l0s {v0s:.3f}  lcp {vcp:.3f}{note}"
                + ("  (best)" if improved else ""))
            tmp = state.with_suffix(".part")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "best": best,
                        "best_by": best_by, "elapsed": time.time() - t_start}, tmp)
            tmp.replace(state)
            export(model, cfg_dict, tok_dir, data / "speech_tokenizer", out / "export", meta)
            if improved:
                export(model, cfg_dict, tok_dir, data / "speech_tokenizer", out / "best", meta)
    return out / "export"
