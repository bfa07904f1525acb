// The Gated DeltaNet's passes on the GPU; see deltanet_ops.h. Formulas in the CPU's float order
// (kernels/cpu/transformer/gated_deltanet.cc), the shared ones from device_math.h.
#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/deltanet_ops.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise.h"

namespace slidedp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr double kL2NormEps = 1e-6;  // the reference's l2norm: x * rsqrt(sum x^2 + 1e-6)

#define SLIDEDP_GRID_STRIDE(i, n)                                           \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

__device__ __forceinline__ int64_t qkv(const HeadsShape& s) { return 2 * s.nk * s.dk + s.nv * s.dv; }

// The first row (token index in its sequence) of the document holding token t of a sequence.
__device__ __forceinline__ int64_t document_start(const ConvShape& s, int64_t row, int64_t t) {
  return s.positions != nullptr ? t - s.positions[row] : 0;
}

// conv[row, c] = sum_i w[c, i] mixed[row - (K - 1) + i, c] inside the row's document, in tap order
// (the CPU's), and silu of it.
__device__ __forceinline__ float conv_at(const bf16* __restrict__ mixed, const bf16* __restrict__ w,
                                         const ConvShape& s, int64_t row, int64_t c) {
  const int64_t t = row % s.T, first = row - t, start = document_start(s, row, t);
  float acc = 0.0f;
  for (int64_t i = 0; i < s.K; ++i) {
    const int64_t src = t - (s.K - 1) + i;
    if (src < start) continue;
    acc += to_f32(w[c * s.K + i]) * to_f32(mixed[(first + src) * s.D + c]);
  }
  return acc;
}
__device__ __forceinline__ float silu(float x) { return x * math::sigmoid(x); }

// Whether conv row dst (a token index of the sequence) reads mixed row t: inside the sequence and the
// same document.
__device__ __forceinline__ bool feeds(const ConvShape& s, int64_t first, int64_t t, int64_t dst) {
  return dst < s.T && document_start(s, first + dst, dst) <= t;
}

__global__ void conv_backward_input_kernel(bf16* __restrict__ dmixed, const float* __restrict__ dconv,
                                           const bf16* __restrict__ w, ConvShape s) {
  SLIDEDP_GRID_STRIDE(e, s.B * s.T * s.D) {
    const int64_t c = e % s.D, row = e / s.D, t = row % s.T, first = row - t;
    float acc = 0.0f;
    for (int64_t i = 0; i < s.K; ++i) {  // mixed row t feeds conv rows t + (K - 1) - i
      const int64_t dst = t + (s.K - 1) - i;
      if (feeds(s, first, t, dst)) acc += to_f32(w[c * s.K + i]) * dconv[(first + dst) * s.D + c];
    }
    dmixed[e] = to_bf16(acc);
  }
}

// One thread per (channel, tap): the rows in order.
__global__ void conv_backward_weight_kernel(float* __restrict__ dw, const float* __restrict__ dconv,
                                            const bf16* __restrict__ mixed, ConvShape s) {
  SLIDEDP_GRID_STRIDE(e, s.D * s.K) {
    const int64_t c = e / s.K, i = e % s.K;
    float acc = 0.0f;
    for (int64_t row = 0; row < s.B * s.T; ++row) {
      const int64_t t = row % s.T, first = row - t, dst = t + (s.K - 1) - i;
      if (feeds(s, first, t, dst)) acc += dconv[(first + dst) * s.D + c] * to_f32(mixed[row * s.D + c]);
    }
    dw[e] += acc;
  }
}

// One warp per (row, head of q, k or v): the head's act values (conv + SiLU, each lane its elements),
// then for q and k the l2norm (the sum of squares across the warp, the root in double as the CPU's).
// A lane keeps at most kMaxHeadDim / 32 values.
constexpr int kMaxPerLane = 8;  // head dims up to 256

struct HeadSlice {
  int64_t first, d;  // channel range in qkv order
  bool normed, is_q;
  int64_t index;  // head index within q, k or v
};
__device__ HeadSlice head_slice(const HeadsShape& s, int64_t j) {
  if (j < s.nk) return {j * s.dk, s.dk, true, true, j};
  if (j < 2 * s.nk) return {j * s.dk, s.dk, true, false, j - s.nk};
  const int64_t h = j - 2 * s.nk;
  return {2 * s.nk * s.dk + h * s.dv, s.dv, false, false, h};
}

