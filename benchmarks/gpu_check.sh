#!/usr/bin/env bash
# The device check of issue 24 (benchmarks/gpu_check.py says what it measures).
#
#   benchmarks/gpu_check.sh [--tiny] [--wheels DIR] [gpu_check.py options, e.g. --json FILE]
#
# On a lent GPU machine: the published Qwen2.5-VL-3B shape, 20 LoRA steps, phantom studies for
# up to 2 minutes, the gpu-marked tests, within 8 minutes. --tiny: the same steps at narrow
# widths, on a CPU too (the suite runs it). --wheels DIR: install the wheels in DIR (radcaliper's
# packages that the machine's image lacks; benchmarks/README.md says which) into a scratch
# folder first, never into the image. Prints one line of figures, starting "gpu_check:".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
args=(--shape 3b)
wheels=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tiny) args=(--shape 3b --narrow --steps 2 --batch 1 --studies 1 --no-tests); shift ;;
    --wheels) wheels=$(cd "$2" && pwd); shift 2 ;;
    *) break ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [[ -n "$wheels" ]]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$work/site" "$wheels"/*.whl
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root"
timeout 480 "$python" benchmarks/gpu_check.py "${args[@]}" --work "$work" "$@"
