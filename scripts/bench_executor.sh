#!/usr/bin/env bash
# Measures the executor's overlap on paced runs (slidedp-run --emulate) and writes results/executor/
# bench.md and two timelines. Two targets made for one bottleneck each, from results/executor/targets/
# (the h100-sxm-x4 preset with a 4 GFLOP/s "GPU" and either a slow CPU update or slow host links), a
# 16-layer toy model, 2 ranks, time scale 20. For each: the overlapped run and the same plan run
# serially (verify mode: every update after the backward), per-step busy times, the exposed share
# (step time not covered by rank 0's compute), and the model's prediction for the target times the
# scale beside the measured step.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLIDEDP_BUILD_DIR:-$root/build}/bin"
dir="$root/results/executor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/tiny16.yaml" <<'EOF'
name: tiny16
model_type: llama
hidden_size: 32
num_hidden_layers: 16
num_attention_heads: 4
num_key_value_heads: 2
head_dim: 8
intermediate_size: 64
vocab_size: 256
rope_theta: 10000
EOF
common=(--model "$work/tiny16.yaml" --seq 16 --ranks 2 --micro-batch 2 --chunk-numel 4096 --threads 1 --steps 8
        --time-scale 20 --no-db -q --bench --json)
{
  echo "# Executor bench: overlap on paced runs"
  echo
  echo "Produced by \`scripts/bench_executor.sh\` on $(lscpu | grep 'Model name' | sed 's/.*: *//'), $(nproc) cores;"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ); git $(git -C "$root" rev-parse --short HEAD)."
  echo "Each run: \`slidedp-run --model tiny16.yaml --seq 16 --ranks 2 --micro-batch 2 --chunk-numel 4096"
  echo "--threads 1 --steps 8 --time-scale 20 --bench --emulate results/executor/targets/TARGET.yaml\`, serial"
  echo "with \`--clip-grad-norm 1e30\` (verify mode, same values); steps 2-8 counted. tiny16 is a 16-layer"
  echo "Llama with hidden 32 (the script writes it)."
  echo
  echo "| target | bottleneck (model) | run | step (ms) | predicted x 20 (ms) | compute | h2d | d2h | cpu update | exposed (ms) | exposed share | overruns |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$work/bench.md"
for target in update-bound link-bound; do
  bottleneck=$("$bin/slidedp-predict" --hardware "$dir/targets/$target.yaml" --model "$work/tiny16.yaml" --seq 16 \
    --ranks 2 --micro-batch 2 --chunk-numel 4096 --update-threads 1 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['bottleneck'])")
  for run in overlapped serial; do
    extra=()
    [ "$run" = serial ] && extra=(--clip-grad-norm 1e30)
    trace=()
    [ "$run" = overlapped ] && trace=(--trace "$work/$target.json")
    (cd "$work" && "$bin/slidedp-run" "${common[@]}" --emulate "$dir/targets/$target.yaml" "${extra[@]}" "${trace[@]}") \
      > "$work/$target-$run.json"
    python3 - "$work/$target-$run.json" "$target" "$run" "$bottleneck" >> "$work/bench.md" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
steps = j["steps"][1:]
g = lambda k: sum(s["busy_s"].get(k, 0.0) for s in steps) / len(steps)
step = sum(s["wall_s"] for s in steps) / len(steps)
exposed = step - g("compute")
print(f"| {sys.argv[2]} | {sys.argv[4]} | {sys.argv[3]} | {1e3 * step:.1f} | {1e3 * j['predicted_step_time_s']:.1f} | "
      f"{1e3 * g('compute'):.1f} | {1e3 * g('h2d'):.1f} | {1e3 * g('d2h'):.1f} | {1e3 * g('cpu_update'):.1f} | "
      f"{1e3 * exposed:.1f} | {100 * exposed / step:.0f}% | {j['paced_overruns']} of {j['paced_ops']} |")
PY
  done
  python3 "$root/scripts/trace_svg.py" "$work/$target.json" "$dir/timeline-$target.svg" --steps 3-4 \
    --title "$target target, overlapped run, steps 3-4 (paced, time scale 20)"
done
cp "$work/bench.md" "$dir/bench.md"
echo "wrote $dir/bench.md and $dir/timeline-{update-bound,link-bound}.svg"