__global__ void prepare_forward_kernel(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                                       const bf16* __restrict__ mixed, const bf16* __restrict__ w,
                                       ConvShape c, HeadsShape s) {
  const int64_t heads = 2 * s.nk + s.nv;
  const int64_t item = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (item >= s.N * heads) return;
  const int64_t row = item / heads;
  const HeadSlice h = head_slice(s, item % heads);
  float act[kMaxPerLane];
  float ss = 0.0f;
  for (int n = 0; n < kMaxPerLane; ++n) {
    const int64_t i = lane + 32 * n;
    act[n] = i < h.d ? silu(conv_at(mixed, w, c, row, h.first + i)) : 0.0f;
    ss += act[n] * act[n];
  }
  if (!h.normed) {
    float* out = v + (row * s.nv + h.index) * s.dv;
    for (int n = 0; n < kMaxPerLane; ++n)
      if (lane + 32 * n < h.d) out[lane + 32 * n] = act[n];
    return;
  }
  ss = warp_sum(ss);
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) + kL2NormEps));
  const float scale = h.is_q ? s.q_scale : 1.0f;
  float* out = (h.is_q ? q : k) + (row * s.nk + h.index) * s.dk;
  for (int n = 0; n < kMaxPerLane; ++n)
    if (lane + 32 * n < h.d) out[lane + 32 * n] = act[n] * inv * scale;
}

// One warp per (row, head of q, k or v): the l2norm's Jacobian (q, k) or a copy (v), then SiLU's
// derivative at the conv output: dconv = dact * sg (1 + x (1 - sg)).
__global__ void prepare_backward_kernel(float* __restrict__ dconv, const float* __restrict__ dq,
                                        const float* __restrict__ dk, const float* __restrict__ dv,
                                        const bf16* __restrict__ mixed, const bf16* __restrict__ w,
                                        ConvShape c, HeadsShape s) {
  const int64_t heads = 2 * s.nk + s.nv;
  const int64_t item = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (item >= s.N * heads) return;
  const int64_t row = item / heads;
  const HeadSlice h = head_slice(s, item % heads);
  float x[kMaxPerLane], a[kMaxPerLane], g[kMaxPerLane];
  const float* grad =
      h.normed ? (h.is_q ? dq : dk) + (row * s.nk + h.index) * s.dk : dv + (row * s.nv + h.index) * s.dv;
  float ss = 0.0f;
  for (int n = 0; n < kMaxPerLane; ++n) {
    const int64_t i = lane + 32 * n;
    x[n] = i < h.d ? conv_at(mixed, w, c, row, h.first + i) : 0.0f;
    a[n] = silu(x[n]);
    g[n] = i < h.d ? grad[i] : 0.0f;
    ss += a[n] * a[n];
  }
  float* out = dconv + row * qkv(s) + h.first;
  auto silu_grad = [](float v) {
    const float sg = math::sigmoid(v);
    return sg * (1.0f + v * (1.0f - sg));
  };
  if (!h.normed) {
    for (int n = 0; n < kMaxPerLane; ++n)
      if (lane + 32 * n < h.d) out[lane + 32 * n] = g[n] * silu_grad(x[n]);
    return;
  }
  ss = warp_sum(ss);
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) + kL2NormEps));
  const float scale = h.is_q ? s.q_scale : 1.0f;
  float proj = 0.0f;
  for (int n = 0; n < kMaxPerLane; ++n) proj += a[n] * inv * g[n];
  proj = warp_sum(proj);
  for (int n = 0; n < kMaxPerLane; ++n)
    if (lane + 32 * n < h.d) out[lane + 32 * n] = scale * inv * (g[n] - a[n] * inv * proj) * silu_grad(x[n]);
}

// torch.nn.functional.softplus with its default threshold: x above 20 passes through.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void gates_forward_kernel(float* __restrict__ beta, float* __restrict__ g,
                                     const float* __restrict__ braw, const float* __restrict__ araw,
                                     const bf16* __restrict__ A_log, const bf16* __restrict__ dt_bias,
                                     int64_t N, int64_t nv) {
  SLIDEDP_GRID_STRIDE(e, N * nv) {
    const int64_t h = e % nv;
    beta[e] = math::sigmoid(braw[e]);
    g[e] = -expf(to_f32(A_log[h])) * softplus(araw[e] + to_f32(dt_bias[h]));
  }
}

// d araw = d(g) / d(araw) dg = -dg exp(A_log) softplus'(u), softplus' = sigmoid below the threshold.
__device__ __forceinline__ float gate_du(float dg, float araw, const bf16* A_log, const bf16* dt_bias,
                                         int64_t h) {
  const float u = araw + to_f32(dt_bias[h]);
  return -dg * expf(to_f32(A_log[h])) * (u > 20.0f ? 1.0f : math::sigmoid(u));
}

