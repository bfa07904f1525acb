// RMSNorm on the GPU, as kernels/cpu/transformer/rmsnorm.h: rstd = 1/sqrt(mean(x^2) + eps),
// y = w * (x * rstd) over rows of C. Used for the input / post-attention / final norms (rows =
// tokens) and Qwen3's q/k norm (rows = tokens x heads, C = head_dim). One warp per row; fp32
// arithmetic on bf16 storage. The weight gradient is a deterministic two-stage column reduction
// (row segments, then segments in order), so results do not depend on scheduling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scratch_sizes.h"  // rmsnorm_backward_workspace_bytes

namespace slidedp::kernels::cuda {

// y (N, C) = rmsnorm(x (N, C)) * (w (C) + w_offset); rstd (N) fp32 saved for backward. y may not
// alias x. A null w is a weightless norm (w = 1), in backward too (where dw must then be null);
// w_offset 1 is Qwen3.6's zero-centred norm x * (1 + w) (its weight gradient is the plain one).
void rmsnorm_forward(__nv_bfloat16* y, float* rstd, const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t N,
                     int64_t C, double eps, cudaStream_t stream, float w_offset = 0.0f);

// Backward of one RMSNorm, with the dtypes the decoder and head need (fp32 where a gradient is a
// sum of GEMMs kept in fp32, bf16 where it feeds a GEMM):
//   dx (N, C)  = residual + rstd * (w*dy - xhat * mean(w*dy * xhat)),  xhat = x * rstd
//   dw (C)    += sum over rows of dy * xhat                      (skipped when dw == nullptr)
struct RmsnormBackwardArgs {
  const void* dy = nullptr;  // (N, C), fp32 if dy_f32 else bf16
  bool dy_f32 = true;
  const __nv_bfloat16* x = nullptr;  // (N, C) forward input
  const float* rstd = nullptr;       // (N)
  const __nv_bfloat16* w = nullptr;  // (C)
  float w_offset = 0.0f;             // the weight is w + w_offset (rmsnorm_forward's)
  const void* residual = nullptr;    // (N, C) added to dx, or nullptr; fp32 if residual_f32 else bf16
  bool residual_f32 = false;
  // (N, C) output, fp32 if dx_f32 else bf16; may alias neither dy nor x, but may be the residual (same
  // dtype: dx += the norm's backward, in place)
  void* dx = nullptr;
  bool dx_f32 = false;
  float* dw = nullptr;  // (C) accumulated, or nullptr
  int64_t N = 0, C = 0;
};
void rmsnorm_backward(const RmsnormBackwardArgs& a, void* workspace, cudaStream_t stream);

// The same with the forward's operands in one brace list, so each call site of a unit is one line:
// the norm (dy, x, rstd, w, dw, rows, width, weight offset) and where its gradient goes.
struct RmsnormGrad {
  const void* dy;
  bool dy_f32;
  const __nv_bfloat16* x;
  const float* rstd;
  const __nv_bfloat16* w;
  float* dw;
  int64_t N, C;
  float w_offset = 0.0f;
};
void rmsnorm_backward(const RmsnormGrad& g, void* dx, bool dx_f32, const void* residual, bool residual_f32,
                      void* workspace, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
