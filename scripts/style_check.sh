#!/usr/bin/env bash
# Style checks on what a change touched (STYLE habit 10): clang-format on the changed lines of C++ and
# CUDA files; clang-tidy on the changed sources, tests and .cu files included: each must compile
# alone, no function over 150 lines outside tests (readability-function-size), and a set of bugprone,
# performance and readability checks on the changed lines.
# "Changed" is against BASE: $1, else the commit in .style-base, which a piece of work sets to the
# commit it starts from. A function already over the limit is named in scripts/style_allowlist.txt
# until it is split; any other fails the check. Formatting and the other checks look at changed lines
# only because the older code predates them (reformatting it is its own change).
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
  echo "style: $build/compile_commands.json is missing (build first): clang-tidy not run"
  exit $status
fi
# One command per source file, also when the build compiled unity batches (CI's builds do).
db="$(mktemp -d)"
trap 'rm -rf "$db"' EXIT
if ! python3 "$root/scripts/lib/per_file_compile_commands.py" "$build" "$db"; then
  echo "style: no per-file compile commands from $build/compile_commands.json: clang-tidy not run"
  exit 1
fi
# Every changed source the build compiles, tests included, but fuzz targets and benchmarks (their
# harness headers double the cost of a run for code that runs nowhere else), and the CUDA sources
# (below: they need a newer clang-tidy).
sources=()
cuda_sources=()
for s in "${files[@]}"; do
  case "$s" in fuzz/* | bench/*) continue ;; *.cu) cuda_sources+=("$s"); continue ;; *.cc) ;; *) continue ;; esac
  if grep -qF "\"$root/$s\"" "$db/compile_commands.json"; then
    sources+=("$s")
  else
    echo "style: $s is not in this build (a CUDA file in a build without CUDA?): clang-tidy skips it"
  fi
done
# The checks: the function size, and the bugprone, performance and readability checks that find real
# defects or clear fixes in this code without noise. Not the whole groups: they cost 12 s a file
# against 7 s for a chosen set (CI's 40 minutes), and on the executor, model and planner they mostly
# flag int indices cast to size_t, switches that return the same size for two types and push_back in
# loops.
checks="-*,readability-function-size"
for c in use-after-move dangling-handle integer-division sizeof-expression infinite-loop unused-return-value \
  string-constructor suspicious-missing-comma macro-parentheses unhandled-self-assignment \
  undefined-memory-manipulation incorrect-roundings implicit-widening-of-multiplication-result; do
  checks+=",bugprone-$c"
done
for c in unnecessary-copy-initialization unnecessary-value-param for-range-copy move-const-arg faster-string-find \
  implicit-conversion-in-loop noexcept-move-constructor; do
  checks+=",performance-$c"
done
# Readability (STYLE habit 10) where a finding is a clear fix on a changed line: redundancy, a
# container's own query, a misleading shape. Not identifier-naming, braces-around-statements,
# isolate-declaration or implicit-bool-conversion: the house style writes B, T, C, one-line ifs and
# `double a = 0, b = 0;` on purpose.
for c in container-size-empty container-contains container-data-pointer redundant-string-cstr \
  redundant-string-init redundant-member-init redundant-control-flow redundant-declaration \
  redundant-smartptr-get redundant-access-specifiers redundant-preprocessor simplify-boolean-expr \
  misleading-indentation misplaced-array-index string-compare delete-null-pointer \
  static-accessed-through-instance inconsistent-declaration-parameter-name duplicate-include \
  avoid-const-params-in-decls const-return-type uniqueptr-delete-release else-after-return \
  redundant-function-ptr-dereference static-definition-in-anonymous-namespace simplify-subscript-expr; do
  checks+=",readability-$c"
done
# (IgnoreMacros: SLIDEDP_CHECK's `if (!(cond))` is not the caller's expression to simplify.)
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: 150},
  {key: readability-simplify-boolean-expr.IgnoreMacros, value: true}]}"
# Warnings in the project's headers count too (a changed header is checked through its includers).
root_re="$(printf '%s' "$root" | sed 's/[][\/.^$*+?(){}|]/\\&/g')"
headers="^$root_re/(card|cli|common|executor|io|kernels|model|planner|profiler|runlog|sweeps|text)/"
# Two at a time (CI's two cores), one clang-tidy run per source, each into its own file (two writers
# of one file would interleave their lines); a run that fails (a source that does not compile alone,
# a missing clang-tidy) leaves "clang-tidy: FILE exited RC" for tidy_findings.py. The database is
# GCC's: clang is told to ignore the warning flags it does not know (the unity builds' GCC-only one).
mkdir "$db/out"
printf '%s\n' "${sources[@]}" | xargs -r -P "${SLIDEDP_JOBS:-2}" -I{} sh -c '
  out="$2/out/$(printf %s "$1" | tr / _).txt"
  clang-tidy -p "$2" --quiet -checks="$3" --header-filter="$4" -config="$5" \
    --extra-arg=-Wno-unknown-warning-option "$1" >"$out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || echo "clang-tidy: $1 exited $rc" >>"$out"
  exit 0' _ {} "$db" "$checks" "$headers" "$config"
if [ $? -ne 0 ]; then
  echo "style: clang-tidy could not be run on every changed source (xargs failed)"
  status=1
fi
# CUDA sources: their host side, parsed by clang as CUDA (device functions' bodies included) against
# the toolkit's headers. Debian's clang-tidy (14) cannot parse CUDA 12+'s headers; clang-tidy 19 can,
# with an empty stand-in for the one header CUDA 12 removed (lib/cuda_tidy_shim). No compile database
# entry is needed: the .cu files include the repository's headers and the toolkit's only.
cuda="${CUDA_PATH:-/usr/local/cuda}"
tidy_cuda="${SLIDEDP_CLANG_TIDY_CUDA:-clang-tidy-19}"
if [ ${#cuda_sources[@]} -gt 0 ]; then
  if [ ! -d "$cuda/include" ] || ! command -v "$tidy_cuda" >/dev/null; then
    echo "style: ${#cuda_sources[@]} CUDA sources changed, but $tidy_cuda or $cuda/include is missing: clang-tidy skips them"
  else
    printf '%s\n' "${cuda_sources[@]}" | xargs -r -P "${SLIDEDP_JOBS:-2}" -I{} sh -c '
      out="$2/out/$(printf %s "$1" | tr / _).txt"
      "$6" --quiet -checks="$3" --header-filter="$4" -config="$5" "$1" -- -x cuda --cuda-host-only \
        --cuda-path="$7" -nocudalib -std=c++20 -I"$8" -I"$9/generated" -isystem "$8/scripts/lib/cuda_tidy_shim" \
        -Wno-unknown-cuda-version >"$out" 2>&1
      rc=$?
      [ $rc -eq 0 ] || echo "clang-tidy: $1 exited $rc" >>"$out"
      exit 0' _ {} "$db" "$checks" "$headers" "$config" "$tidy_cuda" "$cuda" "$root" "$build"
  fi
fi
# tidy_findings.py keeps what this change answers for: a function over 150 lines anywhere in a changed
# source outside tests, an error or a failed run anywhere, anything else on a changed line.
if ! cat "$db"/out/*.txt 2>/dev/null | python3 "$root/scripts/lib/tidy_findings.py" --root "$root" \
  --base "$base" --allowlist "$allow" >"$db/findings.txt"; then
  echo "style: clang-tidy on what this change touched (a function over 150 lines: split it"
  echo "       along its jobs, or, for one that predates the check, name it in scripts/style_allowlist.txt):"
  sed 's/^/  /' "$db/findings.txt"
  status=1
fi
[ $status -eq 0 ] && echo "style: clean"
exit $status
