// bf16 rounding, bit-exact against the scalar reference of common/bf16.h at every SIMD level:
// bf16 -> fp32 over all 65,536 patterns, fp32 -> bf16 over chosen edge values (ties both ways, NaN
// payloads, Inf, signed zero, subnormals, the largest finite value rounding up to Inf) and a sweep of
// every bf16 pattern with the low half at the rounding boundaries. NaNs are compared bitwise too:
// the conversion is specified on bit patterns, so every path must produce the same quiet NaN.
#include "kernels/cpu/optim/bf16_convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <vector>

#include "kernels/cpu/optim/sum_squares.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using Bf16ConvertTest = LevelTest;

std::vector<float> from_bits(const std::vector<uint32_t>& bits) {
  std::vector<float> f;
  for (uint32_t b : bits) f.push_back(std::bit_cast<float>(b));
  return f;
}

// Edge values, each with the bf16 pattern the reference must produce (checked in the first test).
struct Edge {
  uint32_t f32;
  uint16_t bf16;
};
const std::vector<Edge>& edges() {
  static const std::vector<Edge> e = {
      {0x00000000u, 0x0000u},  // +0
      {0x80000000u, 0x8000u},  // -0
      {0x3f800000u, 0x3f80u},  // 1.0, exact
      {0x3f808000u, 0x3f80u},  // tie, even below: down
      {0x3f818000u, 0x3f82u},  // tie, odd below: up
      {0x3f808001u, 0x3f81u},  // just above a tie: up
      {0x3f807fffu, 0x3f80u},  // just below a tie: down
      {0xbf818000u, 0xbf82u},  // negative tie, odd: away from zero
      {0x7f7fffffu, 0x7f80u},  // largest finite fp32: rounds up to +Inf
      {0xff7fffffu, 0xff80u},  // ... and to -Inf
      {0x7f7f7fffu, 0x7f7fu},  // largest value that stays finite
      {0x7f7f8000u, 0x7f80u},  // tie on the largest bf16 (odd): up to Inf
      {0x7f800000u, 0x7f80u},  // +Inf
      {0xff800000u, 0xff80u},  // -Inf
      {0x7fc00000u, 0x7fc0u},  // canonical quiet NaN
      {0xffc00000u, 0xffc0u},  // negative quiet NaN
      {0x7f800001u, 0x7fc0u},  // signalling NaN, payload only in the low half: quieted
      {0x7fa00000u, 0x7fe0u},  // signalling NaN with a high payload bit: kept, quieted
      {0x7fffffffu, 0x7fffu},  // all-ones payload: no carry into the sign
      {0xffffffffu, 0xffffu},  // negative all-ones NaN
      {0xff812345u, 0xffc1u},  // negative signalling NaN with payload
      {0x00000001u, 0x0000u},  // smallest subnormal: rounds to +0
      {0x80000001u, 0x8000u},  // ... and to -0
      {0x00008000u, 0x0000u},  // subnormal tie, even: down
      {0x00018000u, 0x0002u},  // subnormal tie, odd: up
      {0x00010001u, 0x0001u},  // subnormal just above a bf16 subnormal
      {0x007fffffu, 0x0080u},  // largest subnormal: rounds up to the smallest normal
      {0x807fffffu, 0x8080u},  // ... negative
      {0x00800000u, 0x0080u},  // smallest normal
      {0x00400000u, 0x0040u},  // subnormal that is exactly a bf16 subnormal
  };
  return e;
}

TEST(Bf16Reference, EdgeTableMatchesCommonBf16) {
  for (const Edge& e : edges()) {
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(e.f32)), e.bf16) << std::hex << "f32 0x" << e.f32;
  }
}

TEST_P(Bf16ConvertTest, AllBf16PatternsWidenExactly) {
  std::vector<bf16_bits> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<bf16_bits>(i);
  for (int mis : {0, 1}) {
    GuardedBuffer<bf16_bits> in(65536, mis);
    GuardedBuffer<float> out(65536, mis);
    in.assign(all);
    use_level(GetParam());
    bf16_to_f32(in.data(), out.data(), 65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint32_t want = std::bit_cast<uint32_t>(bf16_to_float(static_cast<bf16_bits>(i)));
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), want) << "bf16 0x" << std::hex << i;
    }
    EXPECT_TRUE(out.guards_intact());
  }
}

TEST_P(Bf16ConvertTest, EdgeValuesRoundLikeReference) {
  std::vector<uint32_t> bits;
  for (const Edge& e : edges()) bits.push_back(e.f32);
  const std::vector<float> f = from_bits(bits);
  // Each edge value at every lane position of a vector, and in a masked tail: rotate the list
  // through 17 starting offsets of a 47-element buffer.
  for (int shift = 0; shift < 17; ++shift) {
    const int64_t n = 47;
    std::vector<float> vals(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      vals[static_cast<size_t>(i)] = f[static_cast<size_t>((i + shift) % static_cast<int64_t>(f.size()))];
    GuardedBuffer<float> in(n, shift % 2);
    GuardedBuffer<bf16_bits> out(n, shift % 2);
    in.assign(vals);
    use_level(GetParam());
    f32_to_bf16(in.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], float_to_bf16(vals[static_cast<size_t>(i)]))
          << "f32 0x" << std::hex << std::bit_cast<uint32_t>(vals[static_cast<size_t>(i)]);
    }
    EXPECT_TRUE(out.guards_intact());
  }
}

// Every bf16 pattern with the low 16 bits at the boundaries of rounding: 0x0000 (exact), 0x7fff
// (below the tie), 0x8000 (tie), 0x8001 (above), 0xffff (carry). 327,680 values covering every sign,
// exponent (including subnormals, Inf and NaN) and mantissa.
TEST_P(Bf16ConvertTest, BoundarySweepOfAllPatterns) {
  const uint32_t lows[] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  std::vector<uint32_t> bits;
  bits.reserve(65536 * 5);
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) bits.push_back((hi << 16) | lo);
  }
  const std::vector<float> f = from_bits(bits);
  const int64_t n = static_cast<int64_t>(f.size()) - 3;  // not a multiple of the vector width
  GuardedBuffer<float> in(n, 1);
  GuardedBuffer<bf16_bits> out(n, 1);
  in.assign(std::vector<float>(f.begin(), f.begin() + n));
  use_level(GetParam());
  f32_to_bf16(in.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], float_to_bf16(f[static_cast<size_t>(i)]))
        << "f32 0x" << std::hex << bits[static_cast<size_t>(i)];
  }
  EXPECT_TRUE(out.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Levels, Bf16ConvertTest, ::testing::ValuesIn(simd_cases()), level_name);

}  // namespace
}  // namespace slidedp::kernels::testing
