#!/usr/bin/env bash
# The README's first command: installs dependencies, builds, and runs the main job on an embedded
# default: a step-time prediction for a real model on a preset machine, as a readable breakdown.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install_deps.sh"
SLIDEDP_CUDA="${SLIDEDP_CUDA:-OFF}" "$root/scripts/build.sh"
bin="${SLIDEDP_BUILD_DIR:-$root/build}/bin"
echo
echo "== slidedp-predict: Qwen3-14B, 4x H100 SXM, 4096-token sequences =="
"$bin/slidedp-predict" --hardware h100-sxm-x4 --model qwen3-14b --seq 4096 --micro-batch 2 --ranks 4
