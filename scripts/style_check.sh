#!/usr/bin/env bash
# Style checks on what a change touched (STYLE habit 10): clang-format on the changed lines of C++ and
# CUDA files, and clang-tidy's readability-function-size (no function over 150 lines) on the changed
# non-CUDA sources outside tests. "Changed" is against BASE: $1, else the commit in .style-base, which a
# piece of work sets to the commit it starts from. A function already over the limit is named in
# scripts/style_allowlist.txt until it is split; any other fails the check. Formatting is checked on
# changed lines only because the older code predates .clang-format (reformatting it is its own change).
# Needs the build's compile_commands.json (scripts/build.sh writes it); exit 1 on a finding.
#   scripts/style_check.sh [BASE]      SLIDEDP_BUILD_DIR: the build folder (default build/)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
base="${1:-$(grep -v '^#' .style-base | head -1)}"
if ! git cat-file -e "${base}^{commit}" 2>/dev/null; then
  echo "style: the base commit '$base' is not in this clone: nothing to compare against, skipped"
  exit 0
fi
mapfile -t files < <(git diff --name-only --diff-filter=AMR "$base" -- '*.cc' '*.h' '*.cu' '*.cuh')
echo "style: ${#files[@]} C++/CUDA files changed since ${base:0:12}"
[ ${#files[@]} -eq 0 ] && exit 0
status=0

# clang-format on the lines that changed.
formatting="$(git clang-format --diff --extensions cc,h,cu,cuh "$base" -- "${files[@]}" 2>&1)"
if [ "${formatting#diff --git}" != "$formatting" ]; then
  echo "style: clang-format would change these lines (apply: commit, then git clang-format $base, which leaves files"
  echo "       with unstaged changes alone, and commit again):"
  echo "$formatting"
  status=1
fi

# Function size on the changed sources (CUDA files need nvcc's flags; tests may hold long tables).
allow="$root/scripts/style_allowlist.txt"
if [ ! -f "$build/compile_commands.json" ]; then
  echo "style: $build/compile_commands.json is missing (build first): function sizes not checked"
  exit $status
fi
mapfile -t sources < <(printf '%s\n' "${files[@]}" | grep -E '\.cc$' | grep -vE '^(tests|fuzz|bench)/')
# One command per source file, also when the build compiled unity batches (CI's builds do).
db="$(mktemp -d)"
trap 'rm -rf "$db"' EXIT
if ! python3 "$root/scripts/lib/per_file_compile_commands.py" "$build" "$db"; then
  echo "style: no per-file compile commands from $build/compile_commands.json: function sizes not checked"
  exit 1
fi
for s in "${sources[@]}"; do
  grep -qF "\"$root/$s\"" "$db/compile_commands.json" ||
    echo "style: $s is not in this build (a CUDA file in a build without CUDA?): its function sizes not checked"
done
# Two at a time (CI's two cores); each prints "FILE FUNCTION" for a function over the limit.
over="$(printf '%s\n' "${sources[@]}" | xargs -r -P "${SLIDEDP_JOBS:-2}" -I{} sh -c '
  clang-tidy -p "$1" --quiet -checks="-*,readability-function-size" \
    -config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: 150}]}" "$2" 2>/dev/null |
  sed -nE "s|^$3/$2:[0-9]+:[0-9]+: warning: function '"'"'([^'"'"']+)'"'"' exceeds.*|$2 \1|p"' _ "$db" {} "$root")"
while IFS= read -r found; do
  [ -z "$found" ] && continue
  grep -qxF "$found" "$allow" && continue
  echo "style: ${found% *}: function '${found#* }' is over 150 lines: split it along its jobs (or, for one that"
  echo "       predates the check, name it in scripts/style_allowlist.txt)"
  status=1
done <<<"$over"
[ $status -eq 0 ] && echo "style: clean"
exit $status
