// AdamW and fp32 accumulation on the GPU; see adamw.h. Memory-bound grid-stride loops.
#include "kernels/cuda/adamw.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// The order of kernels/cpu/optim/kernels_scalar.cc's adamw_element. __fmul_rn / __fadd_rn keep the
// products that the CPU rounds separately from being contracted into an fma.
__global__ void adamw_kernel(float* __restrict__ param, float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                             const float* __restrict__ grad, int64_t n, AdamwConstants c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = __fmul_rn(__fmul_rn(grad[i], c.grad_scale), c.clip_coef);
    const float m = fmaf(exp_avg[i], c.beta1, __fmul_rn(g, c.one_minus_beta1));
    const float v = fmaf(exp_avg_sq[i], c.beta2, __fmul_rn(__fmul_rn(g, g), c.one_minus_beta2));
    const float denom = fmaf(__fsqrt_rn(v), c.inv_sqrt_bias_correction2, c.eps);
    const float p = fmaf(c.neg_step_size, __fdiv_rn(m, denom), __fmul_rn(param[i], c.decay));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
  }
}

__global__ void add_f32_kernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

// One atomic per block: a block counts its elements, then thread 0 adds the block's count.
__global__ void count_nonfinite_kernel(const float* __restrict__ x, int64_t n, unsigned int* count) {
  __shared__ unsigned int block_count;
  if (threadIdx.x == 0) block_count = 0;
  __syncthreads();
  unsigned int mine = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    mine += isfinite(x[i]) ? 0u : 1u;
  if (mine > 0) atomicAdd(&block_count, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_count > 0) atomicAdd(count, block_count);
}

}  // namespace

void count_nonfinite_f32(const float* x, int64_t n, unsigned int* count, cudaStream_t stream) {
  if (n <= 0) return;
  count_nonfinite_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, count);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "count_nonfinite_f32");
}

void adamw(float* param, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n, const AdamwConstants& c,
           cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, exp_avg, exp_avg_sq, grad, n, c);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "adamw");
}

void add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "add_f32");
}

}  // namespace slidedp::kernels::cuda
