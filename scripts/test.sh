#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything (CUDA too when nvcc exists),
# runs the whole test suite, then runs the executor's pipeline, fault and resume tests and the run
# log's tests (its background writer) again under ThreadSanitizer (a second, smaller build;
# SLIDEDP_TSAN=0 skips it) and the tests of what reads user input and does index arithmetic (parsers
# and the replays of 12 of the 13 fuzz targets, the run log, the CPU kernels, faults and resume) under
# AddressSanitizer + UndefinedBehaviorSanitizer (a third; SLIDEDP_ASAN=0 skips it). The sweep spec's
# fuzz target needs the planner and sweeps built under ASan (about 3 minutes of CI's 40): its replay
# runs in the plain build and its ASan campaign in scripts/fuzz.sh. The multi-node tests run only in
# the plain build: their second process is an MPI library's, uninstrumented. Tests that
# need a GPU skip themselves with a visible reason. Before the tests, scripts/style_check.sh checks the
# files changed since .style-base (clang-format on the changed lines; clang-tidy on changed sources,
# tests and .cu files included: no function over 150 lines, bugprone, performance and readability
# checks on changed lines; two to three minutes); a finding fails the command after everything has
# run (SLIDEDP_STYLE=0 skips it). Extra
# arguments go to the main ctest run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${SLIDEDP_TEST_JOBS:-2}"
# Each phase's start, so a CI log shows where its minutes go (the 40-minute budget).
phase() { echo "== $1 ($(date -u +%H:%M:%S)) =="; }
phase "dependencies"
"$root/scripts/install_deps.sh"
phase "build"
# -O2 without -g: the tests print the file and line of a failed check themselves, and debug info
# costs compile time that CI's 40 minutes need. The test binaries' own code at -O1 (the code under
# test at -O2), and CUDA for sm_80 alone: CI compiles it without running it, at the oldest
# architecture the kernels support (a GPU check builds for its own GPU). Every build here compiles
# each target's sources in unity batches (SLIDEDP_UNITY_BUILD, about half the CPU time); a changed
# source that does not include what it uses still fails CI: the style check's clang-tidy compiles
# each changed source alone (as a developer's build, scripts/build.sh alone, does everywhere).
unity="-DSLIDEDP_UNITY_BUILD=${SLIDEDP_UNITY_BUILD:-ON}"
"$root/scripts/build.sh" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "-DSLIDEDP_TEST_CXX_FLAGS=-O1" \
  "-DCMAKE_CUDA_ARCHITECTURES=80" "$unity"
build="${SLIDEDP_BUILD_DIR:-$root/build}"
# Style on what changed since .style-base (clang-format on changed lines; clang-tidy: function sizes,
# the bugprone, performance and readability sets, each changed source compiled alone): reported
# here, its verdict the script's exit status once every test has run.
style_status=0
if [ "${SLIDEDP_STYLE:-1}" = "1" ]; then
  phase "style checks on the changed files"
  SLIDEDP_BUILD_DIR="$build" "$root/scripts/style_check.sh" || style_status=1
fi
phase "tests"
# The slow tests first (ctest orders by the costs in CTestCostData.txt, which a fresh build lacks):
# tests/ctest_costs.txt holds the seconds of every test over one second in a CI run, so that no
# long test starts last and runs alone while the other core idles.
mkdir -p "$build/Testing/Temporary"
[ -f "$build/Testing/Temporary/CTestCostData.txt" ] || cp "$root/tests/ctest_costs.txt" "$build/Testing/Temporary/CTestCostData.txt"
ctest --test-dir "$build" -j "$jobs" --output-on-failure "$@"

if [ "${SLIDEDP_TSAN:-1}" = "1" ]; then
  phase "executor pipeline tests under ThreadSanitizer"
  tsan="$root/build-tsan"
  SLIDEDP_BUILD_DIR="$tsan" SLIDEDP_CUDA=OFF SLIDEDP_JOBS="${SLIDEDP_JOBS:-2}" "$root/scripts/build.sh" \
    -DSLIDEDP_SANITIZE=thread -DSLIDEDP_BUILD_BENCHMARKS=OFF -DSLIDEDP_MODULES="common;model;kernels;io;runlog;executor" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DSLIDEDP_TEST_CXX_FLAGS=-O0" "$unity" \
    --target test_executor_pipeline test_executor_faults test_executor_resume test_run_log
  TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" \
    ctest --test-dir "$tsan" -j "$jobs" --output-on-failure -R "^(Pipeline|Faults|Resume|RunLog[A-Za-z]*|PatientLog)\."
fi

if [ "${SLIDEDP_ASAN:-1}" = "1" ]; then
  phase "parsers, run log, kernels, faults and resume under AddressSanitizer + UndefinedBehaviorSanitizer"
  asan="$root/build-asan"
  targets=(test_io test_text test_model_vocabulary test_run_log test_cli_main test_thread_pool test_lr_schedule test_kernels_optim
           test_kernels_transformer_ops test_kernels_transformer_units test_kernels_transformer_moe
           test_kernels_transformer_router_aux_loss test_kernels_transformer_gemma4 test_kernels_transformer_qwen3_5
           test_kernels_transformer_delta_rule test_kernels_transformer_deltanet test_executor_faults test_executor_resume
           fuzz_hardware_yaml fuzz_model_card_yaml fuzz_hf_config_json fuzz_plan_yaml fuzz_lr_schedule_yaml
           fuzz_safetensors fuzz_safetensors_index fuzz_npy fuzz_jsonl fuzz_trainer_state fuzz_token_file fuzz_chat_template)
  # -O1 -g1: line tables for the reports at half the build time of -O2 -g (CI's 40 minutes); the test
  # binaries' own code at -O0 (half the compile of -O1 again; the code under test stays at -O1)
  SLIDEDP_BUILD_DIR="$asan" SLIDEDP_CUDA=OFF SLIDEDP_JOBS="${SLIDEDP_JOBS:-2}" "$root/scripts/build.sh" \
    -DSLIDEDP_SANITIZE=address -DSLIDEDP_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DSLIDEDP_TEST_CXX_FLAGS=-O0" "$unity" \
    --target "${targets[@]}"
  ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}" UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}" \
    ctest --test-dir "$asan" -j "$jobs" --output-on-failure -R "$("$root/scripts/built_tests.py" "$asan")"
fi
phase "done"
if [ "$style_status" != 0 ]; then
  echo "test.sh: the style checks failed (see '== style checks' above)"
  exit 1
fi
