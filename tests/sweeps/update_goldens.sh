#!/usr/bin/env bash
# Regenerates the golden sweep points (tests/data/sweeps/golden_points.csv) from the current build.
# Run it only when a change of the chosen plans or predictions is intended, then review the diff.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-${SLIDEDP_BUILD_DIR:-$root/build}}"
cd "$root"
SLIDEDP_UPDATE_SWEEP_GOLDEN=1 "$build/tests/sweeps/test_sweeps_golden"
git -C "$root" diff --stat -- tests/data/sweeps || true
