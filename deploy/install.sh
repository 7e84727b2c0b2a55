#!/usr/bin/env bash
# Install radcaliper into a virtual environment (default .venv) with its development tools and
# the optional Ray engine of `radcaliper batch` (its tests need it; RADCALIPER_EXTRAS=dev leaves
# Ray out, and the rest of the suite passes without it).
#
#   deploy/install.sh            # CPU machine: pins the CPU build of torch first (no CUDA wheels)
#   RADCALIPER_GPU=1 deploy/install.sh   # force a normal (CUDA) torch install
#
# On a machine without an NVIDIA GPU, torch==${RADCALIPER_TORCH_VERSION:-2.13.0} is installed
# *before* radcaliper so that pip never resolves torch to a CUDA build. Where no local CPU wheel
# is available, set RADCALIPER_TORCH_INDEX to a CPU wheel index (e.g. PyTorch's /whl/cpu).
# The step is skipped when pyproject.toml has not changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=${RADCALIPER_TORCH_VERSION:-2.13.0}
STAMP="$VENV/.radcaliper-install"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
want="$( (sha256sum pyproject.toml deploy/install.sh; echo "${RADCALIPER_EXTRAS:-dev,ray}") | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

"$PY" -m pip install -q --upgrade pip

gpu=${RADCALIPER_GPU:-}
if [ -z "$gpu" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
fi
if [ -z "$gpu" ]; then
  have=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  case "$have" in
    "$TORCH_VERSION"*) ;;
    *)
      echo "install: no GPU found; installing the CPU build torch==$TORCH_VERSION" >&2
      if [ -n "${RADCALIPER_TORCH_INDEX:-}" ]; then
        "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$RADCALIPER_TORCH_INDEX"
      else
        "$PY" -m pip install -q "torch==$TORCH_VERSION"
      fi
      ;;
  esac
fi

"$PY" -m pip install -q -e ".[${RADCALIPER_EXTRAS:-dev,ray}]"

if [ -z "$gpu" ] && "$PY" -m pip list 2>/dev/null | grep -qiE '^nvidia-|^triton '; then
  echo "install: CUDA packages were pulled on a machine without a GPU; see README 'Install'" >&2
  exit 1
fi
echo "$want" > "$STAMP"
