"""The peers' side of `python -m tests.benchmarks.peers`: one timed synthesis per process, run with the python of the
peer's own virtualenv (standard library and numpy only, plus the peer's package; never leapvox):

    VENV/bin/python tests/benchmarks/peers_workers.py vox|qwentts '{"model": ..., "text": ..., "frames": 32, ...}'

Loads the converted model with the given threads, speaks a short warm-up (4 frames), then the text once for exactly
`frames` frames (seed after seed until a run is not cut short by EOS), streaming, and prints one JSON line: frames,
audio seconds, wall seconds of the synthesis call, time to the first audio chunk, and per-frame talker / code
predictor / codec milliseconds from the peer's own profile output (vox: VOX_PROFILE's line on stderr; qwentts.cpp:
its [Perf] log lines). Peak memory is taken by the parent (ru_maxrss of this process).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time

SAMPLES_PER_FRAME = 1920
SAMPLE_RATE = 24000
SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)


# ---- vox-tts -------------------------------------------------------------------------------------------------------

# "[vox profile] frames=32  prefill(130 tok)=0.21s  talker=1.20s (37 ms/frame)  predictor=3.5s (110 ms/frame)
#  decoder warm-up=0.01s  decoder=2.70s (84 ms/frame)"
_VOX_PROFILE = re.compile(
    r"frames=(\d+)\s+prefill\((\d+) tok\)=([\d.]+)s\s+talker=([\d.]+)s.*?predictor=([\d.]+)s.*?"
    r"decoder warm-up=([\d.]+)s\s+decoder=([\d.]+)s"
)


def _stderr_capture():
    """Redirect fd 2 into a temp file (the native library prints its profile there); returns (file, restore)."""
    sys.stderr.flush()
    saved = os.dup(2)
    tmp = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (closed by restore())
    os.dup2(tmp.fileno(), 2)

    def restore() -> str:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
        tmp.close()
        sys.stderr.write(text)  # keep it visible to the parent
        return text

    return restore


def vox_worker(a: dict) -> dict:
    os.environ.setdefault("VOX_PROFILE", "1")
    os.environ.setdefault("VOX_DEBUG_NO_EOS", "1")  # vox's own switch: the talker never picks EOS
    import vox

    t0 = time.perf_counter()
    engine = vox.Engine(a["model"], device="cpu", threads=a["threads"])
    load_s = time.perf_counter() - t0
    voice = engine.speaker_voice(a["speaker"])
    params = dict(
        SAMPLING,
        sub_temperature=0.9,
        sub_top_k=50,
        sub_top_p=1.0,
        language=a["language"],
    )

    def speak(frames: int, seed: int) -> dict:
        restore = _stderr_capture()
        first, samples = None, 0
        try:
            t = time.perf_counter()
            for chunk in engine.stream(a["text"], voice, max_frames=frames, seed=seed, **params):
                if first is None and len(chunk):
                    first = time.perf_counter() - t
                samples += len(chunk)
            elapsed = time.perf_counter() - t
        finally:
            log = restore()
        runs = _VOX_PROFILE.findall(log)
        out = {"samples": samples, "elapsed_s": elapsed, "first_audio_s": first, "seed": seed}
        if runs:
            fr, _, prefill, talker, pred, warm, dec = runs[-1]
            n = max(int(fr), 1)
            out.update(
                frames=int(fr),
                prefill_ms=1e3 * float(prefill),
                talker_ms=1e3 * float(talker) / n,
                predictor_ms=1e3 * float(pred) / n,
                codec_ms=1e3 * (float(dec) + float(warm)) / n,
            )
        else:
            out["frames"] = round(samples / SAMPLES_PER_FRAME)
            out["note"] = "no VOX_PROFILE line: stages not separated"
        return out

    speak(4, 1000)  # warm-up
    return _exact(speak, a, load_s, {"threads": a["threads"], "stats": _safe(lambda: engine.stats().get("backend"))})


# ---- qwentts.cpp (realtimetts-qwen-native-cpu) ---------------------------------------------------------------------

_PERF = {
    "talker": re.compile(r"\[Perf\] TalkerDecode ([\d.]+) ms \((\d+) frames"),
    "predictor": re.compile(r"\[Perf\] CodePredictor ([\d.]+) ms"),
    "codec": re.compile(r"\[Perf\] CodecDecode ([\d.]+) ms"),
    "prefill": re.compile(r"\[Perf\] Prefill ([\d.]+) ms"),
    "generated": re.compile(r"\[Pipeline\] Generat(?:ed|ion done :) (\d+) frames"),
    "eos": re.compile(r"\[Pipeline\] EOS at step (\d+)"),
}


def qwentts_worker(a: dict) -> dict:
    from qwentts_cpp_cpu import QwenTTS

    lines: list[str] = []
    t0 = time.perf_counter()
    tts = QwenTTS(a["talker"], a["codec"], cpu_threads=a["threads"])
    load_s = time.perf_counter() - t0
    tts.set_log_callback(lambda level, text: lines.append(str(text)))

    def speak(frames: int, seed: int) -> dict:
        del lines[:]
        first, samples = None, 0
        t = time.perf_counter()
        for chunk, _sr in tts.stream(
            text=a["text"],
            lang=a["language"],
            speaker=a["speaker"],
            seed=seed,
            max_new_tokens=frames,
            subtalker_temperature=0.9,
            subtalker_top_k=50,
            subtalker_top_p=1.0,
            **SAMPLING,
        ):
            if first is None and len(chunk):
                first = time.perf_counter() - t
            samples += len(chunk)
        elapsed = time.perf_counter() - t
        log = "\n".join(lines)
        sys.stderr.write(log + "\n")
        out = {"samples": samples, "elapsed_s": elapsed, "first_audio_s": first, "seed": seed}
        found = {k: rx.findall(log) for k, rx in _PERF.items()}
        n = int(found["talker"][-1][1]) if found["talker"] else round(samples / SAMPLES_PER_FRAME)
        out["frames"] = n
        if found["eos"]:
            out["eos"] = True
        if found["talker"]:
            out["talker_ms"] = float(found["talker"][-1][0]) / max(n, 1)
        if found["predictor"]:
            out["predictor_ms"] = float(found["predictor"][-1]) / max(n, 1)
        if found["codec"]:
            out["codec_ms"] = sum(float(v) for v in found["codec"]) / max(n, 1)
        if found["prefill"]:
            out["prefill_ms"] = float(found["prefill"][-1])
        if not found["talker"]:
            out["note"] = "no [Perf] lines: stages not separated"
        return out

    speak(4, 1000)  # warm-up
    return _exact(speak, a, load_s, {"threads": a["threads"]})


# ---- common ----------------------------------------------------------------------------------------------------------


def _safe(fn):
    try:
        return fn()
    except Exception as e:  # stats are extra information, never a reason to lose the run
        return {"error": str(e)}


def _exact(speak, a: dict, load_s: float, extra: dict) -> dict:
    """Speak for exactly a["frames"] frames: seeds a["seed"], +1, ... until a run is not cut short by EOS."""
    tries = []
    for k in range(a.get("tries", 5)):
        run = speak(a["frames"], a["seed"] + k)
        tries.append(run["seed"])
        if run["frames"] >= a["frames"] and not run.get("eos"):
            break
    run["audio_s"] = run["samples"] / SAMPLE_RATE
    run["xrt"] = run["audio_s"] / run["elapsed_s"] if run["elapsed_s"] > 0 else 0.0
    run["seeds_tried"] = tries
    run["load_s"] = load_s
    run.update(extra)
    return run


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("vox", "qwentts"):
        print("usage: peers_workers.py vox|qwentts JSON", file=sys.stderr)
        return 2
    a = json.loads(argv[1])
    out = (vox_worker if argv[0] == "vox" else qwentts_worker)(a)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
