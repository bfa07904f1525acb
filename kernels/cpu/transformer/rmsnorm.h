// RMSNorm as in transformers' LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm:
//   rstd = 1 / sqrt(mean(x^2) + eps),  y = w * (x * rstd)   over each row of C elements.
// Used for input/post-attention/final norms (rows = tokens, C = hidden) and for Qwen3's q/k norm
// (rows = tokens x heads, C = head_dim). The sum of squares is accumulated in double: it costs
// nothing next to the GEMMs and removes the length-C rounding drift from the fp32 path.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// y (N, C) = rmsnorm(x (N, C)) * w (C); rstd (N) saved for backward. y may not alias x. w == nullptr:
// the weightless norm (w = 1; Gemma 4's v_norm and router norm), and backward then takes dw == nullptr.
template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t N, int64_t C, double eps);

// y (N, C) = w * (x * rstd) from an rstd rmsnorm_forward saved: bitwise its output, without the sum
// of squares (backward passes that rebuild a norm's output).
template <typename Real>
void rmsnorm_apply(Real* y, const Real* rstd, const Real* x, const Real* w, int64_t N, int64_t C);

// From dy (N, C), the forward input x and saved rstd:
//   dx (N, C)  = rstd * (w*dy - xhat * mean(w*dy * xhat)),  xhat = x * rstd   (overwritten, or
//                added to dx when accumulate_dx; the residual stream uses the latter)
//   dw (C)    += sum over rows of dy * xhat                                   (always accumulated)
// dx may not alias dy or x.
template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* rstd, const Real* w,
                      int64_t N, int64_t C, bool accumulate_dx);

}  // namespace slidedp::kernels
