// The router's top-k kernels; see router.h. One warp per token: lane l owns experts l, l + 32, ...
#include "kernels/cuda/router.h"

#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // tokens per block

__global__ void router_topk_forward_kernel(float* __restrict__ probs, int32_t* __restrict__ idx, float* __restrict__ w,
                                           const float* __restrict__ logits, int64_t N, int64_t E, int64_t K) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* l = logits + row * E;
  float* p = probs + row * E;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  double sum = 0;
  for (int64_t e = lane; e < E; e += 32) sum += exp(static_cast<double>(l[e] - mx));
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32) p[e] = static_cast<float>(exp(static_cast<double>(l[e] - mx)) / sum);
  // K rounds of a warp argmax over the experts not yet taken (bit j of `taken`: expert lane + 32 j)
  uint32_t taken = 0;
  double top = 0;
  int32_t* chosen = idx + row * K;
  for (int64_t k = 0; k < K; ++k) {
    float bp = -1.0f;
    int32_t be = -1;
    for (int64_t j = 0, e = lane; e < E; ++j, e += 32) {
      const int32_t ei = static_cast<int32_t>(e);
      if (((taken >> j) & 1u) == 0 && (be < 0 || math::topk_before(p[e], ei, bp, be))) bp = p[e], be = ei;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (oe >= 0 && (be < 0 || math::topk_before(op, oe, bp, be))) bp = op, be = oe;
    }
    if (lane == be % 32) taken |= 1u << (be / 32);
    if (lane == 0) chosen[k] = be;
    top += bp;
  }
  __syncwarp();
  for (int64_t k = lane; k < K; k += 32) w[row * K + k] = static_cast<float>(math::router_weight(p[chosen[k]], top));
}

__global__ void router_topk_backward_kernel(float* __restrict__ dlogits, const float* __restrict__ dw,
                                            const float* __restrict__ probs, const int32_t* __restrict__ idx,
                                            int64_t N, int64_t E, int64_t K) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* p = probs + row * E;
  const int32_t* chosen = idx + row * K;
  const float* g = dw + row * K;
  double top = 0, coupling = 0;  // in slot order, as the CPU
  for (int64_t k = 0; k < K; ++k) top += p[chosen[k]];
  for (int64_t k = 0; k < K; ++k) coupling += g[k] * math::router_weight(p[chosen[k]], top);
  float* d = dlogits + row * E;
  for (int64_t e = lane; e < E; e += 32) d[e] = 0.0f;
  __syncwarp();
  for (int64_t k = lane; k < K; k += 32)
    d[chosen[k]] = static_cast<float>(math::router_dlogit(math::router_weight(p[chosen[k]], top), g[k], coupling));
}

void check(int64_t E, int64_t K) {
  SLIDEDP_CHECK(E > 0 && K > 0 && K <= E && E <= kRouterMaxExperts, "router: needs 0 < K <= E <= 1024");
}

}  // namespace

void router_topk_forward(float* probs, int32_t* idx, float* w, const float* logits, int64_t N, int64_t E, int64_t K,
                         cudaStream_t stream) {
  check(E, K);
  if (N <= 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  router_topk_forward_kernel<<<blocks, kWarps * 32, 0, stream>>>(probs, idx, w, logits, N, E, K);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "router_topk_forward");
}

void router_topk_backward(float* dlogits, const float* dw, const float* probs, const int32_t* idx, int64_t N,
                          int64_t E, int64_t K, cudaStream_t stream) {
  check(E, K);
  if (N <= 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  router_topk_backward_kernel<<<blocks, kWarps * 32, 0, stream>>>(dlogits, dw, probs, idx, N, E, K);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "router_topk_backward");
}

}  // namespace slidedp::kernels::cuda
