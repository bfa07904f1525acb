# Sourced by scripts/gpu_check.sh (and its test, tests/scripts/gpu_libraries_test.sh): where the GPU
# machine keeps the shared libraries the bundle's binaries need from the image (cuBLASLt, the CUDA
# runtime, NCCL; and CUPTI, which --trace-kernels opens at run time). Safe under `set -u` with LD_LIBRARY_PATH unset.

# Appends folder $1 to LD_LIBRARY_PATH (no empty entry when it was unset or empty).
gpu_libraries_append() {
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$1"
}

# Adds every folder that may hold them: the CUDA toolkit's under ${CUDA_HOME:-/usr/local/cuda}, then
# the lib/ folders of the NVIDIA and torch Python wheels python3 can import. CUDA 13's wheels put
# cuBLAS and the runtime under nvidia/cu13/lib; NCCL stays at nvidia/nccl/lib; torch bundles some in
# torch/lib.
gpu_libraries_add() {
  local cuda="${CUDA_HOME:-/usr/local/cuda}" d
  for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib" "$cuda/extras/CUPTI/lib64"; do
    [ -d "$d" ] && gpu_libraries_append "$d"
  done
  local pylibs
  pylibs="$(python3 - <<'PY' 2>/dev/null || true
import importlib, os
for m in ("nvidia.cu13", "nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cuda_cupti", "torch"):
    try:
        mod = importlib.import_module(m)
    except Exception:
        continue
    for p in getattr(mod, "__path__", []):
        if os.path.isdir(os.path.join(p, "lib")):
            print(os.path.join(p, "lib"))
PY
)"
  for d in $pylibs; do gpu_libraries_append "$d"; done
  return 0
}

# The libraries a binary needs that the loader cannot find (one per line; empty when all load).
gpu_libraries_missing() {
  ldd "$1" 2>/dev/null | awk '/not found/ {print $1}'
}
