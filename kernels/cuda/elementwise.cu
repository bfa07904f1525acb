// Elementwise kernels and the deterministic column sum; see elementwise.h. Memory-bound grid-stride
// loops; the formulas are written exactly as in kernels/cpu/transformer (swiglu.cc, rope.cc) so the
// fp32 arithmetic matches the CPU's operation for operation.
#include <cuda_bf16.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise.h"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, bf16* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = to_bf16(src[i]);
}

// Four elements per thread when src is 16-byte and dst 8-byte aligned (gradient chunks usually are).
__global__ void f32_to_bf16_vec4_kernel(const float4* __restrict__ src, uint2* __restrict__ dst, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = src[i];
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 out;
    out.x = *reinterpret_cast<const uint32_t*>(&lo);
    out.y = *reinterpret_cast<const uint32_t*>(&hi);
    dst[i] = out;
  }
}

__global__ void bf16_to_f32_kernel(const bf16* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = to_f32(src[i]);
}

__global__ void fill_uniform_bf16_kernel(bf16* __restrict__ dst, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = to_bf16(math::uniform_at(seed, i, lo, hi));
}

// The gated activations of the MLPs: SwiGLU (Llama family) and GeGLU with tanh-GELU (Gemma 4).
struct Swiglu {
  __device__ static float value(float g, float u) { return math::swiglu(g, u); }
  __device__ static void grads(float g, float u, float dm, float* dg, float* du) { math::swiglu_grads(g, u, dm, dg, du); }
};
struct Geglu {
  __device__ static float value(float g, float u) { return math::geglu(g, u); }
  __device__ static void grads(float g, float u, float dm, float* dg, float* du) { math::geglu_grads(g, u, dm, dg, du); }
};

template <typename Act>
__global__ void gated_forward_kernel(bf16* __restrict__ m, const bf16* __restrict__ g, const bf16* __restrict__ u,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    m[i] = to_bf16(Act::value(to_f32(g[i]), to_f32(u[i])));
}

// dg may alias dm: each element of dm is read before the same element of dg is written.
template <typename Act>
__global__ void gated_backward_kernel(bf16* dg, bf16* __restrict__ du, const bf16* dm, const bf16* __restrict__ g,
                                      const bf16* __restrict__ u, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float dgi, dui;
    Act::grads(to_f32(g[i]), to_f32(u[i]), to_f32(dm[i]), &dgi, &dui);
    du[i] = to_bf16(dui);
    dg[i] = to_bf16(dgi);
  }
}

template <typename Act>
void gated_forward(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream, const char* what) {
  if (n <= 0) return;
  gated_forward_kernel<Act><<<grid_for(n, kThreads), kThreads, 0, stream>>>(m, g, u, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, what);
}
template <typename Act>
void gated_backward(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream,
                    const char* what) {
  if (n <= 0) return;
  gated_backward_kernel<Act><<<grid_for(n, kThreads), kThreads, 0, stream>>>(dg, du, dm, g, u, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, what);
}

// y = (a + b) * scale[0] (scale null: 1). y may alias a or b: each element is read before written.
__global__ void add_scaled_kernel(bf16* y, const bf16* a, const bf16* b, const bf16* __restrict__ scale, int64_t n) {
  const float s = scale != nullptr ? to_f32(scale[0]) : 1.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = to_bf16((to_f32(a[i]) + to_f32(b[i])) * s);
}

__global__ void scale_to_f32_kernel(float* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ scale,
                                    int64_t n) {
  const float s = to_f32(scale[0]);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = to_f32(x[i]) * s;
}

__global__ void add_bias_kernel(bf16* __restrict__ x, const bf16* __restrict__ bias, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = to_bf16(to_f32(x[i]) + to_f32(bias[i % C]));
}

// Stage 1: partial (S, C), partial[s][c] = sum of in[r][c] over the rows r of segment s, in row order.
template <typename In>
__global__ void colsum_partial_kernel(float* __restrict__ partial, const In* __restrict__ in, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t S = math::segment_count(N, kColsumRowsPerSegment);
  for (int64_t s = blockIdx.y; s < S; s += gridDim.y) {  // more segments than gridDim.y allows: loop
    const int64_t r0 = s * kColsumRowsPerSegment, r1 = min(N, r0 + kColsumRowsPerSegment);
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; ++r) acc += to_f32(in[r * C + c]);
    partial[s * C + c] = acc;
  }
}

// Stage 2: out[c] += sum over segments in order.
__global__ void colsum_finish_kernel(float* __restrict__ out, const float* __restrict__ partial, int64_t S, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t s = 0; s < S; ++s) acc += partial[s * C + c];
  out[c] += acc;
}

