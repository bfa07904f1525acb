#!/usr/bin/env bash
# Measures the CPU optimizer kernels into results/kernels/: bench_kernels_optim (every kernel next
# to the triad, 16M/64M/256M elements, 1 and all threads) and the side-by-side comparison with
# torch.optim.AdamW. Builds only the benchmark target, in $SLIDEDP_BUILD_DIR (default build/).
# Run on a quiet machine: both measure memory bandwidth, which any other load steals.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
out="$root/results/kernels"
mkdir -p "$out"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLIDEDP_ENABLE_CUDA=OFF >/dev/null
fi
ninja -C "$build" -j "${SLIDEDP_JOBS:-2}" bench_kernels_optim
"$build/bin/bench_kernels_optim" --benchmark_repetitions="${REPETITIONS:-3}" \
  --benchmark_report_aggregates_only=true \
  --summary_csv="$out/bench_kernels_optim.csv" | tee "$out/bench_kernels_optim.txt"
/usr/bin/python3 "$root/scripts/bench_adamw_vs_torch.py" --bench "$build/bin/bench_kernels_optim" \
  --csv "$out/adamw_vs_torch.csv" | tee "$out/adamw_vs_torch.txt"