__global__ void gates_backward_rows_kernel(bf16* __restrict__ dbraw, bf16* __restrict__ daraw,
                                           const float* __restrict__ dbeta, const float* __restrict__ dg,
                                           const float* __restrict__ beta, const float* __restrict__ araw,
                                           const bf16* __restrict__ A_log, const bf16* __restrict__ dt_bias,
                                           int64_t N, int64_t nv) {
  SLIDEDP_GRID_STRIDE(e, N * nv) {
    dbraw[e] = to_bf16(dbeta[e] * beta[e] * (1.0f - beta[e]));
    daraw[e] = to_bf16(gate_du(dg[e], araw[e], A_log, dt_bias, e % nv));
  }
}

// One block per head: dA_log += sum_t dg g (g = -exp(A_log) softplus: d g / d A_log = g), ddt_bias +=
// sum_t du, strided partial sums then a fixed tree.
__global__ void gates_backward_params_kernel(float* __restrict__ dA_log, float* __restrict__ ddt_bias,
                                             const float* __restrict__ dg, const float* __restrict__ g,
                                             const float* __restrict__ araw, const bf16* __restrict__ A_log,
                                             const bf16* __restrict__ dt_bias, int64_t N, int64_t nv) {
  __shared__ float pa[kThreads], pb[kThreads];
  const int64_t h = blockIdx.x;
  float a = 0.0f, b = 0.0f;
  for (int64_t t = threadIdx.x; t < N; t += kThreads) {
    const int64_t e = t * nv + h;
    a += dg[e] * g[e];
    b += gate_du(dg[e], araw[e], A_log, dt_bias, h);
  }
  pa[threadIdx.x] = a, pb[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      pa[threadIdx.x] += pa[threadIdx.x + half], pb[threadIdx.x] += pb[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) dA_log[h] += pa[0], ddt_bias[h] += pb[0];
}

// One warp per (row, value head).
__global__ void gated_norm_forward_kernel(bf16* __restrict__ gated, float* __restrict__ rstd,
                                          const float* __restrict__ o, const bf16* __restrict__ z,
                                          const bf16* __restrict__ w, int64_t R, int64_t dv, double eps,
                                          bool recompute) {
  const int64_t r = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= R) return;
  const float* x = o + r * dv;
  float rs;
  if (recompute) {
    rs = rstd[r];
  } else {
    float ss = 0.0f;
    for (int64_t c = lane; c < dv; c += 32) ss += x[c] * x[c];
    rs = math::rmsnorm_rstd(warp_sum(ss), dv, eps);
    if (lane == 0) rstd[r] = rs;
  }
  for (int64_t c = lane; c < dv; c += 32)
    gated[r * dv + c] =
        to_bf16(math::swiglu(to_f32(z[r * dv + c]), math::rmsnorm_out(to_f32(w[c]), x[c], rs)));
}

__global__ void gated_norm_backward_kernel(bf16* __restrict__ dz, float* __restrict__ do_,
                                           float* __restrict__ terms, const float* __restrict__ dgated,
                                           const float* __restrict__ o, const float* __restrict__ rstd,
                                           const bf16* __restrict__ z, const bf16* __restrict__ w, int64_t R,
                                           int64_t dv) {
  const int64_t r = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= R) return;
  const float* x = o + r * dv;
  const float rs = rstd[r];
  // gated = silu(z) * normed: dz and dnormed; then the norm's backward from dnormed
  float dot = 0.0f;
  for (int64_t c = lane; c < dv; c += 32) {
    const float wc = to_f32(w[c]), normed = math::rmsnorm_out(wc, x[c], rs);
    float dzc, dn;
    math::swiglu_grads(to_f32(z[r * dv + c]), normed, dgated[r * dv + c], &dzc, &dn);
    dz[r * dv + c] = to_bf16(dzc);
    terms[r * dv + c] = dn * (x[c] * rs);  // its weight gradient's term
    dot += math::rmsnorm_dot_term(wc, dn, x[c], rs);
  }
  const float mean_dot = warp_sum(dot) / static_cast<float>(dv);
  for (int64_t c = lane; c < dv; c += 32) {
    const float wc = to_f32(w[c]), normed = math::rmsnorm_out(wc, x[c], rs);
    float dzc, dn;
    math::swiglu_grads(to_f32(z[r * dv + c]), normed, dgated[r * dv + c], &dzc, &dn);
    do_[r * dv + c] = math::rmsnorm_dx(wc, dn, x[c], rs, mean_dot);
  }
}

