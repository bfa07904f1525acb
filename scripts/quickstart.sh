#!/usr/bin/env bash
# The README's first command: installs the build dependencies, builds the two tools it runs (CPU
# backend), and runs the main job on the embedded default: slidedp-run trains the small
# Llama-architecture slidedp-tiny model on the text compiled into the binary with 2 emulated GPUs
# (sharded parameter delivery, activation offload and recompute), paced at the model's costs for a 4x
# RTX 4090 host (--emulate: every operation done for real, then held as long as the step model says
# that machine takes, time stretched by a scale measured on this host), so the model's prediction for
# that machine, times the scale, is what the run measures: a check of the scheduling, not of the
# model's costs; logging to runs/runs.db. Then slidedp-predict shows what the same
# pipeline does for Qwen3-14B on 4x H100.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
SLIDEDP_TEST_DEPS=0 "$root/scripts/install_deps.sh"
SLIDEDP_CUDA="${SLIDEDP_CUDA:-OFF}" "$root/scripts/build.sh" --target slidedp-run slidedp-predict
bin="${SLIDEDP_BUILD_DIR:-$root/build}/bin"
echo
echo "== slidedp-run: train slidedp-tiny on the embedded text (2 emulated GPUs paced at the model's costs for 4x RTX 4090) =="
"$bin/slidedp-run" --steps 20 --emulate rtx4090-x4 --db "$root/runs/runs.db" --trace "$root/runs/quickstart-trace.json"
echo
echo "== slidedp-predict: Qwen3-14B on 4x H100 SXM, 4096-token sequences =="
"$bin/slidedp-predict" --hardware h100-sxm-x4 --model qwen3-14b --seq 4096 --micro-batch 2 --ranks 4 \
  --param-route sharded --activation offload:8,recompute:rest
