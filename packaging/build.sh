#!/usr/bin/env bash
# Build the standalone leapvox bundle: dist/leapvox/ (run dist/leapvox/leapvox). Linux x86-64 and macOS arm64.
#
#   bash packaging/build.sh            # from anywhere; the bundle lands in <repo>/dist/leapvox
#
# One command: it makes an isolated build environment (<repo>/build/bundle-venv, recreated each time), installs the
# CPU build of torch, leapvox itself (a normal, non-editable install of this checkout) and PyInstaller into it,
# builds leapvox's CPU kernels into it (x86-64 Linux; needs a C++ compiler here, not on the machines that run the
# bundle), then runs packaging/leapvox.spec. coremltools goes in on macOS only.
#
# Environment:
#   PYTHON               the Python to build with (default python3; >= 3.10). The bundle uses this Python version.
#   LEAPVOX_TORCH_INDEX  where to get torch. Linux default: https://download.pytorch.org/whl/cpu (PyPI's Linux
#                        torch is the multi-GB CUDA build). "pip" = whatever pip is configured with (pip.conf,
#                        PIP_INDEX_URL, PIP_FIND_LINKS), for mirrors and offline wheel folders. macOS default: "pip"
#                        (PyPI's macOS wheels are CPU/MPS only).
#   LEAPVOX_BUILD_VENV   the build environment's folder (default <repo>/build/bundle-venv).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PY="${PYTHON:-python3}"
VENV="${LEAPVOX_BUILD_VENV:-$REPO/build/bundle-venv}"
TORCH_VERSION="2.13.0"
PYINSTALLER_VERSION="6.22.3"

case "$(uname -s)" in
  Linux) default_index="https://download.pytorch.org/whl/cpu"; extras="" ;;
  Darwin) default_index="pip"; extras="[coreml]" ;;
  *) echo "build.sh: unsupported system $(uname -s) (Linux or macOS)" >&2; exit 2 ;;
esac
TORCH_INDEX="${LEAPVOX_TORCH_INDEX:-$default_index}"

step() { printf '\n== %s\n' "$*" >&2; }
start=$(date +%s)

step "build environment: $VENV ($("$PY" --version 2>&1))"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "build.sh: needs Python >= 3.10" >&2; exit 2; }
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

step "torch $TORCH_VERSION (CPU) from ${TORCH_INDEX}"
if [ "$TORCH_INDEX" = "pip" ]; then
  "$VPY" -m pip install -q "torch==$TORCH_VERSION"
else
  "$VPY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX"
fi
"$VPY" -W ignore - <<'PY'
import sys, torch
if torch.version.cuda is not None:
    sys.exit(f"build.sh: torch {torch.__version__} is a CUDA build; the bundle wants the CPU build "
             "(set LEAPVOX_TORCH_INDEX to a CPU wheel index)")
print(f"torch {torch.__version__}: CPU build", file=sys.stderr)
PY

step "leapvox$extras and PyInstaller $PYINSTALLER_VERSION"
# torch is already satisfied; a constraint keeps pip from replacing it with another build.
echo "torch==$TORCH_VERSION" > "$VENV/constraints.txt"
"$VPY" -m pip install -q "$REPO$extras" "pyinstaller==$PYINSTALLER_VERSION" -c "$VENV/constraints.txt"
if [ ! -f "$REPO/models/assets/demo/config.json" ]; then
  echo "build.sh: note: models/assets/demo/ is not there; the bundle will have no demo model (speak needs --model)" >&2
fi
command -v espeak-ng >/dev/null || echo "build.sh: note: espeak-ng is not installed here; the demo model needs it" \
  "at run time (it is a separate program, never bundled)" >&2

if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  # The bundle has no compiler or torch headers to build leapvox's CPU kernels where it runs: build them here (a
  # C++ compiler on this machine; not its CPU features) into the installed package, which the spec collects.
  step "leapvox's CPU kernels, prebuilt for the bundle"
  "$VPY" -m leapvox.engine.fast.kernels prebuild >&2 \
    || echo "build.sh: note: the bundle will run w8a8 on torch's kernels (about 1.6x slower), offer no w4a8 and run" \
            "the demo's layers op by op" >&2
fi

step "PyInstaller (one-folder bundle)"
rm -rf "$REPO/dist/leapvox"
(cd "$REPO" && "$VENV/bin/pyinstaller" --noconfirm --clean --log-level WARN \
  --distpath "$REPO/dist" --workpath "$REPO/build/pyinstaller" "$HERE/leapvox.spec")

if [ "$(uname -s)" = Linux ] && command -v strip >/dev/null; then
  # torch's own libraries carry ~100 MB of symbols. Only these: stripping auditwheel-patched libraries (numpy's
  # OpenBLAS) breaks them, which is why the spec does not strip everything.
  step "strip torch's shared libraries"
  strip --strip-unneeded "$REPO"/dist/leapvox/_internal/torch/lib/lib*.so*
fi

step "done in $(( $(date +%s) - start )) s: $REPO/dist/leapvox ($(du -sh "$REPO/dist/leapvox" | cut -f1))"
echo "try: $REPO/dist/leapvox/leapvox doctor; test it: bash packaging/smoke.sh dist/leapvox" >&2
