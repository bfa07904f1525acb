#!/usr/bin/env bash
# Measures the executor's exposed streaming time on the CPU backend for a compute-heavy plan and
# writes results/executor/bench.md (command, machine, load, per-step table). Issue 5's target: exposed
# time (step time not covered by rank 0's compute) under 10% of the step.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLIDEDP_BUILD_DIR:-$root/build}/bin"
out="$root/results/executor/bench.md"
cmd=("$bin/slidedp-run" --steps 10 --no-db -q --bench --micro-batch 8 --seq 256 --ranks 2 --param-route sharded \
     --activation offload:1,recompute:2,keep:rest --chunk-numel 65536)
tmp=$(mktemp)
(cd "$(mktemp -d)" && "${cmd[@]}") > "$tmp"
{
  echo "# Executor bench: exposed streaming time on the CPU backend"
  echo
  echo "Command: \`${cmd[*]/#$root\//}\`"
  echo
  echo "Machine: $(lscpu | grep 'Model name' | sed 's/.*: *//'), $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ); git $(git -C "$root" rev-parse --short HEAD)"
  echo
  echo '```'
  cat "$tmp"
  echo '```'
  echo
  python3 - "$tmp" <<'PY'
import sys, re
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^\s+\d+\s", l)]
steady = rows[1:]
step = sum(float(r[2]) for r in steady); exposed = sum(float(r[8]) for r in steady)
print(f"Steady state (steps 2-{len(rows)}): exposed {exposed/step*100:.1f}% of the step time "
      f"(mean step {step/len(steady)*1000:.1f} ms, mean exposed {exposed/len(steady)*1000:.1f} ms); target < 10%.")
PY
} > "$out"
rm -f "$tmp"
echo "wrote $out"
