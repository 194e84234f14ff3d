"""Long-form benchmark: one text of >= 10 minutes of speech through `leapvox speak`'s path (the synthesis stream
into a WAV written as it arrives), per mode, each in its own process so the peak RSS is that mode's.

    python3 -m tests.benchmarks.longform --model demo --modes ar,windowed --json tests/benchmarks/longform-demo.json

Prints a table (audio minutes, wall seconds, xRT, first audio, peak RSS) and writes the JSON. Speed on a shared
machine is noisy: read it with the load average it prints; the peak RSS is what shows bounded memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SENTENCES = [
    "The river rose slowly through the night, and by morning the low fields were silver with water.",
    "Nobody in the village could remember a spring like it, not even the oldest fisherman on the quay.",
    "She packed the lamps, the bread and the blue coat, and then she sat down to wait for the boat.",
    "When the bell rang at noon, the children ran out into the square to watch the barges go by.",
    "A long letter arrived from the city, full of news about trains, theatres and crowded markets.",
    "He read it twice by the window, folded it carefully, and put it away in the drawer with the maps.",
    "By evening the wind had turned, the clouds broke apart, and a thin line of gold lit the hills.",
    "Tomorrow, they said, the roads would open again and the post would come through as it always had.",
]

CHILD = r"""
import json, resource, sys, time
from dataclasses import replace
from leapvox.app.audio import WavWriter
from leapvox.models.load import load_model
model_name, weights, mode, text_file, out = sys.argv[1:6]
t0 = time.perf_counter()
m = load_model(model_name, weights)
load_s = time.perf_counter() - t0
opts = replace(m.defaults, mode=mode, seed=0)
w = WavWriter(out, m.sample_rate)
for chunk in m.synthesizer().stream(open(text_file, encoding="utf-8").read(), opts):
    w.write(chunk.audio)
    s = chunk.stats
w.close()
print(json.dumps({"mode": mode, "weights": weights, "sentences": s.sentences, "frames": s.frames,
                  "audio_s": s.audio_s, "elapsed_s": s.elapsed_s, "xrt": s.xrt, "first_audio_s": s.first_audio_s,
                  "load_s": load_s, "stop_reasons": {r: s.stop_reasons.count(r) for r in set(s.stop_reasons)},
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo")
    p.add_argument("--weights", default="int8")
    p.add_argument("--modes", default="ar,windowed")
    p.add_argument("--chars", type=int, default=12_000, help="text length (default 12,000: ~11 min on the demo)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    text, i = [], 0
    while sum(len(s) + 1 for s in text) < args.chars:
        text.append(SENTENCES[i % len(SENTENCES)])
        i += 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "text.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(" ".join(text))
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, args.weights, mode, src,
                                  os.path.join(tmp, f"{mode}.wav")], capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            rows[-1]["load_average"] = os.getloadavg()
            print(f"{mode}: done", file=sys.stderr, flush=True)
    print(f"{'mode':<9} {'weights':<7} {'sentences':>9} {'audio min':>9} {'wall s':>8} {'xRT':>6} "
          f"{'first s':>7} {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['mode']:<9} {r['weights']:<7} {r['sentences']:>9} {r['audio_s'] / 60:9.1f} {r['elapsed_s']:8.1f} "
              f"{r['xrt']:6.2f} {r['first_audio_s']:7.2f} {r['peak_rss_mib']:12.0f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"chars": len(" ".join(text)), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
