#!/usr/bin/env bash
# Records the CPU-backend profiles of this machine into results/profiler/: the full profile for 2
# emulated devices (cpu-profile.yaml, what issue 10's fidelity sweep reads), a second full run of it to
# check re-runs against the reported spread, the profiles for 1 and 4 devices, and one --quick run.
# Before each run it waits (up to 10 minutes) for a quiet machine: 1-minute load below 0.6 and no
# compiler running, since other builds on the 2 shared cores disturb the timings.
# Usage: results/profiler/run.sh [build dir, default build-prof]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build-prof}/bin/slidedp-profile
OUT=results/profiler
MODELS=slidedp-tiny,$OUT/models/tiny.yaml
COMMON=(--model "$MODELS" --seq 128 --micro-batches 1,2,4,8 --chunk-numel 65536 --db runs/profile.db)

wait_quiet() {
  for _ in $(seq 1 120); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if awk "BEGIN{exit !($load < 0.6)}" && ! pgrep -x cc1plus > /dev/null; then return; fi
    sleep 5
  done
  echo "machine did not get quiet; measuring anyway (load $(cut -d' ' -f1 /proc/loadavg))" >&2
}

run() {  # name, then flags
  local name=$1
  shift
  wait_quiet
  echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): $BIN $*" | tee -a $OUT/runs.log
  local t0=$(date +%s.%N)
  "$BIN" "$@" --json > $OUT/$name.json 2>> $OUT/runs.log
  echo "  wall $(echo "$(date +%s.%N) - $t0" | bc) s, load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $OUT/runs.log
}

lscpu > $OUT/lscpu.txt
: > $OUT/runs.log
run cpu-profile "${COMMON[@]}" --ranks 2 --out $OUT/cpu-profile.yaml
run cpu-profile-rerun "${COMMON[@]}" --ranks 2 --out $OUT/cpu-profile-rerun.yaml
run cpu-profile-r1 "${COMMON[@]}" --ranks 1 --out $OUT/cpu-profile-r1.yaml
run cpu-profile-r4 "${COMMON[@]}" --ranks 4 --out $OUT/cpu-profile-r4.yaml
run quick "${COMMON[@]}" --ranks 2 --quick --out $OUT/quick-profile.yaml
python3 $OUT/compare_runs.py $OUT/cpu-profile.json $OUT/cpu-profile-rerun.json --markdown > $OUT/rerun.md
