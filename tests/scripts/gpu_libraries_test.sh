#!/usr/bin/env bash
# scripts/lib/gpu_libraries.sh, the GPU check's library search (cuda-review D1, D2), on a fake layout:
# with LD_LIBRARY_PATH unset and `set -u` (the GPU image exports none), the CUDA toolkit's lib64 and
# the wheels' lib/ folders -- CUDA 13's cuBLAS and runtime under nvidia/cu13/lib, NCCL under
# nvidia/nccl/lib -- are found in that order, with no empty entry; an existing value is kept first.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda/lib64" "$tmp/site/nvidia/cu13/lib" "$tmp/site/nvidia/nccl/lib"
# A regular package, so it shadows any nvidia wheel this machine's python3 may have.
touch "$tmp/site/nvidia/__init__.py"
fail() { echo "FAIL: $*"; exit 1; }

check() {  # check <expected prefix> <what>
  case "$LD_LIBRARY_PATH" in
    "$1"|"$1":*) ;;
    *) fail "$2: LD_LIBRARY_PATH='$LD_LIBRARY_PATH', expected it to start with '$1'" ;;
  esac
  case ":$LD_LIBRARY_PATH:" in *::*) fail "$2: an empty entry in '$LD_LIBRARY_PATH'" ;; esac
}

want="$tmp/cuda/lib64:$tmp/site/nvidia/cu13/lib:$tmp/site/nvidia/nccl/lib"
(
  unset LD_LIBRARY_PATH
  export CUDA_HOME="$tmp/cuda" PYTHONPATH="$tmp/site"
  . "$root/scripts/lib/gpu_libraries.sh"
  gpu_libraries_add
  check "$want" "unset before"
) || exit 1
(
  export LD_LIBRARY_PATH="/opt/x" CUDA_HOME="$tmp/cuda" PYTHONPATH="$tmp/site"
  . "$root/scripts/lib/gpu_libraries.sh"
  gpu_libraries_add
  check "/opt/x:$want" "set before"
) || exit 1
(
  . "$root/scripts/lib/gpu_libraries.sh"
  [ -z "$(gpu_libraries_missing /bin/sh)" ] || fail "/bin/sh reported missing libraries"
) || exit 1
echo "ok: $want"
