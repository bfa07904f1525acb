// Qwen3.6's small passes; see qwen3_5_ops.h.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/qwen3_5_ops.h"

namespace slidedp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void split_query_gate_kernel(bf16* __restrict__ q, bf16* __restrict__ gate,
                                        const bf16* __restrict__ qp, int64_t rows, int64_t hd) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * hd;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / hd, i = e % hd;
    q[e] = qp[2 * r * hd + i];
    gate[e] = qp[(2 * r + 1) * hd + i];
  }
}

__global__ void join_query_gate_kernel(bf16* __restrict__ qp, const bf16* __restrict__ q,
                                       const bf16* __restrict__ gate, int64_t rows, int64_t hd) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * hd;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / hd, i = e % hd;
    qp[2 * r * hd + i] = q[e];
    qp[(2 * r + 1) * hd + i] = gate[e];
  }
}

__global__ void output_gate_forward_kernel(bf16* __restrict__ og, const bf16* __restrict__ att,
                                           const bf16* __restrict__ gate, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x)
    og[e] = to_bf16(to_f32(att[e]) * math::sigmoid(to_f32(gate[e])));
}

__global__ void output_gate_backward_kernel(bf16* __restrict__ datt, bf16* __restrict__ dgate,
                                            const bf16* __restrict__ dog, const bf16* __restrict__ att,
                                            const bf16* __restrict__ gate, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float s = math::sigmoid(to_f32(gate[e])), d = to_f32(dog[e]);
    datt[e] = to_bf16(d * s);
    dgate[e] = to_bf16(d * to_f32(att[e]) * s * (1.0f - s));
  }
}

__global__ void shared_gate_forward_kernel(bf16* __restrict__ y, const bf16* __restrict__ h1,
                                           const bf16* __restrict__ routed, const bf16* __restrict__ shared,
                                           const float* __restrict__ slogit, int64_t N, int64_t C) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * C;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float gate = math::sigmoid(slogit[e / C]);
    y[e] = to_bf16(to_f32(h1[e]) + to_f32(routed[e]) + gate * to_f32(shared[e]));
  }
}

__global__ void shared_gate_backward_kernel(bf16* __restrict__ dshared, float* __restrict__ dslogit,
                                            const bf16* __restrict__ dy, const bf16* __restrict__ shared,
                                            const float* __restrict__ slogit, int64_t N, int64_t C) {
  const int64_t t = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  const float gate = math::sigmoid(slogit[t]);
  float dot = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f32(dy[t * C + c]);
    dot += d * to_f32(shared[t * C + c]);
    dshared[t * C + c] = to_bf16(gate * d);
  }
  dot = warp_sum(dot);
  if (lane == 0) dslogit[t] = dot * gate * (1.0f - gate);
}

__global__ void shared_gate_logit_kernel(float* __restrict__ slogit, const bf16* __restrict__ u,
                                         const bf16* __restrict__ w, int64_t N, int64_t C) {
  const int64_t t = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  float dot = 0.0f;
  for (int64_t c = lane; c < C; c += 32) dot += to_f32(u[t * C + c]) * to_f32(w[c]);
  dot = warp_sum(dot);
  if (lane == 0) slogit[t] = dot;
}

__global__ void shared_gate_logit_input_kernel(float* __restrict__ du, const float* __restrict__ dslogit,
                                               const bf16* __restrict__ w, int64_t N, int64_t C) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * C;
       e += int64_t{gridDim.x} * blockDim.x)
    du[e] += dslogit[e / C] * to_f32(w[e % C]);
}

// One thread per column, the tokens in order.
__global__ void shared_gate_logit_weight_kernel(float* __restrict__ dw, const float* __restrict__ dslogit,
                                                const bf16* __restrict__ u, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t t = 0; t < N; ++t) acc += dslogit[t] * to_f32(u[t * C + c]);
  dw[c] += acc;
}

}  // namespace

void split_query_gate(bf16* q, bf16* gate, const bf16* qp, int64_t rows, int64_t hd, cudaStream_t stream) {
  if (rows * hd <= 0) return;
  split_query_gate_kernel<<<grid_for(rows * hd, kThreads), kThreads, 0, stream>>>(q, gate, qp, rows, hd);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "split_query_gate");
}

void join_query_gate(bf16* qp, const bf16* q, const bf16* gate, int64_t rows, int64_t hd,
                     cudaStream_t stream) {
  if (rows * hd <= 0) return;
  join_query_gate_kernel<<<grid_for(rows * hd, kThreads), kThreads, 0, stream>>>(qp, q, gate, rows, hd);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "join_query_gate");
}

void output_gate_forward(bf16* og, const bf16* att, const bf16* gate, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  output_gate_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(og, att, gate, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "output_gate_forward");
}

void output_gate_backward(bf16* datt, bf16* dgate, const bf16* dog, const bf16* att, const bf16* gate,
                          int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  output_gate_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(datt, dgate, dog, att, gate, n);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "output_gate_backward");
}

void shared_gate_forward(bf16* y, const bf16* h1, const bf16* routed, const bf16* shared, const float* slogit,
                         int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C <= 0) return;
  shared_gate_forward_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(y, h1, routed, shared,
                                                                                 slogit, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "shared_gate_forward");
}

void shared_gate_backward(bf16* dshared, float* dslogit, const bf16* dy, const bf16* shared,
                          const float* slogit, int64_t N, int64_t C, cudaStream_t stream) {
  if (N <= 0) return;
  shared_gate_backward_kernel<<<static_cast<unsigned>((N + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      dshared, dslogit, dy, shared, slogit, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "shared_gate_backward");
}

void shared_gate_logit(float* slogit, const bf16* u, const bf16* w, int64_t N, int64_t C,
                       cudaStream_t stream) {
  if (N <= 0) return;
  shared_gate_logit_kernel<<<static_cast<unsigned>((N + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      slogit, u, w, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "shared_gate_logit");
}

void shared_gate_logit_backward(float* du, float* dw, const float* dslogit, const bf16* u, const bf16* w,
                                int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C <= 0) return;
  shared_gate_logit_input_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(du, dslogit, w, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "shared_gate_logit_backward input");
  shared_gate_logit_weight_kernel<<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0,
                                    stream>>>(dw, dslogit, u, N, C);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "shared_gate_logit_backward weight");
}

}  // namespace slidedp::kernels::cuda
