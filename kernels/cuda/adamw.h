// FSDP2's optimizer on the GPU (executor --system fsdp2): AdamW over fp32 state in device memory and
// the fp32 gradient accumulation before it. The per-element arithmetic is kernels/cpu/optim/adamw.h's,
// operation for operation (fmaf, IEEE sqrtf and division; nvcc contracts nothing here because every
// multiply-add is written as fmaf or kept apart by the order of the formulas), with the constants
// derived by the same host function (kernels::adamw_constants), so a GPU update equals the CPU's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/optim/adamw.h"

namespace slidedp::kernels::cuda {

// param, exp_avg, exp_avg_sq and grad: n fp32 values each, device memory, not overlapping.
void adamw(float* param, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n, const AdamwConstants& c,
           cudaStream_t stream);

// dst (n) += src (n), fp32.
void add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream);

// *count += the number of NaN and infinite values in x (n), fp32; count: one uint32 in device memory.
// The check every system makes before an update applies a gradient.
void count_nonfinite_f32(const float* x, int64_t n, unsigned int* count, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
