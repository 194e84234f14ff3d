"""Frames per text token of the demo model on ordinary sentences (ar, default sampling, 2 seeds): the data behind
its runaway-guard rate (`leapvox_guard_frames_per_token` in models/assets/demo/config.json).

    python3 -m tests.benchmarks.guard_rate tests/benchmarks/guard-sentences.txt \
        > tests/benchmarks/guard-demo-frames-per-token.json
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace

from leapvox.engine.options import validate
from leapvox.engine.prompt import build_prompt
from leapvox.models.load import load_model


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    m = load_model("demo", "int8")
    synth = m.synthesizer()
    rows = []
    for s in sentences:
        opts = validate(replace(m.defaults, seed=0), m.config)
        prompt = build_prompt(m.tts.talker, m.config, synth.text_ids(s), opts.speaker, "auto")
        for seed in range(2):
            codes, stats, _ = synth.generate_codes(s, replace(m.defaults, seed=seed, max_frames=300))
            rows.append({"text": s, "tokens": prompt.n_text_tokens, "frames": len(codes), "stop": stats.stop_reason,
                         "seed": seed})
            print(rows[-1], file=sys.stderr, flush=True)
    r = [x["frames"] / x["tokens"] for x in rows if x["stop"] == "eos"]
    print(json.dumps({"n": len(rows), "eos": len(r), "mean": statistics.mean(r), "max": max(r), "min": min(r),
                      "p95": sorted(r)[int(0.95 * len(r))], "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1])
