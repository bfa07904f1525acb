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

__global__ void expert_scale_forward_kernel(float* __restrict__ w, const float* __restrict__ w_renorm,
                                            const __nv_bfloat16* __restrict__ scale, const int32_t* __restrict__ idx,
                                            int64_t slots) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < slots; i += int64_t{gridDim.x} * blockDim.x)
    w[i] = w_renorm[i] * to_f32(scale[idx[i]]);
}

// One block per expert: strided partial sums over the slots, then a fixed-order tree; each slot is
// read and rescaled by the one block of its expert.
constexpr int kScaleThreads = 256;
__global__ void expert_scale_backward_kernel(float* __restrict__ dscale, float* __restrict__ dw,
                                             const float* __restrict__ w_renorm, const __nv_bfloat16* __restrict__ scale,
                                             const int32_t* __restrict__ idx, int64_t slots) {
  __shared__ double partial[kScaleThreads];
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  const float s = to_f32(scale[e]);
  double acc = 0;
  for (int64_t i = threadIdx.x; i < slots; i += kScaleThreads) {
    if (idx[i] != e) continue;
    const float g = dw[i];
    acc += static_cast<double>(g) * w_renorm[i];
    dw[i] = g * s;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kScaleThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) dscale[e] += static_cast<float>(partial[0]);
}

// One thread per (sequence, expert), tokens in order: the CPU's loop, so its sums bit for bit.
__global__ void router_stats_add_kernel(RouterStats st, const float* __restrict__ probs, const int32_t* __restrict__ idx,
                                        int64_t B, int64_t T, int64_t E, int64_t K) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= B * E) return;
  const int64_t b = i / E, e = i % E;
  double count = st.counts[i], sum = st.prob_sums[i];
  for (int64_t t = b * T; t < (b + 1) * T; ++t) {
    for (int64_t k = 0; k < K; ++k) count += idx[t * K + k] == e ? 1.0 : 0.0;
    sum += static_cast<double>(probs[t * E + e]);
  }
  st.counts[i] = count, st.prob_sums[i] = sum;
}

// One warp per token: d[e] += p_e (g_e - sum_j p_j g_j), g_e = weight E c_e / R^2.
__global__ void router_aux_backward_kernel(float* __restrict__ dlogits, const float* __restrict__ probs, RouterStats st,
                                           int64_t B, int64_t T, int64_t E) {
  const int64_t row = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * T) return;
  const double R = static_cast<double>(st.rows);
  const double scale = st.weight * static_cast<double>(E) / (R * R);
  const double* c = st.counts + (row / T) * E;
  const float* p = probs + row * E;
  double mean = 0;
  for (int64_t e = lane; e < E; e += 32) mean += static_cast<double>(p[e]) * scale * c[e];
  mean = warp_sum(mean);
  float* d = dlogits + row * E;
  for (int64_t e = lane; e < E; e += 32) d[e] += static_cast<float>(static_cast<double>(p[e]) * (scale * c[e] - mean));
}

__global__ void router_aux_loss_add_kernel(double* loss, RouterStats st, int64_t B, int64_t E, double loss_units) {
  const double R = static_cast<double>(st.rows);
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += st.counts[b * E + e] * st.prob_sums[b * E + e];
    total += static_cast<double>(E) * dot / (R * R);
  }
  loss[0] += st.weight * total * loss_units;
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

void expert_scale_forward(float* w, const float* w_renorm, const __nv_bfloat16* scale, const int32_t* idx,
                          int64_t slots, cudaStream_t stream) {
  if (slots <= 0) return;
  expert_scale_forward_kernel<<<grid_for(slots, 256), 256, 0, stream>>>(w, w_renorm, scale, idx, slots);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "expert_scale_forward");
}

void expert_scale_backward(float* dscale, float* dw, const float* w_renorm, const __nv_bfloat16* scale,
                           const int32_t* idx, int64_t slots, int64_t E, cudaStream_t stream) {
  if (slots <= 0) return;
  SLIDEDP_CHECK(E > 0 && E <= kRouterMaxExperts, "expert_scale_backward: bad expert count");
  expert_scale_backward_kernel<<<static_cast<unsigned>(E), kScaleThreads, 0, stream>>>(dscale, dw, w_renorm, scale, idx,
                                                                                       slots);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "expert_scale_backward");
}

void router_stats_add(const RouterStats& st, const float* probs, const int32_t* idx, int64_t B, int64_t T, int64_t E,
                      int64_t K, cudaStream_t stream) {
  SLIDEDP_CHECK(st.counts != nullptr && st.prob_sums != nullptr, "router statistics without a buffer");
  if (B * E <= 0 || T <= 0) return;
  router_stats_add_kernel<<<grid_for(B * E, 128), 128, 0, stream>>>(st, probs, idx, B, T, E, K);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "router_stats_add");
}

void router_aux_backward(float* dlogits, const float* probs, const RouterStats& st, int64_t B, int64_t T, int64_t E,
                         cudaStream_t stream) {
  if (st.weight == 0 || B * T <= 0) return;
  const unsigned blocks = static_cast<unsigned>((B * T + kWarps - 1) / kWarps);
  router_aux_backward_kernel<<<blocks, kWarps * 32, 0, stream>>>(dlogits, probs, st, B, T, E);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "router_aux_backward");
}

void router_aux_loss_add(double* loss, const RouterStats& st, int64_t B, int64_t E, double loss_units,
                         cudaStream_t stream) {
  if (st.weight == 0 || B <= 0) return;
  router_aux_loss_add_kernel<<<1, 1, 0, stream>>>(loss, st, B, E, loss_units);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "router_aux_loss_add");
}

}  // namespace slidedp::kernels::cuda
