#!/usr/bin/env bash
# Train demo-model candidates side by side on one CUDA GPU from a packed dataset, within a wall-time budget.
#
#   bash models/recipes/demo/train_on_gpu.sh PACK OUT MINUTES [RUN ...]
#
# PACK: `python -m leapvox.models.recipes.demo.pack --no-codec DATA PACK` (the codec is the bundled demo model's);
# OUT: gets one log per run and each run's best export (lowest held-out loss; model.safetensors, config and
# tokenizer files, no speech_tokenizer/) as a tar cut into pieces of at most 15 MB: RUN.tar.00, RUN.tar.01, ...
# (reassemble with `cat RUN.tar.* | tar -x`). RUN: name:size:batch:lr:dropout[:sampled[:objective[:talker_layers]]]
# (default: two runs, below; sampled = --sampled-residuals, default 0; objective = --predictor-objective, ce or
# distortion, default ce; talker_layers = --talker-layers, e.g. 8 to grow an INIT model's 4-layer talker).
# Needs torch with CUDA, safetensors, transformers; leapvox is imported from this checkout (no install).
# DEVICE=cpu runs the same on the CPU (a dry run of the script); INIT=FOLDER starts every run from that model
# folder (e.g. models/assets/demo: its config and tokenizer too, so the size field is then ignored).
# FRONTEND=graphemes|hibari-g2p|espeak-ng-ipa sets a new model's text front end (default: the data's phonemes).
# Hibari data (build-data --teacher hibari) has its own codec: pack it with the codec (no --no-codec).
set -euo pipefail
pack=$1 out=$2 minutes=$3
shift 3
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(medium:medium:64:8e-4:0.15 wide:wide:64:1e-3:0.1)
device=${DEVICE:-cuda}
root=$(cd "$(dirname "$0")/../../.." && pwd)
work=${TMPDIR:-/tmp}/leapvox_gpu
rm -rf "$work"
mkdir -p "$work/pkg/leapvox" "$out"
for d in app engine models; do ln -s "$root/$d" "$work/pkg/leapvox/$d"; done
export PYTHONPATH=$work/pkg PYTHONUNBUFFERED=1
python3 -m leapvox.models.recipes.demo.pack --unpack --codec "$root/models/assets/demo/speech_tokenizer" "$pack" "$work/data"
python3 - "$work/data" <<'EOF'
# the tokenizer must split phonemes here exactly as on the CPU that will run the model: the byte-level BPE gives
# each IPA code point one token, so check that on every distinct symbol
import sys, tempfile, torch
from pathlib import Path
from leapvox.models.recipes.demo.tokenizer_files import write_tokenizer
from leapvox.models.tokenizer import TextTokenizer
ph = [p for n in ("train", "extra") for p in torch.load(f"{sys.argv[1]}/{n}.pt", weights_only=False)["phonemes"]]
with tempfile.TemporaryDirectory() as d:
    write_tokenizer(Path(d), ph)
    tok = TextTokenizer(Path(d))
    symbols = sorted({c for p in ph for c in p})
    bad = [c for c in symbols if len(tok(c)) != 1]
    print(f"{len(symbols)} phoneme symbols, {len(bad)} not single tokens", flush=True)
    assert not bad, bad
    print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no CUDA)",
          flush=True)
EOF
pids=()
for r in "${runs[@]}"; do
  IFS=: read -r name size batch lr dropout sampled objective talker_layers <<<"$r"
  python3 -m leapvox.app.cli recipe demo train --data "$work/data" --out "$work/$name" --size "$size" --batch "$batch" \
    --lr "$lr" --dropout "$dropout" --cp-fraction 1.0 --steps 1000000 --minutes "$minutes" --save-every 400 \
    --sampled-residuals "${sampled:-0}" --predictor-objective "${objective:-ce}" --threads 4 --device "$device" ${INIT:+--init "$INIT"} \
    ${FRONTEND:+--frontend "$FRONTEND"} ${talker_layers:+--talker-layers "$talker_layers"} >"$out/$name.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for r in "${runs[@]}"; do
  name=${r%%:*}
  [ -d "$work/$name/best" ] || continue
  tar -C "$work/$name/best" --exclude speech_tokenizer -cf - . | split -b 15000000 -d - "$out/$name.tar."
done
ls -la "$out"
exit $status
