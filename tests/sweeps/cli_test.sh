#!/usr/bin/env bash
# slidedp-sweep run as a user runs it: a small spec writes README.md, points.csv and plots and exits 0;
# --json prints one object; a bad spec exits 2 naming the file and the key; a missing spec exits 4.
# Usage: cli_test.sh SWEEP
set -uo pipefail
sweep="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat > "$dir/small.yaml" <<'YAML'
name: small
grids:
  - hardware: [{preset: h100-sxm-x4}]
    models: [llama-3.2-1b]
    seq_lens: [1024]
    tokens_per_step: [16384]
    systems: [slidedp, megatrain]
YAML
"$sweep" run "$dir/small.yaml" --out "$dir/out" > "$dir/run.txt" 2>&1 || fail "run exited $?: $(cat "$dir/run.txt")"
for f in README.md points.csv speedups__h100-sxm-x4.svg; do [ -s "$dir/out/$f" ] || fail "missing $f"; done
grep -q "^# slidedp-sweep run" "$dir/out/points.csv" || fail "points.csv lacks its stamp: $(head -1 "$dir/out/points.csv")"
[ "$(wc -l < "$dir/out/points.csv")" = 4 ] || fail "points.csv: want stamp + header + 2 rows"

"$sweep" run "$dir/small.yaml" --out "$dir/out2" --json > "$dir/out.json" 2> "$dir/err.txt" || fail "--json exited $?"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['points']==2 and 'README.md' in j['files']" "$dir/out.json" \
  || fail "--json: $(cat "$dir/out.json")"

sed 's/tokens_per_step/tokens_per_stp/' "$dir/small.yaml" > "$dir/bad.yaml"
"$sweep" run "$dir/bad.yaml" --out "$dir/bad" > "$dir/bad.txt" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "bad spec exited $rc, want 2: $(cat "$dir/bad.txt")"
grep -q "bad.yaml" "$dir/bad.txt" && grep -q "tokens_per_st" "$dir/bad.txt" || fail "bad spec message: $(cat "$dir/bad.txt")"
[ ! -e "$dir/bad" ] || fail "a bad spec wrote outputs"

# A report folder run again keeps what is not the report's (it was replaced wholesale, sub-folders
# deleted); a folder holding someone else's files is refused, untouched (its README.md would be
# replaced); an existing file as --out is refused before any point runs (it became a folder).
mkdir -p "$dir/out/notes" && echo mine > "$dir/out/notes/n.txt" && echo mine > "$dir/out/mine.md"
"$sweep" run "$dir/small.yaml" --out "$dir/out" > "$dir/keep.txt" 2>&1 || fail "run into a report folder exited $?: $(cat "$dir/keep.txt")"
[ -s "$dir/out/points.csv" ] && [ "$(cat "$dir/out/notes/n.txt")" = mine ] && [ "$(cat "$dir/out/mine.md")" = mine ] \
  || fail "a report folder lost its own files: $(ls -R "$dir/out")"
mkdir -p "$dir/keep" && echo mine > "$dir/keep/README.md"
"$sweep" run "$dir/small.yaml" --out "$dir/keep" > "$dir/foreign.txt" 2>&1
rc=$?
[ "$rc" = 2 ] && [ "$(cat "$dir/keep/README.md")" = mine ] || fail "a foreign folder: exit $rc, README $(cat "$dir/keep/README.md")"
echo "a file" > "$dir/afile"
"$sweep" run "$dir/small.yaml" --out "$dir/afile" > "$dir/afile.txt" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q -- "--out" "$dir/afile.txt" || fail "--out onto a file exited $rc: $(cat "$dir/afile.txt")"
[ "$(cat "$dir/afile")" = "a file" ] || fail "--out replaced a file"
"$sweep" run "$dir/small.yaml" --out "$dir" > "$dir/spec.txt" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "SPEC" "$dir/spec.txt" || fail "--out holding the spec exited $rc: $(cat "$dir/spec.txt")"
# Names that become paths are checked when the spec is read, before the first point.
sed 's/^name: small/name: ../' "$dir/small.yaml" > "$dir/dots.yaml"
"$sweep" run "$dir/dots.yaml" > "$dir/dots.txt" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "name" "$dir/dots.txt" || fail "spec name '..' exited $rc: $(cat "$dir/dots.txt")"

"$sweep" run "$dir/none.yaml" > "$dir/none.txt" 2>&1
rc=$?
[ "$rc" = 4 ] || fail "missing spec exited $rc, want 4: $(cat "$dir/none.txt")"
echo "ok"
