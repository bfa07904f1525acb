// Softmax / loss / dlogits of a logits chunk and the final loss sum; see cross_entropy.h. One block
// per row; the three passes over the row (max, sum of exp, write) follow cross_entropy.cc's loop.
#include <cuda_bf16.h>

#include <cmath>

#include "common/error.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"

namespace slidedp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 512;
constexpr int32_t kIgnoreIndex = -100;  // as kernels/cpu/transformer/cross_entropy.h

// Block-wide reductions through shared memory (kThreads / 32 warps); every thread gets the result.
__device__ float block_max(float v, float* smem) {
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float r = lane < blockDim.x / 32 ? smem[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

__device__ double block_sum(double v, double* smem) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double r = lane < blockDim.x / 32 ? smem[lane] : 0.0;
  r = warp_sum(r);
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) cross_entropy_chunk_kernel(float* __restrict__ logits,
                                                                        bf16* __restrict__ dlogits,
                                                                        double* __restrict__ loss_rows,
                                                                        const int32_t* __restrict__ targets, int64_t V,
                                                                        double grad_scale, float cap) {
  __shared__ float fmem[kThreads / 32];
  __shared__ double dmem[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* row = logits + r * V;  // (V)
  bf16* drow = dlogits + r * V;       // (V)
  const int32_t target = targets[r];
  if (target == kIgnoreIndex || target < 0 || target >= V) {
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) drow[c] = to_bf16(0.0f);
    if (threadIdx.x == 0) loss_rows[r] = target == kIgnoreIndex ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
    return;
  }
  // Each thread caps the columns it later reads; block_max's barrier orders the cap before thread
  // 0 reads the target's logit.
  if (cap > 0.0f)
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) row[c] = math::softcap(row[c], cap);
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) mx = fmaxf(mx, row[c]);
  mx = block_max(mx, fmem);
  float part = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) part += expf(row[c] - mx);
  const double sum = block_sum(static_cast<double>(part), dmem);
  // dlogits = grad_scale * softmax, minus grad_scale at the target (cross_entropy.cc: row *= factor;
  // row[target] -= scale, in fp32)
  const float factor = static_cast<float>(grad_scale / sum);
  const float scale = static_cast<float>(grad_scale);
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    const float d = math::cross_entropy_dlogit(row[c], mx, factor, c == target, scale);
    drow[c] = to_bf16(cap > 0.0f ? d * math::softcap_derivative(row[c], cap) : d);
  }
  if (threadIdx.x == 0) loss_rows[r] = math::cross_entropy_row_loss(mx, sum, row[target]);
}

// One block: thread t sums rows t, t + blockDim, ... then a fixed tree: deterministic.
__global__ void __launch_bounds__(1024) cross_entropy_finish_kernel(double* __restrict__ out,
                                                                     const double* __restrict__ loss_rows,
                                                                     const int32_t* __restrict__ targets, int64_t N) {
  __shared__ double dmem[32];
  double loss = 0.0, count = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    loss += loss_rows[n];
    count += targets[n] != kIgnoreIndex ? 1.0 : 0.0;
  }
  loss = block_sum(loss, dmem);
  count = block_sum(count, dmem);
  if (threadIdx.x == 0) {
    out[0] = loss;
    out[1] = count;
  }
}

}  // namespace

void cross_entropy_chunk(float* logits, bf16* dlogits, double* loss_rows, const int32_t* targets, int64_t nc,
                         int64_t V, double grad_scale, double softcap, cudaStream_t stream) {
  if (nc <= 0) return;
  SLIDEDP_CHECK(softcap >= 0 && std::isfinite(softcap), "cross_entropy_chunk: bad softcap");
  cross_entropy_chunk_kernel<<<static_cast<unsigned>(nc), kThreads, 0, stream>>>(logits, dlogits, loss_rows, targets,
                                                                                 V, grad_scale, static_cast<float>(softcap));
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "cross_entropy_chunk");
}

void cross_entropy_finish(double* out, const double* loss_rows, const int32_t* targets, int64_t N,
                          cudaStream_t stream) {
  cross_entropy_finish_kernel<<<1, 1024, 0, stream>>>(out, loss_rows, targets, N);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "cross_entropy_finish");
}

}  // namespace slidedp::kernels::cuda
