// Embedding gather and deterministic scatter-add; see embedding.h.
#include <cuda_bf16.h>

#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/embedding.h"

namespace slidedp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

// One block per token row.
__global__ void embedding_forward_kernel(bf16* __restrict__ x, const int32_t* __restrict__ tokens,
                                         const bf16* __restrict__ w, int64_t C, int64_t V, float scale) {
  const int64_t n = blockIdx.x;
  const int32_t id = tokens[n];
  bf16* xr = x + n * C;  // (C)
  if (id < 0 || id >= V) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) xr[c] = to_bf16(__int_as_float(0x7fc00000));  // NaN
    return;
  }
  const bf16* wr = w + static_cast<int64_t>(id) * C;  // (C)
  if (scale != 1.0f) {  // Gemma 4: rows times sqrt(C) rounded to bf16, one more rounding as in transformers
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) xr[c] = to_bf16(to_f32(wr[c]) * scale);
    return;
  }
  if (C % 8 == 0 && reinterpret_cast<uintptr_t>(wr) % 16 == 0 && reinterpret_cast<uintptr_t>(xr) % 16 == 0) {
    const auto* src = reinterpret_cast<const uint4*>(wr);
    auto* dst = reinterpret_cast<uint4*>(xr);
    for (int64_t c = threadIdx.x; c < C / 8; c += blockDim.x) dst[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) xr[c] = wr[c];
  }
}

// Sort input: key = token id (V for an invalid id, sorted last and skipped), value = position.
__global__ void embedding_keys_kernel(int32_t* __restrict__ keys, int32_t* __restrict__ positions,
                                      const int32_t* __restrict__ tokens, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < N; n += int64_t{gridDim.x} * blockDim.x) {
    keys[n] = math::embedding_sort_key(tokens[n], V);
    positions[n] = static_cast<int32_t>(n);
  }
}

// Block i owns the run of equal keys that starts at sorted index i (other blocks exit): its threads
// own columns and add the run's rows in position order (the sort is stable).
__global__ void embedding_accumulate_kernel(float* __restrict__ dw, const int32_t* __restrict__ keys,
                                            const int32_t* __restrict__ positions, const bf16* __restrict__ dx,
                                            int64_t N, int64_t C, int64_t V, float scale) {
  const int64_t i = blockIdx.x;
  if (!math::embedding_run_starts(keys, i, V)) return;
  const int32_t token = keys[i];
  const int64_t end = math::embedding_run_end(keys, i, N);
  float* dwr = dw + static_cast<int64_t>(token) * C;  // (C)
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dwr[c];
    if (scale == 1.0f) {
      for (int64_t j = i; j < end; ++j) acc += to_f32(dx[static_cast<int64_t>(positions[j]) * C + c]);
    } else {  // the CPU's order: each row's contribution scaled, then added
      for (int64_t j = i; j < end; ++j) acc += scale * to_f32(dx[static_cast<int64_t>(positions[j]) * C + c]);
    }
    dwr[c] = acc;
  }
}

struct BackwardScratch {
  int32_t *keys_in, *keys_out, *pos_in, *pos_out;
  void* sort_temp;
  size_t sort_temp_bytes;
  int64_t total_bytes;
};

int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

int end_bit_for(int64_t V) { return std::bit_width(static_cast<uint64_t>(V)); }  // keys are in [0, V]

BackwardScratch carve(void* base, int64_t N, int64_t V) {
  SLIDEDP_CHECK(N <= std::numeric_limits<int32_t>::max() && V < std::numeric_limits<int32_t>::max(),
                "embedding_backward: too many tokens or too large a vocabulary for int32 sort keys");
  BackwardScratch s{};
  size_t temp = 0;
  SLIDEDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int>(N), 0,
                                                     end_bit_for(V)));
  auto* p = static_cast<std::byte*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    std::byte* q = p == nullptr ? nullptr : p + off;
    off += align256(bytes);
    return q;
  };
  s.keys_in = reinterpret_cast<int32_t*>(take(N * 4));
  s.keys_out = reinterpret_cast<int32_t*>(take(N * 4));
  s.pos_in = reinterpret_cast<int32_t*>(take(N * 4));
  s.pos_out = reinterpret_cast<int32_t*>(take(N * 4));
  s.sort_temp_bytes = temp;
  s.sort_temp = take(static_cast<int64_t>(temp));
  s.total_bytes = off;
  return s;
}

}  // namespace

void embedding_forward(bf16* x, const int32_t* tokens, const bf16* w, int64_t N, int64_t C, int64_t V, float scale,
                       cudaStream_t stream) {
  if (N <= 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(x, tokens, w, C, V, scale);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "embedding_forward");
}

int64_t embedding_backward_workspace_bytes(int64_t N, int64_t V) { return carve(nullptr, std::max<int64_t>(N, 1), V).total_bytes; }

void embedding_backward(float* dw, const int32_t* tokens, const bf16* dx, int64_t N, int64_t C, int64_t V, float scale,
                        void* workspace, cudaStream_t stream) {
  if (N <= 0) return;
  const BackwardScratch s = carve(workspace, N, V);
  embedding_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(s.keys_in, s.pos_in, tokens, N, V);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "embedding_keys");
  size_t temp = s.sort_temp_bytes;
  SLIDEDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys_in, s.keys_out, s.pos_in, s.pos_out,
                                                     static_cast<int>(N), 0, end_bit_for(V), stream));
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "embedding_sort");
  embedding_accumulate_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(dw, s.keys_out, s.pos_out, dx, N, C,
                                                                                 V, scale);
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "embedding_accumulate");
}

}  // namespace slidedp::kernels::cuda
