// Helpers of the CUDA kernel tests: the visible skip when no GPU exists, device arrays with guard
// elements around them (STYLE habit 3: a kernel that writes past its output is caught), bf16 data
// that both backends see identically (values rounded to bf16 on the host first), and per-tensor
// comparisons. GPU tests call SLIDEDP_REQUIRE_GPU() first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "tests/kernels/transformer/test_util.h"

#define SLIDEDP_REQUIRE_GPU()                                                                               \
  do {                                                                                                      \
    if (::slidedp::kernels::cuda::device_count() == 0)                                                      \
      GTEST_SKIP() << "no CUDA GPU visible (device_count() == 0): this GPU test runs only where a GPU is"; \
  } while (0)

namespace slidedp::kernels::cuda::test {

using kernels::test::random_vector;

// Host values rounded to bf16, kept as float (what both backends compute from).
inline std::vector<float> random_bf16_values(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<float> v = random_vector<float>(n, seed, lo, hi);
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

inline std::vector<bf16_bits> to_bf16_bits(const std::vector<float>& v) {
  std::vector<bf16_bits> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

// n elements of T on the device between two guard zones filled with a byte pattern; check_guards()
// reports whether anything wrote outside [0, n).
template <typename T>
class DeviceArray {
 public:
  // Elements on each side: 256 bytes, so the array itself stays 256-byte aligned like the backend's
  // allocations (the unit workspaces require it).
  static constexpr int64_t kGuard = 256 / static_cast<int64_t>(sizeof(T));
  static constexpr unsigned char kPattern = 0xA5;
  explicit DeviceArray(int64_t n) : n_(n) {
    SLIDEDP_CUDA_CHECK(cudaMalloc(&base_, static_cast<size_t>((n + 2 * kGuard) * sizeof(T))));
    SLIDEDP_CUDA_CHECK(cudaMemset(base_, kPattern, static_cast<size_t>((n + 2 * kGuard) * sizeof(T))));
  }
  DeviceArray(const std::vector<T>& host) : DeviceArray(static_cast<int64_t>(host.size())) { upload(host); }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return reinterpret_cast<T*>(base_) + kGuard; }
  int64_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    SLIDEDP_CHECK(static_cast<int64_t>(host.size()) == n_, "upload size");
    SLIDEDP_CUDA_CHECK(cudaMemcpy(get(), host.data(), static_cast<size_t>(n_ * sizeof(T)), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(n_));
    SLIDEDP_CUDA_CHECK(cudaDeviceSynchronize());
    SLIDEDP_CUDA_CHECK(cudaMemcpy(host.data(), get(), static_cast<size_t>(n_ * sizeof(T)), cudaMemcpyDeviceToHost));
    return host;
  }
  ::testing::AssertionResult check_guards(const std::string& what) const {
    std::vector<unsigned char> bytes(static_cast<size_t>((n_ + 2 * kGuard) * sizeof(T)));
    SLIDEDP_CUDA_CHECK(cudaDeviceSynchronize());
    SLIDEDP_CUDA_CHECK(cudaMemcpy(bytes.data(), base_, bytes.size(), cudaMemcpyDeviceToHost));
    const size_t guard_bytes = kGuard * sizeof(T);
    for (size_t i = 0; i < guard_bytes; ++i)
      if (bytes[i] != kPattern || bytes[bytes.size() - 1 - i] != kPattern)
        return ::testing::AssertionFailure() << what << ": a kernel wrote into the guard zone around the buffer";
    return ::testing::AssertionSuccess();
  }

 private:
  int64_t n_;
  void* base_ = nullptr;
};

using Bf16Array = DeviceArray<bf16_bits>;

inline __nv_bfloat16* bf(const Bf16Array& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); }

inline std::vector<float> widen(const std::vector<bf16_bits>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |got - ref| <= atol + rtol |ref| with atol = atol_frac * max|ref| of the tensor: the comparison for
// outputs that went through several bf16 roundings, where an element near zero after cancellation
// has no meaningful relative error but the tensor's scale does.
inline ::testing::AssertionResult close_to_scale(const std::vector<float>& got, const std::vector<float>& ref,
                                                 double atol_frac, double rtol, const std::string& what) {
  return kernels::test::all_close(got, ref, atol_frac * std::max(max_abs(ref), 1e-30), rtol, what);
}

}  // namespace slidedp::kernels::cuda::test
