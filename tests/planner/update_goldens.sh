#!/usr/bin/env bash
# Regenerates the planner's golden plans (tests/data/planner/*.yaml) from the current build. Run it
# only when a change of the chosen plans is intended, then review `git diff tests/data/planner`.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-${SLIDEDP_BUILD_DIR:-$root/build}}"
cd "$root"
SLIDEDP_UPDATE_PLANNER_GOLDEN=1 "$build/tests/planner/test_planner_golden"
git -C "$root" diff --stat -- tests/data/planner || true
