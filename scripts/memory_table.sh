#!/usr/bin/env bash
# Regenerates the numbers of results/memory/README.md: for a grid of plans on the CPU backend, the
# planner's predicted device peak (slidedp-predict on the cpu-dev profile), the executor's up-front
# account (slidedp-run --json), the driver peak the account replays against the measured held-bytes
# high-water mark, and the arena's high-water mark of a run whose budget is the account's peak; then
# the two outside SlideFormer points and SlideDP's own plans at those shapes (predictions only).
# Usage: scripts/memory_table.sh [build-dir]   (prints Markdown tables to stdout)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build}/bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

cat > small.yaml <<'EOF'
name: small-llama
model_type: llama
hidden_size: 512
num_hidden_layers: 4
num_attention_heads: 8
num_key_value_heads: 4
intermediate_size: 1408
vocab_size: 256
EOF

mib() { python3 -c "print(f'{$1 / 2**20:.2f}')"; }
field() { python3 -c "import json,sys; j=json.load(open('$1')); print(eval('j' + sys.argv[1]))" "$2"; }

echo "| model | seq | plan | predicted (MiB) | account (MiB) | driver peak: replay / measured (MiB) | arena high water at budget = account | peak at |"
echo "|---|---|---|---|---|---|---|---|"
while read -r model seq args; do
  [ -z "$model" ] && continue
  # shellcheck disable=SC2086
  "$bin/slidedp-run" --model "$model" --seq "$seq" $args --steps 2 --no-db --json -q > run.json
  peak=$(field run.json "['device_memory_account']['peak_bytes']")
  driver=$(field run.json "['device_memory_account']['driver_peak_bytes']")
  held=$(field run.json "['device_held_high_water_bytes'][0]")
  at=$(field run.json "['device_memory_account']['peak_at']")
  # shellcheck disable=SC2086
  "$bin/slidedp-run" --model "$model" --seq "$seq" $args --steps 2 --no-db --json -q \
    --device-budget "$(python3 -c "print(int($peak))")" > tight.json
  arena=$(field tight.json "['device_high_water_bytes'][0]")
  # shellcheck disable=SC2086
  "$bin/slidedp-predict" --hardware cpu-dev --model "$model" --seq "$seq" $args --json > predict.json
  predicted=$(python3 -c "import json; j=json.load(open('predict.json')); print(j['gpu_mem_peak_bytes'])")
  name=$(basename "$model" .yaml)
  echo "| $name | $seq | \`$args\` | $(mib "$predicted") | $(mib "$peak") | $(mib "$driver") / $(mib "$held") | $(mib "$arena") ($(python3 -c "print(f'{100*$arena/$peak:.1f}')")%) | $at |"
done <<'EOF'
slidedp-tiny 128 --ranks 2 --micro-batch 4 --param-route sharded --activation offload:1,recompute:2,keep:rest
slidedp-tiny 128 --ranks 1 --micro-batch 8 --activation keep:rest --depth 3
slidedp-tiny 256 --ranks 2 --micro-batch 2 --accum 2 --grad-route gpu --activation recompute:rest --mlp-token-tile 64
slidedp-tiny 128 --ranks 3 --micro-batch 2 --param-route sharded --grad-route gpu --activation offload:2,recompute:rest --depth 4
small.yaml 64 --ranks 1 --micro-batch 2 --activation recompute:rest
small.yaml 64 --ranks 2 --micro-batch 1 --grad-route gpu --activation offload:2,keep:rest --depth 3
small.yaml 256 --ranks 2 --micro-batch 2 --param-route sharded --activation recompute:rest --mlp-token-tile 128
EOF

echo
echo "| system | model | predicted peak (GiB) | measured (GiB) | error |"
echo "|---|---|---|---|---|"
for point in "qwen3-8b 15.6" "qwen3-14b 21.8"; do
  set -- $point
  "$bin/slidedp-predict" --system slideformer-dp --hardware rtx4090-x4 --ranks 1 --model "$1" --seq 1024 \
    --micro-batch 64 --json > sf.json
  p=$(python3 -c "import json; print(json.load(open('sf.json'))['gpu_mem_peak_bytes'] / 2**30)")
  echo "| slideformer-dp | $1 | $(python3 -c "print(f'{$p:.2f}')") | $2 | $(python3 -c "print(f'{100*($p-$2)/$2:+.1f}')")% |"
done

echo
echo "| SlideDP plan at seq 1024, micro-batch 64, 1 rank, rtx4090-x4 | model | predicted peak | fits the 23.49 GiB budget? |"
echo "|---|---|---|---|"
for point in "qwen3-8b 36" "qwen3-14b 40"; do
  set -- $point
  for act in "--activation recompute:rest" "--activation offload:$(($2 - 1)),recompute:rest" \
             "--activation offload:$(($2 - 1)),recompute:rest --mlp-token-tile 4096"; do
    # shellcheck disable=SC2086
    if "$bin/slidedp-predict" --hardware rtx4090-x4 --ranks 1 --model "$1" --seq 1024 --micro-batch 64 $act --json \
        > dp.json 2> dp.err; then
      peak="$(python3 -c "import json; print(f\"{json.load(open('dp.json'))['gpu_mem_peak_bytes'] / 2**30:.2f} GiB\")")"
      echo "| \`$act\` | $1 | $peak | yes |"
    else
      echo "| \`$act\` | $1 | $(sed -n 's/.*peak \([0-9.]* GiB\).*/\1/p' dp.err) | no: $(sed -n 's/.*(largest: \(.*\))/\1/p' dp.err) |"
    fi
  done
done
