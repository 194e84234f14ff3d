"""Developer benchmark: full-size random-weight checkpoints and the CPU speed figures of every mode and weight format.

Run from the repository root: `python -m tests.benchmarks.bench --help` (the user-facing `leapvox bench` measures
a real model through the speaking path only). Not a test module: pytest collects nothing from this folder.

A checkpoint of the 0.6B or 1.7B architecture is written once, in the official on-disk layout (config.json,
model.safetensors in bf16, a byte-level text tokenizer whose special tokens sit at the official ids, and
speech_tokenizer/ with the codec decoder), under leapvox's data folder; the official package loads the same
folder (`--vs-official`, with `--reference-python` or $LEAPVOX_REFERENCE_PYTHON). Random weights make the timings
real and the speech noise: spec mode's acceptance on such a model says nothing, so its cost side (verify call vs ar
call per tree size N) is what carries over.

Measured per weight format, each in a fresh worker process (clean peak memory), back to back in one run:
  - memory bandwidth (a large sum: read-only, like weights) -> the floor of a call = bytes of weights it reads /
    bandwidth; a call's time over its floor is the "floor ratio"
  - talker step, code-predictor ar call and verify call over N = 4..64 draft nodes, codec decode per frame
  - end to end per mode (ar, spec, windowed), streaming as `leapvox speak --play` does: xRT, time to first
    audio, per-frame stage times and the rest (overhead), per-step talker latency
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from leapvox.models.recipes.bpe import byte_symbols, tokenizer_files
from leapvox.models.recipes.geometry import SIZES, SPEECH_TOKENIZER, model_config  # noqa: F401 (re-exported)

BENCH_VERSION = 1  # bump when the checkpoint recipe changes: cached checkpoints are rebuilt
TREE_SIZES = (4, 8, 16, 32, 64)
MODES = ("ar", "spec", "windowed")
TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again "
    "before the sun goes down."
)

GENERATION_CONFIG = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}
FEATURE_EXTRACTOR = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}
PROCESSOR = {
    "padding_side": "left",
    "padding_value": 0.0,
    "processor_class": "Qwen3TTSProcessor",
    "return_attention_mask": True,
}


def bench_root() -> Path:
    from leapvox.models.hub import leapvox_dirs

    return leapvox_dirs()["data"] / "bench"


# ---- the checkpoint ------------------------------------------------------------------------------------------


SPECIAL_NAMES = {
    "im_start_token_id": "<|im_start|>",
    "im_end_token_id": "<|im_end|>",
    "tts_pad_token_id": "<tts_pad>",
    "tts_bos_token_id": "<tts_text_bos>",
    "tts_eos_token_id": "<tts_text_eod>",
}


def text_tokenizer_files(cfg: dict) -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json of a byte-level tokenizer for `cfg`: one token per byte,
    "assistant" one token at assistant_token_id (the official prompt slicing counts on it), and the special
    tokens at their config ids, as a contiguous block of added tokens after the vocabulary, led by
    <|endoftext|> (as in Qwen's own vocabulary, where it is id 151643)."""
    specials = {cfg[k]: name for k, name in SPECIAL_NAMES.items()}
    first, last = min(specials) - 1, max(specials)
    specials[first] = "<|endoftext|>"
    size = cfg["talker_config"]["text_vocab_size"]
    if first < 300 or last >= size or not 256 < cfg["assistant_token_id"] < first:
        raise ValueError("the text token ids leave no room for a byte-level vocabulary (need ids >= 300)")
    alphabet = byte_symbols()
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    word, merges, pieces = "assistant", [], []
    left = word[0]
    for ch in word[1:]:
        merges.append((left, ch))
        left += ch
        pieces.append(left)
    free = (i for i in range(256, first) if i != cfg["assistant_token_id"])
    for piece in pieces[:-1]:
        vocab[piece] = next(free)
    vocab[word] = cfg["assistant_token_id"]
    taken = set(vocab.values())
    for i in range(256, first):
        if i not in taken:
            vocab[f"<|unused_{i}|>"] = i
    added = {}
    for i in range(first, last + 1):
        name = specials.get(i, f"<|extra_{i}|>")
        added[str(i)] = {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [v["content"] for v in added.values()],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": added[str(first)]["content"],
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return tokenizer_files(vocab, merges, tok_cfg, indent=1)


def random_state(module: torch.nn.Module, dtype: torch.dtype, seed: int, head_gain: float = 2.5) -> dict:
    """Random tensors for every entry of `module`'s state dict (module may live on the meta device): linear and
    conv weights N(0, 1/fan_in), output heads N(0, gain^2/fan_in) (logits with a spread of a few units),
    embeddings and codebook sums N(0, 1), norms and usage counts 1, biases and other vectors 0."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, ref in module.state_dict().items():
        shape = tuple(ref.shape)
        if not ref.is_floating_point():
            out[name] = torch.zeros(shape, dtype=ref.dtype)
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "cluster_usage" or (len(shape) == 1 and ("norm" in name or leaf == "weight")):
            t = torch.ones(shape, dtype=dtype)
        elif len(shape) == 1 or leaf == "bias":
            t = torch.zeros(shape, dtype=dtype)
        elif "embedding" in name:
            t = torch.empty(shape, dtype=dtype).normal_(0, 1.0, generator=g)
        else:
            fan_in = max(1, ref.numel() // shape[0])
            gain = head_gain if ("lm_head" in name or "codec_head" in name) else 1.0
            t = torch.empty(shape, dtype=dtype).normal_(0, gain / fan_in**0.5, generator=g)
        out[name] = t.contiguous()
    return out


def build_checkpoint(folder: Path, cfg: dict, codec_cfg: dict | None = None, say=None) -> Path:
    """Write a random-weight CustomVoice checkpoint folder for `cfg` (config.json dict) in the official layout.
    Reuses a finished one (marked by bench.json with this recipe version); writes to a temp folder first."""
    from safetensors.torch import save_file

    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.codec import CodecConfig, CodecDecoder
    from leapvox.engine.nets.talker import TTSModel

    folder = Path(folder)
    codec_cfg = codec_cfg or SPEECH_TOKENIZER
    marker = folder / "bench.json"
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("version") == BENCH_VERSION:
                return folder
        except ValueError:
            pass
    tmp = folder.with_name(folder.name + ".part")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    (tmp / "speech_tokenizer").mkdir(parents=True)
    (say or (lambda m: None))(f"building a random-weight checkpoint in {folder} (once)")
    with torch.device("meta"):
        tts = TTSModel(TTSConfig.from_dict(cfg).talker)
        codec = CodecDecoder(CodecConfig.from_dict(codec_cfg))
    save_file(random_state(tts, torch.bfloat16, seed=0), str(tmp / "model.safetensors"))
    codec_state = {"decoder." + k: v for k, v in random_state(codec, torch.float32, seed=1).items()}
    save_file(codec_state, str(tmp / "speech_tokenizer" / "model.safetensors"))
    del tts, codec, codec_state
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=1))
    (tmp / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    for name, text in text_tokenizer_files(cfg).items():
        (tmp / name).write_text(text, encoding="utf-8")
    (tmp / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_cfg, indent=1))
    (tmp / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps(FEATURE_EXTRACTOR, indent=1))
    (tmp / "bench.json").write_text(json.dumps({"version": BENCH_VERSION, "random_weights": True}))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def checkpoint_for(size: str, say=None) -> Path:
    """The cached random-weight checkpoint of the official `size` architecture, built on first use."""
    return build_checkpoint(bench_root() / f"random-{size}", model_config(size), say=say)


# ---- measurements ----------------------------------------------------------------------------------------------


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _summary(times: list[float]) -> dict:
    """Median and minimum, in ms. On a shared machine the minimum is the best estimate of the undisturbed cost."""
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "n": len(times)}


def bandwidth(mbytes: int = 256, repeats: int = 5) -> dict:
    """Memory read bandwidth (GB/s) of a large fp32 sum, and copy bandwidth (read + write bytes) of a memcpy."""
    n = mbytes * 2**20 // 4
    a = torch.ones(n)
    b = torch.empty_like(a)
    a.sum()
    b.copy_(a)
    read = min(_timed(lambda: a.sum(), repeats))
    copy_ = min(_timed(lambda: b.copy_(a), repeats))
    return {"read_gb_s": a.numel() * 4 / read / 1e9, "copy_gb_s": 2 * a.numel() * 4 / copy_ / 1e9, "mbytes": mbytes}


def rss_mb() -> dict:
    """Resident memory now and the process's peak so far (MiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    now = None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {"rss_mb": now, "peak_rss_mb": peak}


@torch.inference_mode()
def talker_step_times(talker, frames: int, prompt: int = 48) -> list[float]:
    """Seconds of each of `frames` consecutive talker steps (full cache) after a `prompt`-row prefill."""
    from leapvox.engine.caches import FullCache

    g = torch.Generator().manual_seed(0)
    dtype = talker.model.norm.weight.dtype
    cache = FullCache(talker, prompt, frames + 1)
    h = talker.cfg.hidden_size
    cache.prefill(torch.randn(1, prompt, h, generator=g).to(dtype))
    x = torch.randn(1, 1, h, generator=g).to(dtype)
    times = []
    for k in range(frames):
        t0 = time.perf_counter()
        cache.step(x, k)
        times.append(time.perf_counter() - t0)
    return times


@torch.inference_mode()
def predictor_call_times(cp, sizes=TREE_SIZES, repeats: int = 5, prefix: int = 8) -> dict:
    """Per call, after `prefix` cached rows: an ar call (1 row + its head) through the hot loop
    (engine.predictor) and through the predictor's modules ("module", the generic path), and verify calls over
    N draft nodes (N+1 rows under a tree mask, one head), all timed back to back round-robin."""
    from leapvox.engine.fast.predictor import PredictorLoop

    hc = cp.cfg.hidden_size
    dtype = cp.model.norm.weight.dtype
    cp.model.setup_cache(prefix + max(sizes) + 2)
    loop = PredictorLoop(cp)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, prefix, hc, generator=g).to(dtype)
    cp.model(x0, 0)
    loop.hidden(x0[0], 0)
    rows = {n: torch.randn(1, n + 1, hc, generator=g).to(dtype) for n in (0, *sizes)}
    masks = {n: torch.ones(n + 1, prefix + n + 1, dtype=torch.bool) if n else None for n in rows}
    head = cp.lm_head[0]
    calls = {"fast": lambda: loop.heads[0](loop.hidden(rows[0][0], prefix))}
    for n in rows:
        calls[n] = lambda n=n: head(cp.model(rows[n], prefix, masks[n])[:, -1])
    times: dict = {name: [] for name in calls}
    for i in range(repeats + 1):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            if i:
                times[name].append(time.perf_counter() - t0)
    return {
        "ar": _summary(times["fast"]),
        "ar_module": _summary(times[0]),
        "verify": {str(n): _summary(times[n]) for n in sizes},
    }


