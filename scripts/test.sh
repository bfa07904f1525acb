#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything (CUDA too when nvcc exists)
# and runs the whole test suite. Tests that need a GPU skip themselves with a visible reason.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
ctest --test-dir "$build" -j "${SLIDEDP_TEST_JOBS:-2}" --output-on-failure "$@"
