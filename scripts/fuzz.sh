#!/usr/bin/env bash
# A fuzzing campaign over every parser of user input: installs clang (install_deps.sh), builds fuzz/ with clang's libFuzzer, AddressSanitizer
# and UndefinedBehaviorSanitizer into build-fuzz/, then runs each target for SECONDS (default 60) on a
# copy of its seed corpus (fuzz/corpus/<target>; the corpus libFuzzer grows stays in build-fuzz/).
# A finding (a crash, a sanitizer report, or an error that is not SlideDP's own: fuzz/harness.h) stops
# that target and leaves build-fuzz/findings/<target>/. Prints one line per target; exit 1 on a finding.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${SLIDEDP_FUZZ_BUILD_DIR:-$root/build-fuzz}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(hardware_yaml model_card_yaml hf_config_json plan_yaml lr_schedule_yaml sweep_spec_yaml safetensors safetensors_index npy jsonl
                                   trainer_state token_file)
SLIDEDP_TEST_DEPS=0 SLIDEDP_FUZZ_DEPS=1 "$root/scripts/install_deps.sh"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DSLIDEDP_ENABLE_CUDA=OFF \
  -DSLIDEDP_FUZZ=ON -DSLIDEDP_SANITIZE=address -DSLIDEDP_BUILD_BENCHMARKS=OFF -DSLIDEDP_WERROR=OFF > /dev/null
cmake --build "$build" -j "${SLIDEDP_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
found=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t" findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  cp -n "$root/fuzz/corpus/$t/"* "$corpus/" 2> /dev/null || true
  log="$build/findings/$t.log"
  if (cd "$findings" && UBSAN_OPTIONS=halt_on_error=1 "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=4096 -print_final_stats=1 "$corpus" > "$log" 2>&1); then
    status="no finding"
  else
    status="FINDING (see $log and $findings)"
    found=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  echo "$t: $runs executions in ${seconds} s, $(ls "$corpus" | wc -l) corpus inputs, $status"
done
exit $found
