// The elementwise and per-head passes of the Gated DeltaNet mixer on the GPU, as
// kernels/cpu/transformer/gated_deltanet.cc's (conv, SiLU, the l2-normalised q / k split, the decay
// and beta gates, the gated RMSNorm), with their backwards. fp32 wherever the delta rule reads or
// writes (gated_delta_rule.h); bf16 where a GEMM takes the operand. Documents of a packed sequence
// (positions, 0 at a document start) restart the conv window as they restart the recurrence. Every
// reduction runs in a fixed order: deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scratch_sizes.h"  // deltanet_gated_norm_workspace_bytes

namespace slidedp::kernels::cuda {

struct ConvShape {
  int64_t B = 0, T = 0, D = 0, K = 0;  // sequences, tokens, channels (qkv_dim), taps
  const int32_t* positions = nullptr;  // (B, T) or null: one document per sequence
};

// From dconv (N, D): dmixed (N, D) bf16 overwritten, dw (D, K) accumulated (rows in order per tap).
void deltanet_conv_backward(__nv_bfloat16* dmixed, float* dw, const float* dconv, const __nv_bfloat16* mixed,
                            const __nv_bfloat16* w, const ConvShape& s, cudaStream_t stream);

struct HeadsShape {
  int64_t N = 0, nk = 0, dk = 0, nv = 0, dv = 0;
  float q_scale = 1.0f;  // dk^-1/2
  int64_t qkv_dim() const { return 2 * nk * dk + nv * dv; }
};
// The delta rule's inputs from the qkv projection in one pass, the conv and SiLU computed where they
// are read (nothing of width qkv_dim is stored): act = silu(causal depthwise conv of mixed with w
// (D, K) inside each document); q, k (N, nk, dk) = l2norm per head of act's q and k parts (q times
// q_scale); v (N, nv, dv) = act's v part.
void deltanet_prepare_forward(float* q, float* k, float* v, const __nv_bfloat16* mixed,
                              const __nv_bfloat16* w, const ConvShape& c, const HeadsShape& s,
                              cudaStream_t stream);
// dconv (N, D) from dq, dk, dv through the split, the l2norms and SiLU (the conv recomputed likewise).
void deltanet_prepare_backward(float* dconv, const float* dq, const float* dk, const float* dv,
                               const __nv_bfloat16* mixed, const __nv_bfloat16* w, const ConvShape& c,
                               const HeadsShape& s, cudaStream_t stream);

// beta = sigmoid(braw), g = -exp(A_log[h]) softplus(araw + dt_bias[h]); all (N, nv) but the (nv) parameters.
void deltanet_gates_forward(float* beta, float* g, const float* braw, const float* araw,
                            const __nv_bfloat16* A_log, const __nv_bfloat16* dt_bias, int64_t N, int64_t nv,
                            cudaStream_t stream);
// dbraw, daraw (bf16, the projections' GEMM operands) overwritten; dA_log, ddt_bias (nv) accumulated.
void deltanet_gates_backward(__nv_bfloat16* dbraw, __nv_bfloat16* daraw, float* dA_log, float* ddt_bias,
                             const float* dbeta, const float* dg, const float* beta, const float* g,
                             const float* araw, const __nv_bfloat16* A_log, const __nv_bfloat16* dt_bias,
                             int64_t N, int64_t nv, cudaStream_t stream);

// gated (N, nv, dv) bf16 = silu(z) * (w * rmsnorm(o)) per value head; rstd (N * nv) written, or read
// when `recompute` (then gated is bitwise the forward's).
void deltanet_gated_norm_forward(__nv_bfloat16* gated, float* rstd, const float* o, const __nv_bfloat16* z,
                                 const __nv_bfloat16* w, int64_t N, int64_t nv, int64_t dv, double eps,
                                 bool recompute, cudaStream_t stream);
// From dgated (N, nv, dv) fp32: dz (bf16) and do_ (fp32) overwritten, dw (dv) accumulated.
void deltanet_gated_norm_backward(__nv_bfloat16* dz, float* do_, float* dw, const float* dgated,
                                  const float* o, const float* rstd, const __nv_bfloat16* z,
                                  const __nv_bfloat16* w, int64_t N, int64_t nv, int64_t dv, void* workspace,
                                  cudaStream_t stream);  // deltanet_gated_norm_workspace_bytes

}  // namespace slidedp::kernels::cuda
