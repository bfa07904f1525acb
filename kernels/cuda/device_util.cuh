// Device-side helpers shared by the .cu files of kernels/cuda: bf16 <-> fp32, warp reductions,
// launch-size arithmetic, and the launch attributes asked of the driver once per device instead of at
// every launch. Kept tiny and header-only so every kernel file stays self-contained.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace slidedp::kernels::cuda {

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }
// Round-to-nearest-even, the same rule as common/bf16.h's float_to_bf16 for finite values.
__device__ __forceinline__ __nv_bfloat16 to_bf16(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Blocks of `threads` covering n items, capped for grid-stride loops.
inline unsigned grid_for(int64_t n, int threads, int64_t cap = int64_t{1} << 20) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

inline constexpr int kMaxCachedDevices = 64;

inline int current_device() {
  int device = 0;
  SLIDEDP_CUDA_CHECK(cudaGetDevice(&device));
  SLIDEDP_CHECK(device >= 0 && device < kMaxCachedDevices, "device index above " + std::to_string(kMaxCachedDevices));
  return device;
}

// The dynamic shared memory a block may opt into on `device` (H100/H200 227 KB, A100 163 KB, Ada 99 KB).
inline int max_shared_optin_bytes(int device) {
  static std::array<std::atomic<int>, kMaxCachedDevices> known{};  // 0: not asked yet
  int bytes = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (bytes == 0) {
    SLIDEDP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    known[static_cast<size_t>(device)].store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

// Opts Kernel into `bytes` of dynamic shared memory on the current device: the attribute call happens
// the first time a launch needs more than the kernel was given there (two threads may both make it;
// setting the same attribute twice is harmless).
template <auto Kernel>
void allow_dynamic_shared(int bytes) {
  static std::array<std::atomic<int>, kMaxCachedDevices> granted{};
  std::atomic<int>& g = granted[static_cast<size_t>(current_device())];
  if (bytes <= g.load(std::memory_order_acquire)) return;
  SLIDEDP_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int seen = g.load(std::memory_order_relaxed);
  while (seen < bytes && !g.compare_exchange_weak(seen, bytes, std::memory_order_release)) {
  }
}

}  // namespace slidedp::kernels::cuda
