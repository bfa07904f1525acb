// nn.Linear on the CPU through BLAS: weights are stored as in the checkpoint, (OUT, IN) row-major,
// so forward is in * W^T and the weight gradient is dout^T * in. Biases (Qwen2 q/k/v) optional.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// out (N, OUT) = in (N, IN) * w (OUT, IN)^T + bias (OUT, or nullptr).
// accumulate_out: out += ... instead (the residual adds fold into the GEMM's beta = 1).
template <typename Real>
void linear_forward(Real* out, const Real* in, const Real* w, const Real* bias, int64_t N, int64_t IN,
                    int64_t OUT, bool accumulate_out);

// din (N, IN)  = dout (N, OUT) * w (OUT, IN)        (or += when accumulate_din; din may be nullptr)
// dw (OUT, IN) += dout^T * in                         (always accumulated: micro-batches add up)
// dbias (OUT)  += sum over rows of dout               (skipped when dbias is nullptr)
template <typename Real>
void linear_backward(Real* din, Real* dw, Real* dbias, const Real* dout, const Real* in, const Real* w,
                     int64_t N, int64_t IN, int64_t OUT, bool accumulate_din);

}  // namespace slidedp::kernels
