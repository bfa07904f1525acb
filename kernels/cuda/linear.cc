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

}  // namespace slidedp::kernels::cuda
