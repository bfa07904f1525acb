#!/usr/bin/env bash
# The GPU check of the CUDA backend (issue 7): ONE prepared run on a machine with a GPU that tells
# everything -- the `gpu` tests, the streamed vs GPU-resident benchmark, the PyTorch reference and a
# summary -- well under 8 minutes, because GPU time is scarce.
#
#   scripts/gpu_check.sh pack   Here, no GPU needed: builds Release binaries for sm_${SLIDEDP_GPU_ARCH:-90}
#                               (H100/H200) into .gpu_bundle.tar.xz (git-ignored) with the shared
#                               libraries the GPU image may lack, and prints the device command.
#   scripts/gpu_check.sh        On the GPU machine: uses the bundle when it is there and loads, else
#                               builds from source (needs the Debian dependencies); then runs the
#                               phases below, each under a timeout inside an overall budget.
#
# Results go to $OUT when set (the device tool collects at most 8 files from there), else to
# results/gpu/<UTC time>/: env.txt, build.log (when built), tests.log, bench.log, bench.csv,
# torch.log, torch.json, measured.log, measured/ (slidedp-sweep measured --backend cuda), profile.log and
# profile.yaml (slidedp-profile --smoke --kernels: per-kernel unit times), profile_moe.log and
# profile_moe.yaml (the same at Gemma 4 26B-A4B's shape, grouped expert GEMMs), fidelity.log,
# gpu-profile.yaml and fidelity/ (the model's fidelity on this GPU), summary.txt.
# Knobs: SLIDEDP_GPU_CHECK_BUDGET_S (default 450: later phases are skipped, and said so, when the
# budget runs out), SLIDEDP_GPU_BENCH_ARGS (extra bench_executor_cuda flags), SLIDEDP_GPU_ARCH.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arch="${SLIDEDP_GPU_ARCH:-90}"
bundle="$root/.gpu_bundle.tar.xz"
tests_a=(test_kernels_cuda_host test_kernels_cuda_ops test_kernels_cuda_units test_executor_cuda_backend)
tests_b=(test_executor_cuda_pipeline test_executor_cuda_training test_executor_cuda_copy_bytes)
targets=("${tests_a[@]}" "${tests_b[@]}" bench_executor_cuda slidedp-sweep slidedp-profile)

# Without MPI: the binaries packed here must load on a GPU machine that has no libmpi (the one-GPU
# check runs no multi-node job).
cmake_args() {  # cmake_args <build dir>: the configure command line of a GPU build
  echo -S "$root" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIDEDP_ENABLE_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    "-DSLIDEDP_MODULES=common;model;kernels;io;executor;profiler;planner;sweeps" -DSLIDEDP_BUILD_BENCHMARKS=ON -DSLIDEDP_WERROR=OFF
}

