// bf16 GEMMs through cuBLASLt with fp32 accumulation, in the ROW-MAJOR convention of
// kernels/cpu/transformer/blas.h: D (M, N) = alpha * op(A) (M, K) op(B) (K, N) + beta * C (M, N).
// A and B are bf16; C and D are bf16 or fp32 (fp32 for parameter gradients accumulated with beta = 1
// and for gradients kept in fp32 between GEMMs). C may differ from D (the residual add x2 = x + att Wo^T
// writes D = x2 with C = x). With beta != 0 and a bf16 D, cuBLASLt may round the product to bf16
// before adding beta C: two roundings instead of one (seen on an H200; the bound of the CudaGemm test
// in tests/kernels/cuda/ops_test.cc allows for it). One GemmContext per device: its cuBLASLt handle
// and a cache of matmul plans keyed by everything cuBLASLt's heuristic sees (shape, transposes,
// leading dimensions, dtypes, pointer alignment), so each distinct GEMM is planned once. The
// workspace comes from the caller (carved from the unit operation's workspace, so the device budget
// accounts for it).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/scratch_sizes.h"  // kGemmWorkspaceBytes

namespace slidedp::kernels::cuda {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const __nv_bfloat16* A = nullptr;  // op(A) is (M, K); A is (M, K) or (K, M) row-major with stride lda
  int64_t lda = 0;
  const __nv_bfloat16* B = nullptr;  // op(B) is (K, N)
  int64_t ldb = 0;
  const void* C = nullptr;  // (M, N), read when beta != 0 (nullptr: C = D)
  int64_t ldc = 0;          // 0: ldd
  void* D = nullptr;        // (M, N) output
  int64_t ldd = 0;
  bool out_f32 = false;  // C and D dtype: fp32, else bf16
};

class GemmContext {
 public:
  // Creates the cuBLASLt handle on the current device.
  GemmContext();
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  // Enqueues the GEMM on `stream`. workspace: kGemmWorkspaceBytes of device memory used only by
  // GEMMs on this stream. Throws RuntimeError (via SLIDEDP_CUDA_CHECK) on a cuBLASLt failure.
  void run(const GemmArgs& args, void* workspace, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slidedp::kernels::cuda