@torch.inference_mode()
def predictor_frame_times(cp, params, frames: int, module_loop: bool = False) -> list[float]:
    """Seconds of the whole 15-code ar loop (calls, sampling, embeddings) per frame, on random inputs: the hot loop
    leapvox runs (`predict_codes`), or with `module_loop` the plain loop over the predictor's modules."""
    from leapvox.engine.fast.predictor import predict_codes, predict_codes_reference

    g = torch.Generator().manual_seed(0)
    dtype = cp.model.norm.weight.dtype
    th = cp.model.codec_embedding[0].weight.shape[1]
    cp.model.setup_cache(cp.cfg.num_code_groups)
    h, e = torch.randn(1, 1, th, generator=g).to(dtype), torch.randn(1, 1, th, generator=g).to(dtype)
    run = predict_codes_reference if module_loop else predict_codes
    run(cp, h, e, params, g)
    return _timed(lambda: run(cp, h, e, params, g), frames)


@torch.inference_mode()
def codec_frame_times(synth, frames: int, repeats: int) -> list[float]:
    """Seconds per frame of the codec decoding `frames` random frames in one go (official chunking)."""
    g = torch.Generator().manual_seed(0)
    vp = synth.tts.talker.code_predictor.cfg.vocab_size
    codes = torch.cat(
        [torch.randint(0, 2048, (frames, 1), generator=g), torch.randint(0, min(vp, 2048), (frames, 15), generator=g)],
        dim=1,
    )
    return [t / frames for t in _timed(lambda: synth.decode(codes), repeats)]


