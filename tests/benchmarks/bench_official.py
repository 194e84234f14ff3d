"""The official side of `python -m tests.benchmarks.bench --vs-official`: run in the reference virtualenv
(qwen-tts 0.1.1, transformers 4.57.3; its python given by --reference-python or $LEAPVOX_REFERENCE_PYTHON), never
imported by leapvox.

    PYTHONPATH=tests/reference/stubs $LEAPVOX_REFERENCE_PYTHON tests/benchmarks/bench_official.py FOLDER fp32|bf16 \
        FRAMES REPEATS TEXT

Loads FOLDER with the official loader, speaks TEXT with the official sampling defaults for at most FRAMES frames,
REPEATS times after a short warm-up, and prints one JSON line: the talker step (its decoder stack's forward, the
prefill left out), the code predictor's forward calls and its per-frame generate() (so the overhead of the generic
generation machinery), the codec decode per frame, xRT, the time to the first complete frame and peak memory.
Times are the minimum over repeats (medians within a run), as on the leapvox side.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time


def main(argv: list[str]) -> int:
    folder, dtype, frames, repeats, text = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    import torch
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel

    kwargs = {"dtype": torch.bfloat16} if dtype == "bf16" else {}
    t0 = time.perf_counter()
    tts = Qwen3TTSModel.from_pretrained(folder, **kwargs)
    load_s = time.perf_counter() - t0
    model = tts.model
    talker = model.talker
    log: dict[str, list] = {"backbone": [], "call": [], "generate": [], "decode": []}
    clock: dict[str, float] = {}

    def pre(name):
        def hook(module, args, kwargs):
            clock[name] = time.perf_counter()
            x = kwargs.get("inputs_embeds")
            clock[name + "_rows"] = x.shape[1] if x is not None else 1

        return hook

    def post(name):
        def hook(module, args, kwargs, output):
            log[name].append((clock[name + "_rows"], time.perf_counter() - clock[name]))

        return hook

    talker.model.register_forward_pre_hook(pre("backbone"), with_kwargs=True)
    talker.model.register_forward_hook(post("backbone"), with_kwargs=True)
    talker.code_predictor.register_forward_pre_hook(pre("call"), with_kwargs=True)
    talker.code_predictor.register_forward_hook(post("call"), with_kwargs=True)
    generate = talker.code_predictor.generate
    decode = model.speech_tokenizer.decode
    start = {"t": 0.0, "first": None}

    def timed_generate(*a, **k):
        t = time.perf_counter()
        out = generate(*a, **k)
        now = time.perf_counter()
        log["generate"].append((1, now - t))
        if start["first"] is None:
            start["first"] = now - start["t"]
        return out

    def timed_decode(*a, **k):
        t = time.perf_counter()
        out = decode(*a, **k)
        log["decode"].append((1, time.perf_counter() - t))
        return out

    talker.code_predictor.generate = timed_generate
    model.speech_tokenizer.decode = timed_decode
    speaker = sorted(model.config.talker_config.spk_id)[0]
    sampling = dict(
        do_sample=True,
        top_k=50,
        top_p=1.0,
        temperature=0.9,
        repetition_penalty=1.05,
        subtalker_dosample=True,
        subtalker_top_k=50,
        subtalker_top_p=1.0,
        subtalker_temperature=0.9,
    )

    def speak(n):
        for v in log.values():
            v.clear()
        start["first"] = None
        torch.manual_seed(0)
        start["t"] = time.perf_counter()
        wavs, sr = tts.generate_custom_voice(
            text=text, speaker=speaker, language="english", max_new_tokens=n + 1, **sampling
        )
        elapsed = time.perf_counter() - start["t"]
        steps = [t for rows, t in log["backbone"] if rows == 1]
        calls = [t for _, t in log["call"]]
        gens = [t for _, t in log["generate"]]
        nframes = max(len(gens), 1)
        audio_s = len(wavs[0]) / sr
        return {
            "frames": len(gens),
            "audio_s": audio_s,
            "elapsed_s": elapsed,
            "xrt": audio_s / elapsed,
            "first_frame_s": start["first"],
            "talker_step_ms": 1e3 * statistics.median(steps) if steps else None,
            "predictor_call_ms": 1e3 * statistics.median(calls) if calls else None,
            "predictor_frame_ms": 1e3 * statistics.median(gens) if gens else None,
            "codec_ms_per_frame": 1e3 * sum(t for _, t in log["decode"]) / nframes,
        }

    speak(2)  # warm-up
    runs = [speak(frames) for _ in range(repeats)]
    out = {"dtype": dtype, "load_s": load_s, "threads": torch.get_num_threads(), "runs": runs}
    for key in ("talker_step_ms", "predictor_call_ms", "predictor_frame_ms", "codec_ms_per_frame", "first_frame_s"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = min(values) if values else None
    out["xrt"] = max(r["xrt"] for r in runs)
    out["frames"] = runs[0]["frames"]
    if out["predictor_frame_ms"] is not None and out["predictor_call_ms"] is not None:
        out["predictor_overhead_ms"] = out["predictor_frame_ms"] - 15 * out["predictor_call_ms"]
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
