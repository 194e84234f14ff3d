#!/usr/bin/env bash
# Smoke test of a built bundle, offline:
#
#   bash packaging/smoke.sh dist/leapvox
#
# Runs the bundled executable: --version, models list, doctor (and that w8a8 uses the prebuilt kernels where the
# bundle has them and the CPU runs them), no second copy of torch's libraries, speak a sentence to a WAV (checked:
# 24 kHz mono 16-bit, long enough, not silent), then the TUI in a pseudo-terminal until the model is loaded, and
# quits it with Ctrl+Q. The model is the bundled demo model; without one (models/assets/demo/ not there at build time)
# set LEAPVOX_MODEL to a small checkpoint folder. Needs python3 on the host (WAV check, pseudo-terminal) and, for
# the demo model, espeak-ng. Nothing outside a temporary folder is written; HF_HUB_OFFLINE=1 throughout.
set -euo pipefail

DIST="${1:?usage: smoke.sh DIST (the bundle folder, e.g. dist/leapvox)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXE="$(cd "$DIST" && pwd)/leapvox"
INTERNAL="$(cd "$DIST" && pwd)/_internal"
[ -x "$EXE" ] || { echo "smoke: no executable $EXE (build it: bash packaging/build.sh)" >&2; exit 2; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 LEAPVOX_HOME="$WORK/home" HF_HOME="$WORK/hf"
cd "$WORK"  # the bundle must not lean on the checkout
step() { printf '== smoke: %s\n' "$*" >&2; }
fail() { echo "smoke: FAILED: $*" >&2; exit 1; }
start=$(date +%s)

step "--version"
version="$("$EXE" --version)"
[[ "$version" =~ ^leapvox\ [0-9]+\.[0-9]+ ]] || fail "--version printed '$version'"
echo "$version" >&2

step "models list"
"$EXE" models list | tee "$WORK/models.txt" >&2
grep -q '^demo ' "$WORK/models.txt" || fail "models list has no demo row"
if grep -Eq '^demo +.*\bbundled\b' "$WORK/models.txt" && ! grep -q 'not bundled' "$WORK/models.txt"; then
  MODEL=demo
elif [ -n "${LEAPVOX_MODEL:-}" ]; then
  MODEL="$LEAPVOX_MODEL"
  echo "smoke: this bundle has no demo model; using LEAPVOX_MODEL=$MODEL" >&2
else
  fail "the bundle has no demo model and LEAPVOX_MODEL is not set"
fi

step "doctor --model $MODEL"
"$EXE" doctor --model "$MODEL" > "$WORK/doctor.txt" || { cat "$WORK/doctor.txt" >&2; fail "doctor says speak will not work"; }
cat "$WORK/doctor.txt" >&2
# With prebuilt kernels in the bundle (build.sh on x86-64 Linux) and a CPU that runs them, w8a8 must use them.
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
runs_kernels=1
for f in avx512f avx512bw avx512vl avx512_vnni; do [[ "$flags" == *" $f "* ]] || runs_kernels=0; done
if [ "$runs_kernels" = 1 ] && compgen -G "$INTERNAL/leapvox/engine/fast/kernels/prebuilt/*.so" >/dev/null; then
  grep -q "w8a8 runs on leapvox AVX-512 VNNI kernel (prebuilt" "$WORK/doctor.txt" \
    || fail "the bundle has prebuilt kernels and this CPU runs them, but doctor says w8a8 does not use them"
fi
# ... and the fp32 layer (narrow models such as the demo) on any CPU with AVX2 and FMA.
if [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]] \
    && compgen -G "$INTERNAL/leapvox/engine/fast/kernels/prebuilt/*.so" >/dev/null; then
  grep -q "run on leapvox's compiled fp32 layer (prebuilt)" "$WORK/doctor.txt" \
    || fail "the bundle has prebuilt kernels and this CPU runs them, but doctor says the fp32 layer does not use them"
fi

step "no second copy of torch's libraries"
for lib in "$INTERNAL"/torch/lib/*.so*; do
  [ ! -e "$INTERNAL/$(basename "$lib")" ] || fail "_internal/$(basename "$lib") duplicates torch/lib/$(basename "$lib")"
done

step "speak (offline) -> out.wav"
"$EXE" speak "The quick brown fox jumps over the lazy dog." -o "$WORK/out.wav" --model "$MODEL" --seed 1
python3 - "$WORK/out.wav" <<'PY' || fail "the WAV is not right"
import sys, wave, array
with wave.open(sys.argv[1]) as w:
    rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
    samples = array.array("h", w.readframes(n))
seconds, peak = n / rate, max((abs(s) for s in samples), default=0)
print(f"smoke: out.wav: {rate} Hz, {channels} ch, {8 * width} bit, {seconds:.2f} s, peak {peak}", file=sys.stderr)
assert (rate, channels, width) == (24000, 1, 2), "expected 24 kHz mono 16-bit"
assert seconds >= 0.5, "shorter than half a second"
assert peak > 300, "silent"
PY

step "tui in a pseudo-terminal, quit with Ctrl+Q"
python3 "$HERE/tui_smoke.py" "$EXE" --model "$MODEL" --save-dir "$WORK" || fail "tui"

step "passed in $(( $(date +%s) - start )) s"