def end_to_end(synth, opts, text: str = TEXT) -> dict:
    """One utterance streamed as `speak --play` does (a first chunk of FIRST_CHUNK_FRAMES, doubling up to 16,
    through the streaming codec): xRT, time to first audio, per-frame stage times, per-step talker latency."""
    from leapvox.engine.decode import DecodeStats
    from leapvox.engine.streaming import FIRST_CHUNK_FRAMES, MAX_CHUNK_FRAMES

    try:
        from leapvox.engine.memory import return_freed_memory
    except ImportError:  # a leapvox before engine.memory
        return_freed_memory = None
    stats, warnings = DecodeStats(), []
    codec = synth.codec.stream(official_chunking=True)
    size, pending, samples, first = FIRST_CHUNK_FRAMES, [], 0, None
    t0 = time.perf_counter()

    def push(frames):
        nonlocal samples, first
        t = time.perf_counter()
        with torch.inference_mode():
            wav = codec.push(torch.stack(frames).T[None].to(synth.codec_device))
        if return_freed_memory is not None:  # as Synthesizer.stream does after each chunk
            return_freed_memory()
        codec_s[0] += time.perf_counter() - t
        samples += wav.numel()
        if first is None and wav.numel():
            first = time.perf_counter() - t0

    codec_s = [0.0]
    try:
        steps = synth.frames(text, opts)  # steps: a frame (none on the last) and the utterance's stats
    except TypeError:  # a leapvox before steps: frames, filling the `stats` passed in
        from types import SimpleNamespace

        steps = (SimpleNamespace(frame=f, stats=stats) for f in synth.frames(text, opts, stats, warnings))
    for step in steps:
        stats = step.stats
        if step.frame is None:
            break
        pending.append(step.frame)
        if len(pending) >= size:
            push(pending)
            pending, size = [], min(2 * size, MAX_CHUNK_FRAMES)
    if pending:
        push(pending)
    stats.codec_s += codec_s[0]
    elapsed = time.perf_counter() - t0
    n = max(stats.frames, 1)
    audio_s = samples / synth.sample_rate
    stage = {"talker": stats.talker_s / n, "predictor": stats.predictor_s / n, "codec": stats.codec_s / n}
    out = {
        "frames": stats.frames,
        "stop_reason": stats.stop_reason,
        "audio_s": audio_s,
        "elapsed_s": elapsed,
        "xrt": audio_s / elapsed if elapsed > 0 else 0.0,
        "first_audio_s": first,
        "prefill_ms": 1e3 * stats.prefill_s,
        "talker_ms_per_frame": 1e3 * stage["talker"],
        "predictor_ms_per_frame": 1e3 * stage["predictor"],
        "codec_ms_per_frame": 1e3 * stage["codec"],
        "overhead_ms_per_frame": 1e3 * max(0.0, (elapsed - stats.prefill_s) / n - sum(stage.values())),
        "predictor_calls_per_frame": stats.predictor_calls / n,
        "step_ms": list(stats.step_ms),
    }
    if stats.spec is not None:
        out["tokens_per_call"] = stats.spec.tokens_per_call
    return out


