// The GEMM shorthands of the GPU units (kernels/cuda/units.cc, gemma4_unit.cc): a linear layer's
// forward and its two backward products as cuBLASLt calls on row-major buffers, weights (OUT, IN) as
// in the checkpoint, and the gated MLP's backward built from them. `ws` is the cuBLASLt workspace
// carved by the unit.
#pragma once

#include <cstdint>

#include "kernels/cuda/unit_context.h"

namespace slidedp::kernels::cuda {

// out (N, OUT) = in (N, IN) w^T [+ residual (N, OUT)]; bf16 out.
void linear_forward(const UnitContext& ctx, void* ws, bf16* out, const bf16* in, const bf16* w, int64_t N,
                    int64_t IN, int64_t OUT, const bf16* residual = nullptr);
// out (N, OUT) fp32 = alpha in (N, IN) w^T (router logits, small projections the next step reads in fp32).
void linear_forward_f32(const UnitContext& ctx, void* ws, float* out, const bf16* in, const bf16* w, int64_t N,
                        int64_t IN, int64_t OUT, float alpha = 1.0f);
// din (N, IN) = dout (N, OUT) w (OUT, IN), fp32 out, overwritten or accumulated.
void linear_backward_input_f32(const UnitContext& ctx, void* ws, float* din, const bf16* dout, const bf16* w,
                               int64_t N, int64_t IN, int64_t OUT, bool accumulate);
// din (N, IN) = dout (N, OUT) w (OUT, IN), bf16 out.
void linear_backward_input_bf16(const UnitContext& ctx, void* ws, bf16* din, const bf16* dout, const bf16* w,
                                int64_t N, int64_t IN, int64_t OUT);
// dw (OUT, IN) += dout^T (OUT, N) in (N, IN), fp32.
void linear_backward_weight(const UnitContext& ctx, void* ws, float* dw, const bf16* dout, const bf16* in,
                            int64_t N, int64_t IN, int64_t OUT);

// The gated MLP's weights, their gradients and its activation (SwiGLU or GeGLU, elementwise.h).
struct GatedMlp {
  const bf16 *gate_w, *up_w, *down_w;     // (I, C), (I, C), (C, I)
  float *d_gate_w, *d_up_w, *d_down_w;    // accumulated
  void (*activation)(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream);
  void (*activation_backward)(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n,
                              cudaStream_t stream);
};
// Backward of out (N, C) = (act(g) * u) Wd^T with g = in Wg^T, u = in Wu^T: m recomputed into m_du
// (N, I), dm into dm_dg, then dg and du in place of them; din (N, C) fp32 = dg Wg + du Wu
// (overwritten); the three weight gradients accumulated.
void gated_mlp_backward(const UnitContext& ctx, void* ws, const GatedMlp& mlp, const bf16* dout, const bf16* in,
                        const bf16* g, const bf16* u, bf16* m_du, bf16* dm_dg, float* din, int64_t N, int64_t C,
                        int64_t I);

}  // namespace slidedp::kernels::cuda
