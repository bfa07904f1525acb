#!/usr/bin/env bash
# Configures and builds SlideDP into build/ (or $SLIDEDP_BUILD_DIR). CUDA code is compiled whenever
# nvcc is present (CI always compiles it), unless SLIDEDP_CUDA=OFF. Arguments before `--target` go
# to cmake's configure step; `--target A B ...` builds only those targets. Each file compiles on its
# own (so a missing include shows) unless SLIDEDP_UNITY_BUILD=ON or an argument says otherwise (the
# test command's builds: unity batches).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
cuda="${SLIDEDP_CUDA:-auto}"
if [ "$cuda" = "auto" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then cuda=ON; else cuda=OFF; fi
fi
configure=()
targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--target" ]; then shift; targets=("$@"); break; fi
  configure+=("$1"); shift
done
[ "$cuda" = "ON" ] && [ -x /usr/local/cuda/bin/nvcc ] && configure+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE="${SLIDEDP_BUILD_TYPE:-RelWithDebInfo}" \
  -DSLIDEDP_ENABLE_CUDA="$cuda" -DSLIDEDP_WERROR="${SLIDEDP_WERROR:-ON}" -DSLIDEDP_MODULES=all \
  -DSLIDEDP_UNITY_BUILD="${SLIDEDP_UNITY_BUILD:-OFF}" "${configure[@]}" >/dev/null
jobs="${SLIDEDP_JOBS:-$(nproc)}"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$build" -j "$jobs"
fi