# ---- pack (no GPU) ---------------------------------------------------------------------------------
if [ "${1:-}" = "pack" ]; then
  set -e
  build="$root/build-gpu"
  # shellcheck disable=SC2046
  cmake $(cmake_args "$build")
  cmake --build "$build" -j "${SLIDEDP_JOBS:-$(nproc)}" --target "${targets[@]}"
  stage="$(mktemp -d)/slidedp-gpu"
  mkdir -p "$stage/bin" "$stage/lib"
  for t in "${targets[@]}"; do
    f="$(find "$build" -type f -name "$t" -perm -u+x | head -1)"
    cp "$f" "$stage/bin/" && strip "$stage/bin/$t"
  done
  # Shared libraries beyond glibc, the compiler runtime and CUDA's own (the GPU image has those).
  for t in "$stage"/bin/*; do ldd "$t"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcu*|libnccl*|libnv*) ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
  tar -C "$(dirname "$stage")" -cJf "$bundle" slidedp-gpu
  # The device tool carries at most 64 MiB with the working tree (cuda-review D3): keep a margin.
  size=$(stat -c %s "$bundle")
  if [ "$size" -gt $((55 * 1024 * 1024)) ]; then
    echo "the bundle is $((size / 1024 / 1024)) MiB, over the 55 MiB the device machine can carry beside the tree" >&2
    exit 1
  fi
  grep -qx '/.gpu_bundle.tar.xz' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu_bundle.tar.xz' >> "$root/.git/info/exclude"
  echo "packed $(du -h "$bundle" | cut -f1) into $bundle (sm_$arch; git-ignored)"
  echo "device run: command 'scripts/gpu_check.sh', carry ['.gpu_bundle.tar.xz'], timeout_s 600"
  exit 0
fi

# ---- run (GPU machine) -----------------------------------------------------------------------------
start=$(date +%s)
budget="${SLIDEDP_GPU_CHECK_BUDGET_S:-450}"
out="${OUT:-$root/results/gpu/$(date -u +%Y-%m-%dT%H%M%SZ)}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
# run_phase <name> <cap seconds> <log> <command...>: runs under min(cap, budget left); 124 = timed out
run_phase() {
  local name="$1" cap="$2" log="$3"; shift 3
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then say "SKIPPED $name: the ${budget} s budget is spent"; return 125; fi
  [ "$cap" -gt "$l" ] && cap=$l
  echo "== $name (timeout ${cap} s)" | tee -a "$log" >&2
  timeout --kill-after=10 "$cap" "$@" >> "$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && say "TIMEOUT $name after ${cap} s"
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo +dirty)"
  uname -a
  nvidia-smi 2>&1
  nvcc --version 2>&1 | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  ldconfig -p 2>/dev/null | grep -E 'libnccl|libcublasLt|libopenblas|libyaml-cpp' || true
} > "$out/env.txt" 2>&1
gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "SlideDP GPU check | $(date -u +%Y-%m-%dT%H:%M:%SZ) | ${gpu:-no nvidia-smi} | git $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"

# Libraries the binaries may need from the image: CUDA's, and those of the NVIDIA / torch wheels.
# shellcheck source=scripts/lib/gpu_libraries.sh
. "$root/scripts/lib/gpu_libraries.sh"
gpu_libraries_add

bin=""
mode=""
if [ -f "$bundle" ]; then
  dest="$(mktemp -d)"
  tar -C "$dest" -xJf "$bundle"
  export LD_LIBRARY_PATH="$dest/slidedp-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing="$(for t in "$dest"/slidedp-gpu/bin/*; do gpu_libraries_missing "$t"; done | sort -u)"
  # Last resort: the missing libraries wherever the image keeps them.
  for lib in $missing; do
    found="$(find / -xdev -name "$lib*" -type f 2>/dev/null | head -1 || true)"
    [ -n "$found" ] && gpu_libraries_append "$(dirname "$found")"
  done
  missing="$(for t in "$dest"/slidedp-gpu/bin/*; do gpu_libraries_missing "$t"; done | sort -u)"
  { echo "ldd of the bundle's first binary:"; ldd "$(ls "$dest"/slidedp-gpu/bin/* | head -1)" 2>&1; } >> "$out/env.txt"
  if [ -z "$missing" ]; then
    bin="$dest/slidedp-gpu/bin"
    mode="bundle"
  else
    # A source build needs the Debian packages the image does not have: it would only waste the GPU.
    say "STOPPED: the bundle's binaries miss libraries here: $(echo "$missing" | tr '\n' ' ')(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    exit 1
  fi
fi
if [ -z "$bin" ]; then
  build="$root/build-gpu-$arch"
  # shellcheck disable=SC2046
  if run_phase "configure" 120 "$out/build.log" cmake $(cmake_args "$build") &&
     run_phase "build" 300 "$out/build.log" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"; then
    bin="$build"
    mode="build"
  else
    say "BUILD FAILED: see build.log (the Debian dependencies of scripts/install_deps.sh may be missing here; use 'scripts/gpu_check.sh pack' where they exist and carry the bundle)"
    exit 1
  fi
fi
say "binaries: $mode ($bin)"
findbin() { find "$bin" -type f -name "$1" -perm -u+x | head -1; }

# ---- tests: kernels and backend first, the benchmark, then the pipeline tests ----
gtest_line() {  # gtest_line <binary> <log>: "name: N passed, N failed, N skipped (failed: ...)"
  awk -v t="== $1 " '
    index($0, t) == 1 {on = 1; next}
    on && /^== / {exit}
    on && /^\[  PASSED  \] [0-9]+ test/ {p = $4}
    on && /^\[  FAILED  \] [0-9]+ test/ {f = $4}
    on && /^\[  SKIPPED \] [0-9]+ test/ {s = $4}
    on && /^\[  FAILED  \] [A-Za-z]/ && !/ms\)$/ {names = names " " $4}
    END {printf "%s: %d passed, %d failed, %d skipped%s\n", substr(t, 4, length(t) - 4), p, f, s,
         (names != "" ? " (failed:" names ")" : "")}' "$2"
}
run_tests() {
  local t
  for t in "$@"; do
    local exe; exe="$(findbin "$t")"
    if [ -z "$exe" ]; then say "MISSING test binary $t"; continue; fi
    # Kernel tests run with SLIDEDP_CUDA_SYNC=1 so an asynchronous fault is reported at the launch that
    # caused it; executor tests without (that mode blocks a driver thread on its stream, which can
    # wait for a host counter only an aborted run's quiesce releases).
    local sync=0
    case "$t" in test_kernels_cuda_*) sync=1 ;; esac
    case "$t" in
      test_executor_cuda_*) run_each "$t" "$exe" ;;
      *)
        (cd "$root" && SLIDEDP_CUDA_SYNC=$sync run_phase "$t" 240 "$out/tests.log" "$exe" --gtest_color=no)
        local rc=$?
        say "  $(gtest_line "$t" "$out/tests.log") (exit $rc)" ;;
    esac
  done
}
# run_each <name> <binary>: every test of an executor binary alone under 30 s, so that one that hangs
# (the first H200 run: two ranks on one GPU) costs 30 s and the others still report.
run_each() {
  local t="$1" exe="$2" c rc passed=0 failed=0 hung=0 names_f="" names_h=""
  for c in $("$exe" --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    (cd "$root" && run_phase "$t $c" 30 "$out/tests.log" "$exe" --gtest_color=no --gtest_filter="$c")
    rc=$?
    case $rc in
      0) passed=$((passed + 1)) ;;
      124) hung=$((hung + 1)); names_h="$names_h $c" ;;
      125) break ;;  # the budget is spent
      *) failed=$((failed + 1)); names_f="$names_f $c" ;;
    esac
  done
  say "  $t: $passed passed, $failed failed, $hung hung (30 s each)${names_f:+ (failed:$names_f)}${names_h:+ (hung:$names_h)}"
}
say "tests (kernels, backend):"
run_tests "${tests_a[@]}"

say "benchmark:"
bench="$(findbin bench_executor_cuda)"
# shellcheck disable=SC2086
run_phase "bench_executor_cuda" 200 "$out/bench.log" "$bench" --out "$out" ${SLIDEDP_GPU_BENCH_ARGS:-}
bench_rc=$?
grep -v '^\[bench\]' "$out/bench.log" | grep -v '^== ' | tee -a "$summary"
fpt="$(awk -F, '$1=="train"{print $18; exit}' "$out/bench.csv" 2>/dev/null)"
[ $bench_rc -ne 0 ] && say "  bench_executor_cuda exit $bench_rc (see bench.log)"

say "PyTorch reference:"
run_phase "torch_reference" 150 "$out/torch.log" python3 "$root/bench/executor_cuda/torch_reference.py" \
  --out "$out/torch.json" ${fpt:+--flops-per-token "$fpt"}
torch_rc=$?
[ $torch_rc -ne 0 ] && say "  torch_reference exit $torch_rc (see torch.log)"

say "tests (pipeline, training):"
run_tests "${tests_b[@]}"

# ---- the matched-batch comparison measured on this GPU (issue 19 part 4) ----
say "measured matched batch, one GPU (sweeps/specs/measured_one_gpu.yaml):"
sweep="$(findbin slidedp-sweep)"
run_phase "measured_one_gpu" 150 "$out/measured.log" "$sweep" measured "$root/sweeps/specs/measured_one_gpu.yaml" \
  --backend cuda --steps 6 --warmup 2 --quiet --out "$out/measured"
measured_rc=$?
[ $measured_rc -ne 0 ] && say "  slidedp-sweep measured exit $measured_rc (see measured.log)"
[ -f "$out/measured/README.md" ] && awk '/^## (SlideDP|The model)/{on=1} /^## Every/{on=0} on' "$out/measured/README.md" | tee -a "$summary"

# ---- the profiler's per-kernel unit times (CUPTI, issue 23 part 4) ----
say "profiler, per-kernel unit times (slidedp-profile --smoke --kernels):"
run_phase "profile_kernels" 90 "$out/profile.log" "$(findbin slidedp-profile)" --smoke --kernels --no-db \
  --out "$out/profile.yaml"
profile_rc=$?
[ $profile_rc -ne 0 ] && say "  slidedp-profile --kernels exit $profile_rc (see profile.log)"
awk '/Largest kernels per unit operation/{on=1; n=0} on && n++ < 14' "$out/profile.log" | tee -a "$summary"

# ---- the MoE layer's kernels at the 26B-A4B shape: the grouped expert GEMMs beside cuBLASLt's ----
# Last, so a spent budget skips only this. 2 x 1024 tokens route 128 rows to each of 128 experts.
say "profiler, Gemma 4 26B-A4B unit kernels (slidedp-profile --quick --kernels --model gemma-4-26b-a4b):"
run_phase "profile_moe" 90 "$out/profile_moe.log" "$(findbin slidedp-profile)" --quick --kernels --no-db \
  --model gemma-4-26b-a4b --seq 1024 --micro-batches 2 --out "$out/profile_moe.yaml"
profile_moe_rc=$?
[ $profile_moe_rc -ne 0 ] && say "  slidedp-profile --model gemma-4-26b-a4b exit $profile_moe_rc (see profile_moe.log)"
grep -E "bf16_gemm_tflops|TFLOP/s" "$out/profile_moe.log" | head -3 | tee -a "$summary"
awk '/Largest kernels per unit operation/{on=1; n=0} on && n++ < 24' "$out/profile_moe.log" | tee -a "$summary"

# ---- the model's fidelity on this GPU (issue 10): its own profile, then the validation plans ----
# Last of all, so a spent budget skips only this: the unit times measured here, then every validation
# plan of one rank run for real and predicted from that profile (results/gpu/README.md).
say "model fidelity on this GPU (slidedp-profile --quick, slidedp-sweep fidelity --backend cuda):"
if run_phase "fidelity_profile" 90 "$out/fidelity.log" "$(findbin slidedp-profile)" --quick --no-db --model slidedp-tiny \
     --seq 128 --out "$out/gpu-profile.yaml"; then
  run_phase "fidelity" 150 "$out/fidelity.log" "$sweep" fidelity --backend cuda --max-ranks 1 \
    --profile "$out/gpu-profile.yaml" --steps 12 --warmup 3 --rounds 2 --out "$out/fidelity"
  fidelity_rc=$?
  [ $fidelity_rc -ne 0 ] && say "  slidedp-sweep fidelity exit $fidelity_rc (see fidelity.log)"
  [ -f "$out/fidelity/README.md" ] && head -40 "$out/fidelity/README.md" | tee -a "$summary"
else
  say "  slidedp-profile --quick failed (see fidelity.log)"
fi

# ---- summary: the issue's targets ----
python3 - "$out" <<'EOF' | tee -a "$summary"
import csv, json, os, sys
out = sys.argv[1]
rows = {}
try:
    with open(os.path.join(out, "bench.csv")) as f:
        for r in csv.reader(l for l in f if not l.startswith("#")):
            if r and r[0] == "train":
                rows[r[1]] = {"tokens_per_s": float(r[5]), "tflops": float(r[6]), "compute_s": float(r[7]),
                              "step_s": float(r[4]), "tokens": float(r[3]), "exposed_s": float(r[11]),
                              "h2d_gbps": float(r[14]), "d2h_gbps": float(r[15])}
            elif r and r[0] == "link":
                print(f"  link {r[1]}: {float(r[14]):.1f} GB/s")
except (OSError, ValueError, IndexError) as e:
    print(f"  no benchmark rows ({e})")
for name, r in rows.items():
    print(f"  {name:9s} {r['tokens_per_s']:10.0f} tokens/s {r['tflops']:7.1f} TFLOP/s  step {r['step_s']:.3f} s"
          f"  exposed {r['exposed_s']:.3f} s  H2D {r['h2d_gbps']:.1f} GB/s  D2H {r['d2h_gbps']:.1f} GB/s")
if "streamed" in rows and "resident" in rows:
    ratio = rows["streamed"]["tokens_per_s"] / rows["resident"]["tokens_per_s"]
    print(f"  target streamed >= 90% of resident: {100 * ratio:.1f}% -> {'MET' if ratio >= 0.9 else 'NOT MET'}")
try:
    t = json.load(open(os.path.join(out, "torch.json")))
    print(f"  torch     {t['tokens_per_s']:10.0f} tokens/s (fwd+bwd {t['fwdbwd_s']:.3f} s, AdamW {t['optimizer_s']:.3f} s"
          f" per step, {t['torch']})")
    if "resident" in rows:
        ours_step = rows["resident"]["step_s"]
        ours_compute = rows["resident"]["compute_s"]
        print(f"  target resident step no slower than PyTorch's: {ours_step:.3f} s vs {t['step_s']:.3f} s -> "
              f"{'MET' if ours_step <= t['step_s'] else 'NOT MET'}"
              f" (GPU compute alone: {ours_compute:.3f} s vs PyTorch fwd+bwd {t['fwdbwd_s']:.3f} s)")
except (OSError, ValueError, KeyError) as e:
    print(f"  no PyTorch reference ({e})")
EOF
say "elapsed $(( $(date +%s) - start )) s; results in $out"
# The device tool brings back at most 8 files from $OUT, two folders deep: everything but the
# summary travels in one tarball (results/gpu/README.md says how to unpack it).
if [ -n "${OUT:-}" ]; then
  (cd "$out" && ls -A | grep -vx -e summary.txt -e logs.tar.gz | tar -czf logs.tar.gz --remove-files -T -)
fi
