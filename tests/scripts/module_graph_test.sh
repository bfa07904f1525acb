#!/usr/bin/env bash
# scripts/module_graph.py: the repository's modules include each other in no cycle (issue 46: kernels/
# and model/ once did), and the check itself finds a cycle in a fake tree (two modules including each
# other, directly and through a third) while a module's tool folder (x/cli/) including a higher
# module is no cycle.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
graph="$root/scripts/module_graph.py"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$graph" --root "$root" --check || fail "the repository's modules include each other (above)"

mkdir -p "$tmp/low" "$tmp/mid" "$tmp/high/cli"
printf '#pragma once\n' > "$tmp/low/a.h"
printf '#include "low/a.h"\n' > "$tmp/mid/b.h"
printf '#include "mid/b.h"\n' > "$tmp/high/c.cc"
printf '#include "high/c.h"\n#include "low/a.h"\n' > "$tmp/high/cli/main.cc"
printf '#include "high/cli/flags.h"\n' > "$tmp/low/uses_tool.cc.txt"  # not a source: ignored
python3 "$graph" --root "$tmp" --check || fail "a tree without a cycle was called cyclic"
order="$(python3 "$graph" --root "$tmp" --json | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["modules"]))')"
[ "$order" = "low mid high high/cli" ] || fail "dependency order '$order', expected 'low mid high high/cli'"

printf '#include "high/c.h"\n' > "$tmp/low/d.cc"  # low -> high -> mid -> low
if python3 "$graph" --root "$tmp" --check 2> "$tmp/err"; then fail "a three-module cycle passed"; fi
grep -q "high, low, mid include each other" "$tmp/err" || fail "the cycle was not named: $(cat "$tmp/err")"
grep -q "low/d.cc includes high/c.h" "$tmp/err" || fail "the closing include was not named: $(cat "$tmp/err")"
echo "module graph: no cycle here; a planted cycle is found and named"
