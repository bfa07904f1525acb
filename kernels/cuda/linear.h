// The GEMM shorthands of the GPU units (kernels/cuda/units.cc, gemma4_unit.cc): a linear layer's
// forward and its two backward products as cuBLASLt calls on row-major buffers, weights (OUT, IN) as
// in the checkpoint. `ws` is the cuBLASLt workspace carved by the unit.
#pragma once

#include <cstdint>

#include "kernels/cuda/units.h"

namespace slidedp::kernels::cuda {

// out (N, OUT) = in (N, IN) w^T [+ residual (N, OUT)]; bf16 out.
void linear_forward(const UnitContext& ctx, void* ws, bf16* out, const bf16* in, const bf16* w, int64_t N,
                    int64_t IN, int64_t OUT, const bf16* residual = nullptr);
// din (N, IN) = dout (N, OUT) w (OUT, IN), fp32 out, overwritten or accumulated.
void linear_backward_input_f32(const UnitContext& ctx, void* ws, float* din, const bf16* dout, const bf16* w,
                               int64_t N, int64_t IN, int64_t OUT, bool accumulate);
// din (N, IN) = dout (N, OUT) w (OUT, IN), bf16 out.
void linear_backward_input_bf16(const UnitContext& ctx, void* ws, bf16* din, const bf16* dout, const bf16* w,
                                int64_t N, int64_t IN, int64_t OUT);
// dw (OUT, IN) += dout^T (OUT, N) in (N, IN), fp32.
void linear_backward_weight(const UnitContext& ctx, void* ws, float* dw, const bf16* dout, const bf16* in,
                            int64_t N, int64_t IN, int64_t OUT);

}  // namespace slidedp::kernels::cuda
