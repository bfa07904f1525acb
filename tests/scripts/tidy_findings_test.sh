#!/usr/bin/env bash
# scripts/lib/tidy_findings.py, what the style check's clang-tidy holds a change to: a warning on a
# line the change added or modified counts, one on an older line of the same file does not; a
# warning whose note is on such a line (a new std::move before an old use) counts too; a
# function over the size limit counts wherever its warning sits in a changed file unless the
# allowlist names it, and never in tests; a compile error or a failed clang-tidy run always counts (a
# changed source that does not compile alone); other warnings count only through changed lines.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
repo="$tmp/repo"
mkdir -p "$repo/lib" "$repo/tests"
git -C "$repo" init -q
for f in lib/a.cc lib/old.cc tests/t_test.cc; do seq 1 10 | sed 's/^/int line/; s/$/;/' > "$repo/$f"; done
git -C "$repo" add . && git -C "$repo" -c user.name=t -c user.email=t@t commit -qm base
base="$(git -C "$repo" rev-parse HEAD)"
sed -i 's/^int line5;/int line5 = 0;/' "$repo/lib/a.cc"   # line 5 modified
echo 'int line11;' >> "$repo/lib/a.cc"                        # line 11 added
echo 'int line11;' >> "$repo/tests/t_test.cc"
printf 'lib/a.cc allowed_long\n' > "$tmp/allow.txt"
w() { echo "$repo/lib/$1:$2:3: warning: $3 [$4]"; }
{
  w a.cc 5 "use after move" bugprone-use-after-move
  w a.cc 3 "unchanged line" bugprone-branch-clone
  w a.cc 4 "'x' used after it was moved" bugprone-use-after-move
  echo "$repo/lib/a.cc:11:5: note: move occurred here"      # the change added the move
  w a.cc 6 "old use of an old move" bugprone-use-after-move
  echo "$repo/lib/a.cc:1:5: note: move occurred here"
  w a.cc 11 "copy in loop" performance-for-range-copy
  w a.cc 2 "function 'long_one' exceeds recommended size/complexity thresholds" readability-function-size
  w a.cc 7 "function 'allowed_long' exceeds recommended size/complexity thresholds" readability-function-size
  w old.cc 5 "in an untouched file" bugprone-use-after-move
  w old.cc 6 "an old header's use of a new move" bugprone-use-after-move
  echo "$repo/lib/a.cc:5:7: note: move occurred here"
  echo "$repo/tests/t_test.cc:1:1: warning: function 'TestBody' exceeds recommended size/complexity thresholds [readability-function-size]"
  echo "clang-tidy: lib/a.cc exited 1"
  echo "error: unknown argument: '-fbogus' [clang-diagnostic-error]"
  echo "/elsewhere/lib/a.cc:5:1: warning: outside the tree [bugprone-use-after-move]"
  echo "$repo/lib/old.cc:3:9: error: use of undeclared identifier 'fmt' [clang-diagnostic-error]"
  echo "$repo/lib/a.cc:3:3: note: a note on an unchanged line adds nothing"
} > "$tmp/tidy.txt"
status=0
python3 "$root/scripts/lib/tidy_findings.py" --root "$repo" --base "$base" --allowlist "$tmp/allow.txt" \
  < "$tmp/tidy.txt" > "$tmp/found.txt" || status=$?
[ "$status" -eq 1 ] || fail "exit $status with findings (want 1)"
cat > "$tmp/want.txt" <<'TXT'
(command line):0: error: unknown argument: '-fbogus' [clang-diagnostic-error]
lib/a.cc:0: clang-tidy exited 1 (an error listed here, or clang-tidy could not run) [clang-tidy]
lib/a.cc:2: function 'long_one' exceeds recommended size/complexity thresholds [readability-function-size]
lib/a.cc:4: 'x' used after it was moved [bugprone-use-after-move]
lib/a.cc:5: use after move [bugprone-use-after-move]
lib/a.cc:11: copy in loop [performance-for-range-copy]
lib/old.cc:3: error: use of undeclared identifier 'fmt' [clang-diagnostic-error]
lib/old.cc:6: an old header's use of a new move [bugprone-use-after-move]
TXT
diff -u "$tmp/want.txt" "$tmp/found.txt" || fail "the findings differ (above)"
# Nothing on changed lines: clean, exit 0.
grep -v ':5:3: warning\|:11:3: warning\|long_one\|:11:5: note\|:5:7: note\|error:\|exited' "$tmp/tidy.txt" > "$tmp/quiet.txt"
python3 "$root/scripts/lib/tidy_findings.py" --root "$repo" --base "$base" --allowlist "$tmp/allow.txt" \
  < "$tmp/quiet.txt" > "$tmp/none.txt" || fail "exit $? without findings (want 0): $(cat "$tmp/none.txt")"
[ ! -s "$tmp/none.txt" ] || fail "printed findings where there are none: $(cat "$tmp/none.txt")"
echo "tidy findings: changed lines and long functions of changed files only"