unsigned warps_grid(int64_t items) { return static_cast<unsigned>((items + kWarps - 1) / kWarps); }

}  // namespace

void deltanet_conv_backward(bf16* dmixed, float* dw, const float* dconv, const bf16* mixed, const bf16* w,
                            const ConvShape& s, cudaStream_t stream) {
  if (s.B * s.T * s.D <= 0) return;
  conv_backward_input_kernel<<<grid_for(s.B * s.T * s.D, kThreads), kThreads, 0, stream>>>(dmixed, dconv, w,
                                                                                           s);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_conv_backward input");
  conv_backward_weight_kernel<<<grid_for(s.D * s.K, kThreads), kThreads, 0, stream>>>(dw, dconv, mixed, s);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_conv_backward weight");
}

void deltanet_prepare_forward(float* q, float* k, float* v, const bf16* mixed, const bf16* w,
                              const ConvShape& c, const HeadsShape& s, cudaStream_t stream) {
  SLIDEDP_CHECK(s.dk <= 32 * kMaxPerLane && s.dv <= 32 * kMaxPerLane, "Gated DeltaNet: head dims above 256");
  if (s.N <= 0) return;
  prepare_forward_kernel<<<warps_grid(s.N * (2 * s.nk + s.nv)), kThreads, 0, stream>>>(q, k, v, mixed, w, c,
                                                                                       s);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_prepare_forward");
}

void deltanet_prepare_backward(float* dconv, const float* dq, const float* dk, const float* dv,
                               const bf16* mixed, const bf16* w, const ConvShape& c, const HeadsShape& s,
                               cudaStream_t stream) {
  SLIDEDP_CHECK(s.dk <= 32 * kMaxPerLane && s.dv <= 32 * kMaxPerLane, "Gated DeltaNet: head dims above 256");
  if (s.N <= 0) return;
  prepare_backward_kernel<<<warps_grid(s.N * (2 * s.nk + s.nv)), kThreads, 0, stream>>>(dconv, dq, dk, dv,
                                                                                        mixed, w, c, s);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_prepare_backward");
}

void deltanet_gates_forward(float* beta, float* g, const float* braw, const float* araw, const bf16* A_log,
                            const bf16* dt_bias, int64_t N, int64_t nv, cudaStream_t stream) {
  if (N * nv <= 0) return;
  gates_forward_kernel<<<grid_for(N * nv, kThreads), kThreads, 0, stream>>>(beta, g, braw, araw, A_log,
                                                                            dt_bias, N, nv);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_gates_forward");
}

void deltanet_gates_backward(bf16* dbraw, bf16* daraw, float* dA_log, float* ddt_bias, const float* dbeta,
                             const float* dg, const float* beta, const float* g, const float* araw,
                             const bf16* A_log, const bf16* dt_bias, int64_t N, int64_t nv,
                             cudaStream_t stream) {
  if (N * nv <= 0) return;
  gates_backward_rows_kernel<<<grid_for(N * nv, kThreads), kThreads, 0, stream>>>(
      dbraw, daraw, dbeta, dg, beta, araw, A_log, dt_bias, N, nv);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_gates_backward rows");
  gates_backward_params_kernel<<<static_cast<unsigned>(nv), kThreads, 0, stream>>>(
      dA_log, ddt_bias, dg, g, araw, A_log, dt_bias, N, nv);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_gates_backward parameters");
}

void deltanet_gated_norm_forward(bf16* gated, float* rstd, const float* o, const bf16* z, const bf16* w,
                                 int64_t N, int64_t nv, int64_t dv, double eps, bool recompute,
                                 cudaStream_t stream) {
  if (N * nv <= 0) return;
  gated_norm_forward_kernel<<<warps_grid(N * nv), kThreads, 0, stream>>>(gated, rstd, o, z, w, N * nv, dv,
                                                                         eps, recompute);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_gated_norm_forward");
}

void deltanet_gated_norm_backward(bf16* dz, float* do_, float* dw, const float* dgated, const float* o,
                                  const float* rstd, const bf16* z, const bf16* w, int64_t N, int64_t nv,
                                  int64_t dv, void* workspace, cudaStream_t stream) {
  if (N * nv <= 0) return;
  auto* terms = static_cast<float*>(workspace);
  gated_norm_backward_kernel<<<warps_grid(N * nv), kThreads, 0, stream>>>(dz, do_, terms, dgated, o, rstd, z,
                                                                          w, N * nv, dv);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "deltanet_gated_norm_backward");
  colsum_accumulate(dw, terms, N * nv, dv, terms + N * nv * dv, stream);
}

}  // namespace slidedp::kernels::cuda
