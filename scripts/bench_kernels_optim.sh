#!/usr/bin/env bash
# Measures the CPU optimizer kernels into results/kernels/: bench_kernels_optim (every kernel next
# to the triad, 16M/64M/256M elements, 1 and all threads) and the side-by-side comparison with
# torch.optim.AdamW. Builds only the benchmark target, in $SLIDEDP_BUILD_DIR (default build/).
# One invocation per size, with random interleaving of repetitions so that changes in machine load
# hit the triad and the kernels alike (each size's buffers are allocated once per invocation).
# Run on a quiet machine: everything here measures memory bandwidth, which any other load steals.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
out="$root/results/kernels"
sizes="${SIZES:-16M 64M 256M}"
mkdir -p "$out"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLIDEDP_ENABLE_CUDA=OFF >/dev/null
fi
ninja -C "$build" -j "${SLIDEDP_JOBS:-2}" bench_kernels_optim
bench="$build/bin/bench_kernels_optim"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
: >"$out/bench_kernels_optim.txt"
for size in $sizes; do
  echo "# $bench --sizes=$size (load average: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/bench_kernels_optim.txt"
  "$bench" --sizes="$size" --benchmark_repetitions="${REPETITIONS:-3}" \
    --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \
    --summary_csv="$tmp/$size.csv" 2>&1 | tee -a "$out/bench_kernels_optim.txt"
done
first=1
for size in $sizes; do
  if [ "$first" = 1 ]; then cat "$tmp/$size.csv"; first=0; else tail -n +2 "$tmp/$size.csv"; fi
done >"$out/bench_kernels_optim.csv"
echo "# torch comparison (load average: $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$out/adamw_vs_torch.txt"
/usr/bin/python3 "$root/scripts/bench_adamw_vs_torch.py" --bench "$bench" --sizes "${sizes// /,}" \
  --csv "$out/adamw_vs_torch.csv" | tee -a "$out/adamw_vs_torch.txt"
