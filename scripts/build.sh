#!/usr/bin/env bash
# Configures and builds SlideDP into build/ (or $SLIDEDP_BUILD_DIR). CUDA code is compiled whenever
# nvcc is present (CI always compiles it), unless SLIDEDP_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
cuda="${SLIDEDP_CUDA:-auto}"
if [ "$cuda" = "auto" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then cuda=ON; else cuda=OFF; fi
fi
extra=()
[ "$cuda" = "ON" ] && [ -x /usr/local/cuda/bin/nvcc ] && extra+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE="${SLIDEDP_BUILD_TYPE:-RelWithDebInfo}" \
  -DSLIDEDP_ENABLE_CUDA="$cuda" -DSLIDEDP_WERROR="${SLIDEDP_WERROR:-ON}" "${extra[@]}" "$@" >/dev/null
jobs="${SLIDEDP_JOBS:-$(nproc)}"
cmake --build "$build" -j "$jobs"
