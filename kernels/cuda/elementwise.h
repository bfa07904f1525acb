// Elementwise and small reduction kernels of the CUDA transformer math, in bf16 storage with fp32
// arithmetic (each output rounded once, round-to-nearest-even like common/bf16.h): dtype
// conversion, SwiGLU and GeGLU, residual adds, bias add and its gradient (a deterministic column
// sum), and RoPE. The CPU versions in kernels/cpu/transformer/ are the reference they are tested
// against.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/scratch_sizes.h"  // colsum_workspace_bytes

namespace slidedp::kernels::cuda {

using bf16 = __nv_bfloat16;

// dst (n) = round_to_bf16(src (n)).
void f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream);
// dst (n) = src (n), exactly.
void bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream);
// dst (n) = round_to_bf16(math::uniform_at(seed, i, lo, hi)): deterministic data, so a measurement
// never runs on zeros (tensor cores are faster on them).
void fill_uniform_bf16(bf16* dst, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);

// m (n) = silu(g) * u.
void swiglu_forward(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream);
// dg = dm * u * silu'(g), du = dm * silu(g). dg may alias dm (each element is read before written).
void swiglu_backward(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n,
                     cudaStream_t stream);

// m (n) = gelu_tanh(g) * u (Gemma 4); backward as swiglu_backward's, with the same aliasing.
void geglu_forward(bf16* m, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream);
void geglu_backward(bf16* dg, bf16* du, const bf16* dm, const bf16* g, const bf16* u, int64_t n,
                    cudaStream_t stream);

// y (n) = (a + b) * scale[0], one rounding; scale: one bf16 in device memory (Gemma 4's layer_scalar)
// or null for 1. y may alias a or b.
void add_scaled(bf16* y, const bf16* a, const bf16* b, const bf16* scale, int64_t n, cudaStream_t stream);
// y (n) fp32 = x (n) * scale[0] (scale in device memory).
void scale_to_f32(float* y, const bf16* x, const bf16* scale, int64_t n, cudaStream_t stream);

// x (N, C) += bias (C), in place.
void add_bias(bf16* x, const bf16* bias, int64_t N, int64_t C, cudaStream_t stream);

// out (C) += sum over rows of in (N, C), in a fixed order (row segments, then segments in order), so
// the result is bitwise reproducible. Scratch: colsum_workspace_bytes(N, C) bytes.
void colsum_accumulate(float* out, const bf16* in, int64_t N, int64_t C, void* workspace, cudaStream_t stream);
void colsum_accumulate(float* out, const float* in, int64_t N, int64_t C, void* workspace, cudaStream_t stream);

// RoPE inverse frequencies passed by value (head_dim <= 2 * kMaxRopeHalf).
inline constexpr int kMaxRopeHalf = 256;
struct RopeFreqs {
  int half = 0;                   // head_dim / 2
  double inv_freq[kMaxRopeHalf];  // from kernels/cpu/transformer/rope.cc's rope_inv_freq()
};
RopeFreqs make_rope_freqs(const std::vector<double>& inv_freq);

// In place on x (B, T, nh, hd), rotate_half convention, angle t * inv_freq[i] computed in double
// like the CPU's rope_tables; backward = rotation by -angle. The table rotates the first
// 2 * freqs.half channels of each head, pairs (i, i + freqs.half): all of them, or Qwen3.6's partial
// RoPE (rotary_dim < head_dim) with the rest left as they are. positions (B, T): each token's position
// inside its document (packed documents) instead of t; null: t.
void rope(bf16* x, const RopeFreqs& freqs, int64_t B, int64_t T, int64_t nh, int64_t hd, bool backward,
          cudaStream_t stream, const int32_t* positions = nullptr);

}  // namespace slidedp::kernels::cuda
