#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything (CUDA too when nvcc exists),
# runs the whole test suite, then runs the executor's pipeline tests again under ThreadSanitizer
# (a second, smaller build; SLIDEDP_TSAN=0 skips it). Tests that need a GPU skip themselves with a
# visible reason. Extra arguments go to the main ctest run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${SLIDEDP_TEST_JOBS:-2}"
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
ctest --test-dir "$build" -j "$jobs" --output-on-failure "$@"

if [ "${SLIDEDP_TSAN:-1}" = "1" ]; then
  echo "== executor pipeline tests under ThreadSanitizer =="
  tsan="$root/build-tsan"
  SLIDEDP_BUILD_DIR="$tsan" SLIDEDP_CUDA=OFF SLIDEDP_JOBS="${SLIDEDP_JOBS:-2}" "$root/scripts/build.sh" \
    -DSLIDEDP_SANITIZE=thread -DSLIDEDP_BUILD_BENCHMARKS=OFF -DSLIDEDP_MODULES="common;model;kernels;io;executor" \
    --target test_executor_pipeline test_executor_faults test_executor_resume
  TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" \
    ctest --test-dir "$tsan" -j "$jobs" --output-on-failure -R "^(Pipeline|Faults|Resume)\."
fi
