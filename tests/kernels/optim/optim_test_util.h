// Helpers shared by the optimizer-kernel tests: guarded buffers (guard bytes around every output,
// optional element misalignment), the SIMD levels to compare against the scalar reference (skipped
// with a visible reason where the CPU lacks one), and deterministic data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/simd_level.h"

namespace slidedp::kernels::testing {

// n elements of T placed `misalign` elements past a 64-byte boundary, with kGuardBytes of a known
// pattern on both sides, so an overrun or underrun by a vector store is caught.
template <class T>
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 128;
  static constexpr unsigned char kPattern = 0xA5;

  GuardedBuffer(int64_t n, int misalign) : n_(n), misalign_(misalign) {
    bytes_ = 2 * kGuardBytes + static_cast<size_t>(misalign + n) * sizeof(T);
    base_ = static_cast<unsigned char*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64));
    std::memset(base_, kPattern, bytes_);
  }
  ~GuardedBuffer() { std::free(base_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  T* data() { return reinterpret_cast<T*>(base_ + kGuardBytes) + misalign_; }
  const T* data() const { return reinterpret_cast<const T*>(base_ + kGuardBytes) + misalign_; }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) { return data()[i]; }
  const T& operator[](int64_t i) const { return data()[i]; }

  void assign(const std::vector<T>& v) {
    if (!v.empty()) std::memcpy(data(), v.data(), v.size() * sizeof(T));
  }
  std::vector<T> to_vector() const { return std::vector<T>(data(), data() + n_); }

  // The bytes before data() and after data() + n: untouched?
  bool guards_intact() const {
    const unsigned char* lo = base_;
    const unsigned char* hi = reinterpret_cast<const unsigned char*>(data() + n_);
    const size_t lo_bytes = static_cast<size_t>(reinterpret_cast<const unsigned char*>(data()) - lo);
    const size_t hi_bytes = static_cast<size_t>(base_ + bytes_ - hi);
    for (size_t i = 0; i < lo_bytes; ++i)
      if (lo[i] != kPattern) return false;
    for (size_t i = 0; i < hi_bytes; ++i)
      if (hi[i] != kPattern) return false;
    return true;
  }

 private:
  int64_t n_;
  int misalign_;
  size_t bytes_;
  unsigned char* base_;
};

// Bitwise equality of two arrays, reporting the first differing index.
template <class T>
::testing::AssertionResult same_bits(const T* got, const T* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << n;
    }
  }
  return ::testing::AssertionSuccess();
}

// A SIMD level to check against the scalar reference.
struct LevelCase {
  SimdLevel level;
  bool avx512_bf16;  // use AVX512-BF16 conversions (only meaningful for kAvx512)
  const char* name;
};

// gtest prints parameters with this (instead of a byte dump) in failure messages.
inline void PrintTo(const LevelCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<LevelCase> simd_cases() {
  return {{SimdLevel::kScalar, false, "scalar"},
          {SimdLevel::kAvx2, false, "avx2"},
          {SimdLevel::kAvx512, false, "avx512"},
          {SimdLevel::kAvx512, true, "avx512_bf16"}};
}

// Empty when the level can run here, else why not (shown by GTEST_SKIP).
inline std::string unavailable_reason(const LevelCase& c) {
  if (!simd_level_supported(c.level)) {
    return std::string("this CPU or build has no ") + simd_level_name(c.level) + " support";
  }
  if (c.avx512_bf16 && !cpu_simd_support().avx512_bf16) return "this CPU or build has no AVX512_BF16";
  return "";
}

inline void use_level(const LevelCase& c) { set_simd_level(c.level, c.avx512_bf16); }
inline void use_scalar() { set_simd_level(SimdLevel::kScalar); }

// Fixture for tests parametrized by level: skips unavailable levels, restores the best level after.
class LevelTest : public ::testing::TestWithParam<LevelCase> {
 protected:
  void SetUp() override {
    const std::string why = unavailable_reason(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override { set_simd_level(best_simd_level()); }
};

inline std::string level_name(const ::testing::TestParamInfo<LevelCase>& info) { return info.param.name; }

// Odd sizes around the vector widths (8 and 16 lanes), and one that is not a multiple of anything.
inline const std::vector<int64_t>& odd_sizes() {
  static const std::vector<int64_t> sizes = {0, 1, 7, 15, 16, 17, 1003};
  return sizes;
}

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<bf16_bits> random_bf16(int64_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> f = random_floats(n, seed, lo, hi);
  std::vector<bf16_bits> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = float_to_bf16(f[i]);
  return v;
}

}  // namespace slidedp::kernels::testing