// One thread per (b, t, i): cos/sin of t * inv_freq[i] once in double (rounded to fp32 like the CPU's
// tables), applied to pair (i, i + half) of every head.
__global__ void rope_kernel(bf16* __restrict__ x, const RopeFreqs f, const int32_t* __restrict__ positions, int64_t B,
                            int64_t T, int64_t nh, int64_t hd, float sign) {
  const int64_t half = f.half;
  const int64_t total = B * T * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t bt = idx / half;  // b * T + t
    const int64_t t = positions != nullptr ? positions[bt] : bt % T;  // the position inside the document
    float c, s;
    math::rope_cos_sin(t, f.inv_freq[i], &c, &s);
    bf16* row = x + bt * nh * hd;  // (nh, hd)
    for (int64_t h = 0; h < nh; ++h) {
      bf16* v = row + h * hd;
      float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
      math::rope_rotate(&x1, &x2, c, s, sign);
      v[i] = to_bf16(x1);
      v[i + half] = to_bf16(x2);
    }
  }
}

}  // namespace

void f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0 && n % 4 == 0) {
    f32_to_bf16_vec4_kernel<<<grid_for(n / 4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(src), reinterpret_cast<uint2*>(dst), n / 4);
  } else {
    f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, dst, n);
  }
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "f32_to_bf16");
}

void bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, dst, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "bf16_to_f32");
}

void fill_uniform_bf16(bf16* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (n <= 0) return;
  fill_uniform_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, n, seed, lo, hi);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "fill_uniform_bf16");
}

void swiglu_forward(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream) {
  gated_forward<Swiglu>(m, g, u, n, stream, "swiglu_forward");
}

void swiglu_backward(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n,
                     cudaStream_t stream) {
  gated_backward<Swiglu>(dg, du, dm, g, u, n, stream, "swiglu_backward");
}

void geglu_forward(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream) {
  gated_forward<Geglu>(m, g, u, n, stream, "geglu_forward");
}

void geglu_backward(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n,
                    cudaStream_t stream) {
  gated_backward<Geglu>(dg, du, dm, g, u, n, stream, "geglu_backward");
}

void add_scaled(bf16* y, const bf16* a, const bf16* b, const bf16* scale, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_scaled_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(y, a, b, scale, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "add_scaled");
}

void scale_to_f32(float* y, const bf16* x, const bf16* scale, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  SLIDEDP_CHECK(scale != nullptr, "scale_to_f32 needs its scale");
  scale_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(y, x, scale, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "scale_to_f32");
}

void add_bias(bf16* x, const bf16* bias, int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C <= 0) return;
  add_bias_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(x, bias, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "add_bias");
}

namespace {
// The two-stage column sum for either input dtype.
template <typename In>
void colsum(float* out, const In* in, int64_t N, int64_t C, void* workspace, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const int64_t S = math::segment_count(N, kColsumRowsPerSegment);
  auto* partial = static_cast<float*>(workspace);
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), math::segment_grid_y(S));
  colsum_partial_kernel<<<grid, kThreads, 0, stream>>>(partial, in, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "colsum_partial");
  colsum_finish_kernel<<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(out, partial, S,
                                                                                                      C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "colsum_finish");
}
}  // namespace

void colsum_accumulate(float* out, const bf16* in, int64_t N, int64_t C, void* workspace, cudaStream_t stream) {
  colsum(out, in, N, C, workspace, stream);
}
void colsum_accumulate(float* out, const float* in, int64_t N, int64_t C, void* workspace, cudaStream_t stream) {
  colsum(out, in, N, C, workspace, stream);
}

RopeFreqs make_rope_freqs(const std::vector<double>& inv_freq) {
  SLIDEDP_CHECK(!inv_freq.empty() && inv_freq.size() <= static_cast<size_t>(kMaxRopeHalf),
                "RoPE: head_dim / 2 must be in [1, 256]");
  RopeFreqs f{};
  f.half = static_cast<int>(inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) f.inv_freq[i] = inv_freq[i];
  return f;
}

void rope(bf16* x, const RopeFreqs& freqs, int64_t B, int64_t T, int64_t nh, int64_t hd, bool backward,
          cudaStream_t stream, const int32_t* positions) {
  SLIDEDP_CHECK(hd >= 2 * freqs.half && freqs.half > 0, "RoPE: the frequency table is wider than the head");
  const int64_t total = B * T * freqs.half;
  if (total <= 0 || nh <= 0) return;
  rope_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, freqs, positions, B, T, nh, hd,
                                                                  backward ? -1.0f : 1.0f);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "rope");
}

}  // namespace slidedp::kernels::cuda
