"""`leapvox compare`: the same text, seed and speaker through every available decoding mode.

Writes one WAV per mode, compare.json with the raw numbers, and compare.png when matplotlib is importable.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from leapvox.engine.streaming import StreamStats, stream_speech

COLUMNS = [  # (header, format of one row's value)
    ("mode", lambda s: s.mode),
    ("xRT", lambda s: f"{s.xrt:.2f}"),
    ("tok/call", lambda s: f"{s.tok_per_call:.2f}"),
    ("pred calls/s", lambda s: f"{s.predictor_calls_per_s:.0f}"),
    ("first audio s", lambda s: "-" if s.first_audio_s is None else f"{s.first_audio_s:.2f}"),
    ("KV MB", lambda s: f"{s.kv_mb:.2f}"),
    ("audio s", lambda s: f"{s.audio_s:.2f}"),
]


def run_mode(synth, text: str, opts) -> tuple[np.ndarray, StreamStats]:
    """Stream `text` in one mode; the audio and the final stats record."""
    audio, stats = [], None
    for chunk in stream_speech(synth, text, opts):
        audio.append(chunk.audio)
        stats = chunk.stats
    return np.concatenate(audio), stats


def warm_up(synth, text: str, opts) -> None:
    """A two-frame run so that one-time costs (allocator, kernels) do not land on the first mode measured."""
    for _ in stream_speech(synth, text[:40], replace(opts, max_frames=2)):
        pass


def table(rows: list[StreamStats]) -> str:
    cells = [[h for h, _ in COLUMNS]] + [[fmt(s) for _, fmt in COLUMNS] for s in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    return "\n".join(lines)


def plot(rows: list[StreamStats], path: Path) -> bool:
    """A bar chart of xRT and first-audio time per mode; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = [s.mode for s in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.bar(modes, [s.xrt for s in rows])
    a.set_title("xRT (audio s / wall s, higher is faster)")
    b.bar(modes, [s.first_audio_s or 0.0 for s in rows])
    b.set_title("first audio (s)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def compare(model, text: str, opts, modes: tuple[str, ...], out_dir: Path) -> dict:
    """Run every mode, write the WAVs, JSON and plot; returns the JSON record."""
    from leapvox.app.audio import write_wav
    from leapvox.models.files import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    synth = model.synthesizer()
    warm_up(synth, text, opts)
    rows, record = [], {"text": text, "model": str(model.path), "seed": opts.seed, "speaker": opts.speaker,
                        "language": opts.language, "modes": {}}
    for mode in modes:
        audio, stats = run_mode(synth, text, replace(opts, mode=mode))
        wav = write_wav(out_dir / f"{mode}.wav", audio, model.sample_rate)
        rows.append(stats)
        record["modes"][mode] = {**stats.as_dict(), "wav": wav.name}
    record["plot"] = "compare.png" if plot(rows, out_dir / "compare.png") else None
    write_text_atomic(out_dir / "compare.json", json.dumps(record, indent=2) + "\n")
    record["table"] = table(rows)
    return record
