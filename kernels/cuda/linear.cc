// The GEMM shorthands of the GPU units; see linear.h.
#include "kernels/cuda/linear.h"

namespace slidedp::kernels::cuda {

// out (N, OUT) = in (N, IN) w^T [+ residual (N, OUT)]; bf16 out.
void linear_forward(const UnitContext& ctx, void* ws, bf16* out, const bf16* in, const bf16* w, int64_t N,
                    int64_t IN, int64_t OUT, const bf16* residual) {
  GemmArgs g;
  g.trans_a = false, g.trans_b = true;
  g.M = N, g.N = OUT, g.K = IN;
  g.A = in, g.lda = IN, g.B = w, g.ldb = IN;
  g.beta = residual != nullptr ? 1.0f : 0.0f;
  g.C = residual, g.ldc = OUT;
  g.D = out, g.ldd = OUT;
  ctx.gemm->run(g, ws, ctx.stream);
}

// out (N, OUT) fp32 = alpha in (N, IN) w^T.
void linear_forward_f32(const UnitContext& ctx, void* ws, float* out, const bf16* in, const bf16* w, int64_t N,
                        int64_t IN, int64_t OUT, float alpha) {
  GemmArgs g;
  g.trans_b = true;
  g.M = N, g.N = OUT, g.K = IN, g.alpha = alpha;
  g.A = in, g.lda = IN, g.B = w, g.ldb = IN;
  g.D = out, g.ldd = OUT, g.out_f32 = true;
  ctx.gemm->run(g, ws, ctx.stream);
}

// din (N, IN) = dout (N, OUT) w (OUT, IN), fp32 out, overwritten or accumulated.
void linear_backward_input_f32(const UnitContext& ctx, void* ws, float* din, const bf16* dout, const bf16* w,
                               int64_t N, int64_t IN, int64_t OUT, bool accumulate) {
  GemmArgs g;
  g.M = N, g.N = IN, g.K = OUT;
  g.A = dout, g.lda = OUT, g.B = w, g.ldb = IN;
  g.beta = accumulate ? 1.0f : 0.0f;
  g.D = din, g.ldd = IN, g.out_f32 = true;
  ctx.gemm->run(g, ws, ctx.stream);
}

// din (N, IN) = dout (N, OUT) w (OUT, IN), bf16 out.
void linear_backward_input_bf16(const UnitContext& ctx, void* ws, bf16* din, const bf16* dout, const bf16* w,
                                int64_t N, int64_t IN, int64_t OUT) {
  GemmArgs g;
  g.M = N, g.N = IN, g.K = OUT;
  g.A = dout, g.lda = OUT, g.B = w, g.ldb = IN;
  g.D = din, g.ldd = IN;
  ctx.gemm->run(g, ws, ctx.stream);
}

// dw (OUT, IN) += dout^T (OUT, N) in (N, IN), fp32.
void linear_backward_weight(const UnitContext& ctx, void* ws, float* dw, const bf16* dout, const bf16* in,
                            int64_t N, int64_t IN, int64_t OUT) {
  GemmArgs g;
  g.trans_a = true;
  g.M = OUT, g.N = IN, g.K = N;
  g.A = dout, g.lda = OUT, g.B = in, g.ldb = IN;
  g.beta = 1.0f;
  g.D = dw, g.ldd = IN, g.out_f32 = true;
  ctx.gemm->run(g, ws, ctx.stream);
}

void gated_mlp_backward(const UnitContext& ctx, void* ws, const GatedMlp& mlp, const bf16* dout, const bf16* in,
                        const bf16* g, const bf16* u, bf16* m_du, bf16* dm_dg, float* din, int64_t N, int64_t C,
                        int64_t I) {
  mlp.activation(m_du, g, u, N * I, ctx.stream);  // m, not saved
  // dm = dout Wd; dWd += dout^T m
  linear_backward_input_bf16(ctx, ws, dm_dg, dout, mlp.down_w, N, I, C);
  linear_backward_weight(ctx, ws, mlp.d_down_w, dout, m_du, N, I, C);
  // dg, du (in place over dm and m)
  mlp.activation_backward(dm_dg, m_du, dm_dg, g, u, N * I, ctx.stream);
  // din (fp32) = dg Wg + du Wu; dWg += dg^T in; dWu += du^T in
  linear_backward_input_f32(ctx, ws, din, dm_dg, mlp.gate_w, N, C, I, false);
  linear_backward_input_f32(ctx, ws, din, m_du, mlp.up_w, N, C, I, true);
  linear_backward_weight(ctx, ws, mlp.d_gate_w, dm_dg, in, N, C, I);
  linear_backward_weight(ctx, ws, mlp.d_up_w, m_du, in, N, C, I);
}

}  // namespace slidedp::kernels::cuda
