// The small passes of Qwen3.6's gated attention and MoE feed-forward on the GPU, as
// kernels/cpu/transformer/qwen3_5_layer.cc's loops: the interleaved [query | gate] rows of q_proj,
// the output gate sigmoid(gate) on the attention output, and the shared expert's per-token sigmoid
// gate, each with its backward. bf16 storage, fp32 arithmetic, one rounding per output.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::kernels::cuda {

// qp (rows, 2 hd) holds per head hd query values then hd gate values (rows = tokens x heads):
// q (rows, hd) and gate (rows, hd) out of it, or (backward) dqp out of dq and dgate.
void split_query_gate(__nv_bfloat16* q, __nv_bfloat16* gate, const __nv_bfloat16* qp, int64_t rows,
                      int64_t hd, cudaStream_t stream);
void join_query_gate(__nv_bfloat16* qp, const __nv_bfloat16* q, const __nv_bfloat16* gate, int64_t rows,
                     int64_t hd, cudaStream_t stream);

// og (n) = att * sigmoid(gate).
void output_gate_forward(__nv_bfloat16* og, const __nv_bfloat16* att, const __nv_bfloat16* gate, int64_t n,
                         cudaStream_t stream);
// datt = dog * sigmoid(gate), dgate = dog * att * s (1 - s), s = sigmoid(gate).
void output_gate_backward(__nv_bfloat16* datt, __nv_bfloat16* dgate, const __nv_bfloat16* dog,
                          const __nv_bfloat16* att, const __nv_bfloat16* gate, int64_t n,
                          cudaStream_t stream);

// y (N, C) = h1 + routed + sigmoid(slogit[t]) * shared (the MoE layer's output).
void shared_gate_forward(__nv_bfloat16* y, const __nv_bfloat16* h1, const __nv_bfloat16* routed,
                         const __nv_bfloat16* shared, const float* slogit, int64_t N, int64_t C,
                         cudaStream_t stream);
// From dy: dshared (N, C) = sigmoid(slogit) dy (bf16, its GEMMs' operand) and dslogit (N) =
// (dy . shared) s (1 - s); one warp per token, its dot product in a fixed order.
void shared_gate_backward(__nv_bfloat16* dshared, float* dslogit, const __nv_bfloat16* dy,
                          const __nv_bfloat16* shared, const float* slogit, int64_t N, int64_t C,
                          cudaStream_t stream);

// The shared expert's gate logit, a projection to one value: slogit (N) = u (N, C) . w (C), one warp
// per token; its backward du (N, C) += dslogit w and dw (C) += sum over tokens in order of dslogit u.
// (A GEMM with one output column would do the same work with a harder shape for cuBLASLt.)
void shared_gate_logit(float* slogit, const __nv_bfloat16* u, const __nv_bfloat16* w, int64_t N, int64_t C,
                       cudaStream_t stream);
void shared_gate_logit_backward(float* du, float* dw, const float* dslogit, const __nv_bfloat16* u,
                                const __nv_bfloat16* w, int64_t N, int64_t C, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