def measure_format(
    folder: Path, weights: str, frames: int, repeats: int, modes=MODES, window: int | None = None
) -> dict:
    """Everything for one weight format of the checkpoint in `folder` (run it in a fresh process for a clean peak
    memory figure). Windowed mode attends to `window` frames (default `bench_window(frames)`)."""
    from dataclasses import replace

    from leapvox.engine.fast.quant import linear_weight_bytes
    from leapvox.models.load import load_model

    t0 = time.perf_counter()
    model = load_model(folder, weights=weights)
    load_s = time.perf_counter() - t0
    mem_loaded = rss_mb()
    bw = bandwidth()
    talker, cp = model.tts.talker, model.tts.talker.code_predictor
    synth = model.synthesizer()
    talker_bytes = linear_weight_bytes(talker.model) + linear_weight_bytes(talker.codec_head)
    call_bytes = linear_weight_bytes(cp.model) + linear_weight_bytes(cp.lm_head[0])
    steps = [t for _ in range(repeats) for t in talker_step_times(talker, frames)]
    calls = predictor_call_times(cp, repeats=max(3, repeats * 3))
    loop = [t for _ in range(repeats) for t in predictor_frame_times(cp, model.defaults.predictor, frames)]
    slow = [
        t
        for _ in range(repeats)
        for t in predictor_frame_times(cp, model.defaults.predictor, max(2, frames // 3), module_loop=True)
    ]
    codec = codec_frame_times(synth, frames, repeats)
    bps = bw["read_gb_s"] * 1e9
    out = {
        "weights": weights,
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "bandwidth": bw,
        "talker_step": {**_summary(steps), "bytes": talker_bytes, "floor_ms": 1e3 * talker_bytes / bps},
        "predictor_call": {**calls["ar"], "bytes": call_bytes, "floor_ms": 1e3 * call_bytes / bps},
        "predictor_call_module": {**calls["ar_module"], "bytes": call_bytes, "floor_ms": 1e3 * call_bytes / bps},
        "verify": calls["verify"],
        "predictor_frame": _summary(loop),
        "predictor_frame_module": _summary(slow),
        "codec_frame": _summary(codec),
        "memory_after_load": mem_loaded,
        "modes": {},
    }
    for rec in (out["talker_step"], out["predictor_call"], out["predictor_call_module"]):
        rec["floor_ratio"] = rec["min_ms"] / rec["floor_ms"]
    for frame, call in (("predictor_frame", "predictor_call"), ("predictor_frame_module", "predictor_call_module")):
        out[frame]["overhead_ms"] = out[frame]["min_ms"] - 15 * out[call]["min_ms"]
        out[frame]["floor_ratio"] = out[frame]["min_ms"] / (15 * out[call]["floor_ms"])
    window = window or bench_window(frames)
    opts = replace(model.defaults, max_frames=frames, seed=0, runaway_guard=False, window=window)
    for mode in modes:
        runs = [end_to_end(synth, replace(opts, mode=mode)) for _ in range(repeats)]
        best = max(runs, key=lambda r: r["xrt"])
        best["xrt_runs"] = [r["xrt"] for r in runs]
        if mode == "windowed":
            best["window"] = window
        out["modes"][mode] = best
    out["memory_peak"] = rss_mb()
    return out


def bench_window(frames: int) -> int:
    """Windowed mode's window in the benchmark: half the frames (at most the default), so that it slides."""
    from leapvox.engine.options import DEFAULT_WINDOW

    return max(1, min(DEFAULT_WINDOW, frames // 2))


def _worker_main(argv: list[str]) -> int:
    """bench.py --worker FOLDER WEIGHTS FRAMES REPEATS MODES WINDOW -> one JSON line on stdout."""
    folder, weights, frames, repeats, modes, window = argv
    out = measure_format(
        Path(folder), weights, int(frames), int(repeats), tuple(m for m in modes.split(",") if m), int(window)
    )
    print(json.dumps(out))
    if Path(folder).resolve().parent == bench_root().resolve():  # our own random checkpoint, never a user's folder
        with contextlib.suppress(OSError):  # a run cut short leaves what it measured
            (Path(folder) / f"last-{weights}.json").write_text(json.dumps(out))
    return 0


def run_format(
    folder: Path, weights: str, frames: int, repeats: int, modes, isolate: bool = True, window: int | None = None
) -> dict:
    """measure_format, in a fresh Python process when `isolate` (same interpreter and thread settings)."""
    window = window or bench_window(frames)
    if not isolate:
        return measure_format(folder, weights, frames, repeats, modes, window)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),  # by path: runs from any folder, imports only leapvox and the standard library
        "--worker",
        str(folder),
        weights,
        str(frames),
        str(repeats),
        ",".join(modes),
        str(window),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the {weights} benchmark worker failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- fidelity ------------------------------------------------------------------------------------------------


@torch.inference_mode()
def code_agreement(ref, other, text: str = TEXT, frames: int = 25, seed: int = 0) -> dict:
    """How often `other` picks the code `ref` picks (two LoadedModels of one checkpoint, e.g. fp32 and int8).

    `ref` speaks `text` (seeded sampling, at most `frames` frames); both models are then teacher-forced on those
    frames and, at each of the 16 codes of every frame, pick a code from their own logits: greedily (argmax), and
    by sampling with the same random draw (the same Gumbel noise added to both models' temperature / top-k / top-p
    processed logits). Code 0 has the control ids suppressed as in decoding; the repetition penalty is left out.
    Also the largest logit difference relative to the spread of `ref`'s logits."""
    from dataclasses import replace

    from leapvox.engine.sampling import suppress_mask_for, temperature_top_k_top_p
    from leapvox.models.recipes.spec import predictor_hidden, teacher_forced_frames

    opts = replace(ref.defaults, max_frames=frames, seed=seed, runaway_guard=False)
    codes, _, _ = ref.synthesizer().generate_codes(text, opts)
    if len(codes) == 0:
        return {"frames": 0}
    logits = []
    for m in (ref, other):
        fr = teacher_forced_frames(m.synthesizer(), text, codes, opts)
        talker, cp = m.tts.talker, m.tts.talker.code_predictor
        c0 = talker.codec_head(fr.hidden).float()  # [F, V]
        hid = predictor_hidden(cp, fr)  # [F, 16, Hc]
        rest = torch.stack([cp.lm_head[j](hid[:, j + 1]).float() for j in range(cp.num_heads)], dim=1)
        logits.append((c0, rest))
    tc = ref.config.talker
    mask = suppress_mask_for(tc.vocab_size, tc.suppressed_ids, tc.codec_eos_token_id)
    g = torch.Generator().manual_seed(seed)
    out = {"frames": len(codes)}
    for name, i, params in (("code0", 0, opts.talker), ("codes1_15", 1, opts.predictor)):
        a, b = logits[0][i], logits[1][i]
        if i == 0:
            a, b = a.masked_fill(mask, float("-inf")), b.masked_fill(mask, float("-inf"))
        finite = torch.isfinite(a)
        spread = a[finite].std()
        out[f"{name}_max_logit_diff_rel"] = float((a - b)[finite].abs().max() / spread)
        out[f"{name}_greedy_agreement"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
        noise = -torch.log(-torch.log(torch.rand(a.shape, generator=g).clamp_min(1e-20)))
        pa = temperature_top_k_top_p(a.flatten(0, -2), params).view_as(a) + noise
        pb = temperature_top_k_top_p(b.flatten(0, -2), params).view_as(b) + noise
        out[f"{name}_sampled_agreement"] = float((pa.argmax(-1) == pb.argmax(-1)).float().mean())
    return out


# ---- the official implementation -------------------------------------------------------------------------------

# The python of a virtualenv with the official qwen-tts package (tests/reference/README.md): --reference-python, or
# $LEAPVOX_REFERENCE_PYTHON. None: not given, the official side is skipped with one line saying how to give it.
REFERENCE_PYTHON: Path | None = (
    Path(os.environ["LEAPVOX_REFERENCE_PYTHON"]) if os.environ.get("LEAPVOX_REFERENCE_PYTHON") else None
)


def official_available() -> str | None:
    """None when the official package can be run, else why not (one line)."""
    if REFERENCE_PYTHON is None:
        return (
            "no reference virtualenv given (pass --reference-python PATH/bin/python or set LEAPVOX_REFERENCE_PYTHON "
            "to the python of a virtualenv with the official qwen-tts, see tests/reference/README.md); "
            "skipping the official side"
        )
    if not REFERENCE_PYTHON.is_file():
        return (
            f"no reference virtualenv at {REFERENCE_PYTHON} (set LEAPVOX_REFERENCE_PYTHON, or see "
            "tests/reference/README.md); skipping the official side"
        )
    return None


def run_official(folder: Path, dtype: str, frames: int, repeats: int, text: str = TEXT, timeout: float = 3600) -> dict:
    """Run tests/benchmarks/bench_official.py in the reference virtualenv on `folder`; its JSON result."""
    script = Path(__file__).with_name("bench_official.py")
    stubs = Path(__file__).resolve().parents[1] / "reference" / "stubs"
    env = dict(os.environ, PYTHONPATH=str(stubs))
    cmd = [str(REFERENCE_PYTHON), str(script), str(folder), dtype, str(frames), str(repeats), text]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the official {dtype} run failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- report ----------------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    """The per-format, per-mode table (and the official side with ratios when present)."""
    lines = []
    fmts = result["formats"]
    bw = next(iter(fmts.values()))["bandwidth"]["read_gb_s"] if fmts else 0.0
    lines.append(
        f"{result['model']}  {result['frames']} frames, {result['repeats']} repeat(s), "
        f"{result['threads']} threads, read bandwidth {bw:.1f} GB/s; times are the minimum over repeats"
    )
    head = f"{'per 80 ms frame':<34}" + "".join(f"{w:>18}" for w in fmts)
    off = result.get("official", {})
    head += "".join(f"{'official ' + d:>16}" for d in off)
    lines.append(head)

    def row(label, get, fmt="{:.1f}", official=None):
        cells = []
        for rec in fmts.values():
            try:
                cells.append(fmt.format(get(rec)))
            except (KeyError, TypeError):
                cells.append("-")
        line = f"{label:<34}" + "".join(f"{c:>18}" for c in cells)
        if official:
            for rec in off.values():
                try:
                    line += f"{fmt.format(official(rec)):>16}"
                except (KeyError, TypeError):
                    line += f"{'-':>16}"
        lines.append(line)

    row("talker step ms", lambda r: r["talker_step"]["min_ms"], official=lambda o: o["talker_step_ms"])
    row("  floor ms (bytes / bandwidth)", lambda r: r["talker_step"]["floor_ms"])
    row("  x floor", lambda r: r["talker_step"]["floor_ratio"], "{:.2f}")
    row(
        "predictor call ms (ar)",
        lambda r: r["predictor_call"]["min_ms"],
        "{:.2f}",
        official=lambda o: o["predictor_call_ms"],
    )
    row("  floor ms", lambda r: r["predictor_call"]["floor_ms"], "{:.2f}")
    row(
        "  x floor",
        lambda r: r["predictor_call"]["floor_ratio"],
        "{:.2f}",
        official=lambda o: o["predictor_call_ms"] / o["predictor_call_floor_ms"],
    )
    row(
        "  module path ms (x floor)",
        lambda r: (r["predictor_call_module"]["min_ms"], r["predictor_call_module"]["floor_ratio"]),
        "{0[0]:.2f} ({0[1]:.2f})",
    )
    row(
        "predictor 15-code loop ms",
        lambda r: r["predictor_frame"]["min_ms"],
        official=lambda o: o["predictor_frame_ms"],
    )
    row("  x floor (15 calls)", lambda r: r["predictor_frame"]["floor_ratio"], "{:.2f}")
    row(
        "  module loop ms (x floor)",
        lambda r: (r["predictor_frame_module"]["min_ms"], r["predictor_frame_module"]["floor_ratio"]),
        "{0[0]:.1f} ({0[1]:.2f})",
    )
    row(
        "  overhead beyond 15 calls ms",
        lambda r: r["predictor_frame"]["overhead_ms"],
        official=lambda o: o["predictor_overhead_ms"],
    )
    for n in TREE_SIZES:
        row(
            f"verify N={n} ms (x ar call)",
            lambda r, n=n: (
                r["verify"][str(n)]["min_ms"],
                r["verify"][str(n)]["min_ms"] / r["predictor_call"]["min_ms"],
            ),
            "{0[0]:.1f} ({0[1]:.1f})",
        )
    row("codec decode ms / frame", lambda r: r["codec_frame"]["min_ms"], official=lambda o: o["codec_ms_per_frame"])
    for mode in result["modes"]:
        row(
            f"{mode}: xRT",
            lambda r, m=mode: r["modes"][m]["xrt"],
            "{:.3f}",
            official=(lambda o: o["xrt"]) if mode == "ar" else None,
        )
        row(
            f"{mode}: first audio s",
            lambda r, m=mode: r["modes"][m]["first_audio_s"],
            "{:.2f}",
            official=(lambda o: o["first_frame_s"]) if mode == "ar" else None,
        )
        row(
            f"{mode}: talker/pred/codec/other ms",
            lambda r, m=mode: r["modes"][m],
            "{0[talker_ms_per_frame]:.0f}/{0[predictor_ms_per_frame]:.0f}/{0[codec_ms_per_frame]:.0f}/"
            "{0[overhead_ms_per_frame]:.0f}",
        )
        if mode == "spec":
            row("spec: tokens per call", lambda r: r["modes"]["spec"]["tokens_per_call"], "{:.2f}")
    row("peak RSS MiB", lambda r: r["memory_peak"]["peak_rss_mb"], "{:.0f}", official=lambda o: o["peak_rss_mb"])
    fid = result.get("fidelity") or {}
    if fid:
        lines.append("")
        lines.append("fidelity vs fp32 (teacher-forced on fp32's codes; share of codes picked alike):")
        lines.append(
            f"{'format':<8}{'code0 greedy':>14}{'code0 same draw':>17}{'1..15 greedy':>14}"
            f"{'1..15 same draw':>17}{'max dlogit/std':>16}"
        )
        for w, f in fid.items():
            if not f.get("frames"):
                continue
            lines.append(
                f"{w:<8}{f['code0_greedy_agreement']:>14.3f}{f['code0_sampled_agreement']:>17.3f}"
                f"{f['codes1_15_greedy_agreement']:>14.3f}{f['codes1_15_sampled_agreement']:>17.3f}"
                f"{max(f['code0_max_logit_diff_rel'], f['codes1_15_max_logit_diff_rel']):>16.3f}"
            )
    if result.get("ratios"):
        lines.append("")
        lines.append("leapvox (fastest mode and format) vs official, same run:")
        for k, v in result["ratios"].items():
            lines.append(f"  {k}: {v:.2f}x")
    return "\n".join(lines)


def ratios(result: dict) -> dict:
    """xRT of leapvox's fastest mode and format over the official xRT per official dtype, and per-stage ratios."""
    off = result.get("official") or {}
    best = max(
        ((w, m, rec["modes"][m]["xrt"]) for w, rec in result["formats"].items() for m in rec["modes"]),
        key=lambda t: t[2],
        default=None,
    )
    out = {}
    if best is None:
        return out
    for d, o in off.items():
        if o.get("xrt"):
            out[f"xRT {best[0]} {best[1]} / official {d}"] = best[2] / o["xrt"]
        same = result["formats"].get(d)
        if same and o.get("talker_step_ms"):
            out[f"talker step: official {d} / leapvox {d}"] = o["talker_step_ms"] / same["talker_step"]["min_ms"]
        if same and o.get("predictor_frame_ms"):
            out[f"predictor per frame: official {d} / leapvox {d} ar"] = (
                o["predictor_frame_ms"] / same["predictor_frame"]["min_ms"]
            )
    return out


def tree_speedup(result: dict, acceptance: list[list[float]] | None = None) -> dict:
    """Per weight format and tree size N: the verify call's cost over an ar call, and (with a rank-acceptance table
    from `leapvox recipe tree`, acceptance[depth][rank]) the expected tokens per call of the greedy tree of N
    nodes over whole 15-code frames and the resulting inner-loop speedup over ar, tokens per call / cost (the
    paper's Fig. 4 for this CPU). Random weights say nothing about acceptance, so without a table only the cost
    side is filled."""
    from leapvox.models.recipes.spec import expected_tokens_per_call, grow_tree

    out = {}
    for w, rec in result["formats"].items():
        ar = rec["predictor_call"]["min_ms"]
        rows = {}
        for n in TREE_SIZES:
            row = {"cost": rec["verify"][str(n)]["min_ms"] / ar}
            if acceptance:
                row["tokens_per_call"] = expected_tokens_per_call(grow_tree(acceptance, n), acceptance)
                row["speedup"] = row["tokens_per_call"] / row["cost"]
            rows[str(n)] = row
        out[w] = rows
    return out


def read_acceptance(path: Path) -> list[list[float]]:
    """The rank-acceptance table [depth][rank] of a `recipe tree` JSON (its tree file or its --json output)."""
    data = json.loads(Path(path).read_text())
    table = data.get("rank_acceptance") if isinstance(data, dict) else data
    if not (isinstance(table, list) and table and all(isinstance(r, list) and r for r in table)):
        raise ValueError(f"{path} holds no rank_acceptance table (write one with leapvox recipe tree --json)")
    return [[float(v) for v in r] for r in table]


def plot(result: dict, path: Path) -> list[Path]:
    """Two PNGs beside `path` (STEM-tree.png, STEM-steps.png): the spec trade-off vs draft tree size N (the verify
    call's cost over an ar call and, when the result holds an acceptance table, the speedup); the talker step's
    latency vs frames generated, ar vs windowed. Empty when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    tree = result.get("tree") or tree_speedup(result)
    with_speedup = any("speedup" in r for rows in tree.values() for r in rows.values())
    fig, axes = plt.subplots(1, 2 if with_speedup else 1, figsize=(9 if with_speedup else 5, 3.4), squeeze=False)
    ax = axes[0][0]
    for w, rows in tree.items():
        ax.plot(TREE_SIZES, [rows[str(n)]["cost"] for n in TREE_SIZES], marker="o", label=w)
    ax.set_title("verify call over N drafts / ar call", fontsize=9)
    ax.set_ylabel("cost (x ar call)")
    if with_speedup:
        ax = axes[0][1]
        for w, rows in tree.items():
            ax.plot(TREE_SIZES, [rows[str(n)]["speedup"] for n in TREE_SIZES], marker="o", label=w)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(
            f"speedup = tokens per call / cost ({result.get('acceptance_from', 'given acceptance')})", fontsize=8
        )
        ax.set_ylabel("predictor speedup over ar")
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(TREE_SIZES, [str(n) for n in TREE_SIZES])
        ax.set_xlabel("draft tree size N")
        ax.legend(fontsize=7)
    fig.suptitle(f"spec mode on this CPU ({result['threads']} threads)", fontsize=9)
    fig.tight_layout()
    written = [path.with_name(path.stem + "-tree.png")]
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for w, rec in result["formats"].items():
        for mode, style in (("ar", "-"), ("windowed", "--")):
            run = rec["modes"].get(mode, {})
            if run.get("step_ms"):
                label = f"{mode} {w}" + (f" (W={run['window']})" if "window" in run else "")
                ax.plot(range(1, len(run["step_ms"]) + 1), run["step_ms"], style, label=label)
    ax.set_xlabel("frames generated")
    ax.set_ylabel("talker step (ms)")
    ax.set_title("per-step talker latency, ar vs windowed", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(path.with_name(path.stem + "-steps.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def run_bench(
    folder: Path,
    weights,
    modes,
    frames: int,
    repeats: int,
    official: bool = False,
    isolate: bool = True,
    say=None,
    official_frames: int | None = None,
    fidelity: bool = True,
    window: int | None = None,
    acceptance: Path | None = None,
) -> dict:
    """The whole benchmark on the checkpoint in `folder`: every weight format (each in its own process when
    `isolate`), then the official package on the same folder when asked and available. `acceptance`: a
    `recipe tree` JSON whose rank-acceptance table turns the verify costs into speedups (`tree_speedup`)."""
    say = say or (lambda m: None)
    table_ = read_acceptance(acceptance) if acceptance else None
    result = {
        "model": str(folder),
        "frames": frames,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "modes": list(modes),
        "formats": {},
        "torch": torch.__version__,
        "window": window or bench_window(frames),
    }
    for w in weights:
        say(f"leapvox {w}: measuring")
        result["formats"][w] = run_format(folder, w, frames, repeats, modes, isolate, window)
    if table_:
        result["acceptance_from"] = Path(acceptance).name
    result["tree"] = tree_speedup(result, table_)
    if fidelity and "fp32" in weights and len(weights) > 1:
        from leapvox.models.load import load_model

        say("fidelity: teacher-forced code agreement with fp32")
        ref = load_model(folder, weights="fp32")
        result["fidelity"] = {}
        for w in weights:
            if w != "fp32":
                result["fidelity"][w] = code_agreement(ref, load_model(folder, weights=w), frames=frames)
        del ref
    if official:
        why = official_available()
        if why:
            say(why)
            result["official_skipped"] = why
        else:
            result["official"] = {}
            for d in [w for w in weights if w in ("fp32", "bf16")] or ["fp32"]:
                say(f"official {d}: measuring")
                try:
                    o = result["official"][d] = run_official(folder, d, official_frames or frames, repeats)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    say(f"official {d}: {e}")
                    continue
                if d in result["formats"]:  # the same weight bytes read per call: the same floor
                    o["predictor_call_floor_ms"] = result["formats"][d]["predictor_call"]["floor_ms"]
        result["ratios"] = ratios(result)
    return result


# ---- command line ----------------------------------------------------------------------------------------------

WEIGHTS = ("fp32", "bf16", "int8")


def _parser():
    import argparse

    b = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench",
        description="Build (once, in leapvox's data folder) a random-weight checkpoint of the official architecture "
        "and measure per frame the talker step, code-predictor calls (ar and verify at N = 4..64), codec decode, "
        "overheads, xRT, time to first audio, peak memory and each call's time over its memory-bandwidth floor.",
    )
    b.add_argument("--model-size", choices=list(SIZES), default="0.6b", help="architecture (default 0.6b)")
    b.add_argument("--model", type=Path, help="benchmark this checkpoint folder instead of a random-weight one")
    b.add_argument("--weights", default=",".join(WEIGHTS), help="comma-separated weight formats (default all)")
    b.add_argument("--modes", default=",".join(MODES), help="comma-separated decoding modes (default all)")
    b.add_argument("--frames", type=int, default=25, help="frames per utterance and per timing series (default 25)")
    b.add_argument("--repeats", type=int, default=3, help="repetitions; the minimum time is reported (default 3)")
    b.add_argument(
        "--vs-official",
        action="store_true",
        help="also run the official qwen-tts on the same checkpoint (needs the reference virtualenv)",
    )
    b.add_argument(
        "--reference-python",
        type=Path,
        help="python of the virtualenv with the official qwen-tts (default $LEAPVOX_REFERENCE_PYTHON)",
    )
    b.add_argument("--threads", type=int, help="torch threads, here and in every worker (default: torch's own choice)")
    b.add_argument("--window", type=int, help="windowed mode's window in frames (default half of --frames, <= 48)")
    b.add_argument(
        "--acceptance",
        type=Path,
        help="a `recipe tree` JSON (rank acceptance): turns verify costs into the speedup-vs-N curve",
    )
    b.add_argument("--json", type=Path, default=Path("bench.json"), help="where to write the raw numbers")
    b.add_argument("--no-plots", action="store_true", help="do not write the PNG plots")
    return b


class _Usage(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message + (f" (hint: {hint})" if hint else ""))


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise _Usage(f"unknown {what} {bad[0] if bad else '(none)'!r}", hint=f"choose from {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    """The developer benchmark's command line: table on stdout, JSON (and PNG plots) beside --json. Exit 2 on bad
    usage, with the reason on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1:])
    from leapvox.engine.errors import LeapvoxError

    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except _Usage as e:
        print(f"bench: error: {e}", file=sys.stderr, flush=True)
        return 2
    except LeapvoxError as e:  # a checkpoint folder that does not load, a worker that failed
        print(f"bench: error: {e}", file=sys.stderr, flush=True)
        return 1


def _run(args) -> int:
    global REFERENCE_PYTHON

    from leapvox.engine.fast.quant import WEIGHT_FORMATS

    weights = _list(args.weights, WEIGHT_FORMATS, "weight format")  # default: WEIGHTS; any format the loader takes
    modes = _list(args.modes, MODES, "mode")
    if args.frames < 2 or args.repeats < 1:
        raise _Usage("--frames must be >= 2 and --repeats >= 1")
    if args.json.parent and not args.json.expanduser().parent.is_dir():
        raise _Usage(f"cannot write {args.json}: its folder does not exist")
    if (args.threads is not None and args.threads < 1) or (args.window is not None and args.window < 1):
        raise _Usage("--threads and --window must be >= 1")
    if args.acceptance is not None and not args.acceptance.is_file():
        raise _Usage(f"no acceptance file {args.acceptance}", hint="write one with leapvox recipe tree --json")
    if args.acceptance is not None:
        try:
            read_acceptance(args.acceptance)
        except ValueError as e:  # also a file that is not JSON
            raise _Usage(str(e), hint="write one with leapvox recipe tree --json") from None
    if args.reference_python is not None:
        REFERENCE_PYTHON = args.reference_python

    def say(msg: str) -> None:
        print(f"bench: {msg}", file=sys.stderr, flush=True)

    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers and the official run start with it
        torch.set_num_threads(args.threads)
    from leapvox.models.files import write_text_atomic

    if args.model is not None:
        from leapvox.models.checkpoint import check_folder

        folder = check_folder(args.model)
    else:
        folder = checkpoint_for(args.model_size, say=say)
    result = run_bench(
        folder,
        weights,
        modes,
        args.frames,
        args.repeats,
        official=args.vs_official,
        say=say,
        window=args.window,
        acceptance=args.acceptance,
    )
    print(table(result))
    write_text_atomic(args.json, json.dumps(result, indent=1))
    plots = [] if args.no_plots else plot(result, args.json)
    say(f"wrote {args.json}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
