// AdamW with 8-bit blockwise moments (adamw.h, moment_codes.h, q8_moments.h):
//  * the codes are the values they claim: every code decodes to the codebook written from its
//    definition (ldexp of exponent and fraction), and the encoder picks the nearest codebook entry,
//    ties to the even code, checked at every midpoint between neighbours (and one float either side)
//    and against a brute-force search on 200,000 values spread over all the magnitudes;
//  * decoding and re-encoding gives back the codes and scales bit for bit (what makes a resume from a
//    checkpoint's fp32 moments exact), zero blocks and short last blocks included;
//  * every SIMD level equals the scalar reference bit for bit (master, mirror, codes and scales) over
//    fp32 and split masters, both gradient types, the fused reduction and a range that starts at a
//    later block;
//  * the scalar reference equals a naive one: decode with the codebook, the fp32 update, the block's
//    largest magnitude as its scale, brute-force nearest codes;
//  * a block's decay is carried by its scale: with beta2 = 0.999 and no gradient, v decays over 1000
//    steps as in fp32 to within one code step (2^-4 relative), where a nearest-rounded code without
//    a moving scale would never move.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/moment_codes.h"
#include "kernels/cpu/optim/q8_moments.h"
#include "tests/kernels/optim/moment_format_fixture.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

// The codebooks from their definitions: magnitude code c = exponent field e (c >> 3) and fraction f
// (c & 7); e = 0 is subnormal (f steps of 2^(1 - bias - 3)), else (1 + f / 8) * 2^(e - bias).
double magnitude(uint32_t c, int bias) {
  const uint32_t e = c >> 3, f = c & 7;
  if (e == 0) return std::ldexp(static_cast<double>(f), 1 - bias - 3);
  return std::ldexp(1.0 + f / 8.0, static_cast<int>(e) - bias);
}
double first_moment_value(uint8_t code) {  // bias 15, sign in bit 7
  const double mag = magnitude(code & 0x7fu, 15);
  return (code & 0x80u) ? -mag : mag;
}
double second_moment_value(uint8_t code) { return magnitude(code, 31); }

// Nearest magnitude code to |y| among `codes` entries, ties to the even code, past the top saturated.
uint32_t nearest_magnitude(double y, int bias, uint32_t codes) {
  uint32_t best = 0;
  double best_gap = std::fabs(y - magnitude(0, bias));
  for (uint32_t c = 1; c < codes; ++c) {
    const double gap = std::fabs(y - magnitude(c, bias));
    if (gap < best_gap || (gap == best_gap && c % 2 == 0)) best = c, best_gap = gap;
  }
  return best;
}
uint8_t nearest_first_moment(float y) {
  const uint32_t mag = nearest_magnitude(std::fabs(static_cast<double>(y)), 15, 128);
  return static_cast<uint8_t>((std::signbit(y) ? 0x80u : 0u) | mag);
}
uint8_t nearest_second_moment(float y) {
  return static_cast<uint8_t>(nearest_magnitude(std::fabs(static_cast<double>(y)), 31, 256));
}

TEST(Q8MomentCodes, EveryCodeDecodesToItsCodebookValue) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_EQ(static_cast<double>(FirstMomentCode::decode(code)), first_moment_value(code)) << c;
    EXPECT_EQ(static_cast<double>(SecondMomentCode::decode(code)), second_moment_value(code)) << c;
    EXPECT_EQ(FirstMomentCode::encode(FirstMomentCode::decode(code)), code) << c;
    EXPECT_EQ(SecondMomentCode::encode(SecondMomentCode::decode(code)), code) << c;
  }
  EXPECT_EQ(FirstMomentCode::decode(120), 1.0f);  // the top binade's first code: a block's largest
  EXPECT_EQ(SecondMomentCode::decode(248), 1.0f);
}

// Between neighbours c and c + 1 the midpoint (exact in fp32: one bit more than either) goes to the
// even one, the floats beside it to their own side.
template <class Code>
void expect_midpoints(uint32_t codes, uint8_t sign) {
  for (uint32_t c = 0; c + 1 < codes; ++c) {
    const auto lo = static_cast<uint8_t>(c | sign), hi = static_cast<uint8_t>((c + 1) | sign);
    const float a = Code::decode(lo), b = Code::decode(hi);
    const float mid = (a + b) / 2;
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2) << "the midpoint must be exact";
    EXPECT_EQ(Code::encode(mid), c % 2 == 0 ? lo : hi) << c;
    EXPECT_EQ(Code::encode(std::nextafter(mid, a)), lo) << c;
    EXPECT_EQ(Code::encode(std::nextafter(mid, b)), hi) << c;
  }
}

TEST(Q8MomentCodes, MidpointsRoundToTheEvenCodeAndNeighboursToTheirSide) {
  expect_midpoints<FirstMomentCode>(128, 0);
  expect_midpoints<FirstMomentCode>(128, 0x80);
  expect_midpoints<SecondMomentCode>(256, 0);
}

TEST(Q8MomentCodes, EncodingIsTheNearestCodebookEntry) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-40.0, 0.5), uniform(-1.0, 1.0);
  for (int i = 0; i < 200000; ++i) {
    const float y = i % 2 ? static_cast<float>(std::exp2(exponent(rng))) * (i % 4 == 1 ? -1.0f : 1.0f)
                          : static_cast<float>(uniform(rng));
    ASSERT_EQ(FirstMomentCode::encode(y), nearest_first_moment(y)) << y;
    ASSERT_EQ(SecondMomentCode::encode(std::fabs(y)), nearest_second_moment(y)) << y;
  }
  EXPECT_EQ(SecondMomentCode::encode(3.0f), 255) << "past the top saturates";
  EXPECT_EQ(FirstMomentCode::encode(-3.0f), 255);
}

TEST(Q8MomentCodes, DecodingThenEncodingGivesBackCodesAndScales) {
  const int64_t n = 3 * kQ8Block + 77;  // a short last block
  std::vector<float> m = random_floats(n, 11, -0.1f, 0.1f), v = random_floats(n, 12, 0.0f, 1e-3f);
  for (int64_t i = 0; i < 40; ++i)
    v[static_cast<size_t>(i * 7)] = std::ldexp(1.0f, -30 - static_cast<int>(i));
  std::fill(m.begin() + kQ8Block, m.begin() + 2 * kQ8Block, 0.0f);  // a zero block
  for (Moment which : {Moment::kFirst, Moment::kSecond}) {
    const std::vector<float>& x = which == Moment::kFirst ? m : v;
    std::vector<uint8_t> codes(static_cast<size_t>(n)), again(codes.size());
    std::vector<float> scales(static_cast<size_t>(q8_blocks(n))), scales_again(scales.size()),
        decoded(x.size());
    q8_encode(which, x.data(), n, codes.data(), scales.data());
    q8_decode(which, codes.data(), scales.data(), n, decoded.data());
    q8_encode(which, decoded.data(), n, again.data(), scales_again.data());
    EXPECT_EQ(codes, again);
    EXPECT_TRUE(same_bits(scales_again.data(), scales.data(), q8_blocks(n)));
    for (int64_t b = 0; b < q8_blocks(n); ++b) {
      const auto first = x.begin() + b * kQ8Block, last = x.begin() + std::min(n, (b + 1) * kQ8Block);
      float top = 0;
      for (auto it = first; it != last; ++it) top = std::max(top, std::fabs(*it));
      EXPECT_EQ(scales[static_cast<size_t>(b)], top)
          << "block " << b << ": the scale is its largest magnitude";
    }
  }
}

// The 8-bit moments of n elements and their blocks' scales beside the master (moment_format_fixture.h).
struct Q8MomentsUnderTest : MasterUnderTest {
  GuardedBuffer<float> m_scale, v_scale;
  GuardedBuffer<uint8_t> m, v;
  Q8MomentsUnderTest(int64_t n, int mis, bool split_master)
      : MasterUnderTest(n, mis, split_master),
        m_scale(q8_blocks(n), mis),
        v_scale(q8_blocks(n), mis),
        m(n, mis),
        v(n, mis) {
    const std::vector<float> m0 = random_floats(n, 32, -0.1f, 0.1f), v0 = random_floats(n, 33, 0.0f, 0.01f);
    q8_encode(Moment::kFirst, m0.data(), n, m.data(), m_scale.data());
    q8_encode(Moment::kSecond, v0.data(), n, v.data(), v_scale.data());
  }
  AdamwState state() {
    AdamwState s;
    point(s);
    s.exp_avg_q8 = m.data();
    s.exp_avg_sq_q8 = v.data();
    s.exp_avg_scale = m_scale.data();
    s.exp_avg_sq_scale = v_scale.data();
    return s;
  }
};

void expect_same(const Q8MomentsUnderTest& a, const Q8MomentsUnderTest& b, int64_t n) {
  a.expect_same_as(b, n);
  EXPECT_TRUE(same_bits(a.m.data(), b.m.data(), n)) << "m";
  EXPECT_TRUE(same_bits(a.v.data(), b.v.data(), n)) << "v";
  EXPECT_TRUE(same_bits(a.m_scale.data(), b.m_scale.data(), q8_blocks(n))) << "m scales";
  EXPECT_TRUE(same_bits(a.v_scale.data(), b.v_scale.data(), q8_blocks(n))) << "v scales";
  EXPECT_TRUE(b.m.guards_intact() && b.v.guards_intact() && b.m_scale.guards_intact() &&
              b.v_scale.guards_intact());
}

using Q8MomentsAdamwTest = LevelTest;

TEST_P(Q8MomentsAdamwTest, EveryLevelEqualsTheScalarReference) {
  std::vector<int64_t> sizes = odd_sizes();
  for (int64_t n : {kQ8Block, kQ8Block + 1, 2 * kQ8Block + 88}) sizes.push_back(n);
  for (int64_t n : sizes)
    for (int mis : {0, 1})
      for (bool split : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis << " split=" << split);
        GuardedBuffer<float> g32(n, mis);
        GuardedBuffer<bf16_bits> g16(n, mis);
        g32.assign(random_floats(n, 35, -2.0f, 2.0f));
        g16.assign(random_bf16(n, 36, -2.0f, 2.0f));
        const int64_t later = n > kQ8Block ? kQ8Block : 0;  // a range from the second block on
        Q8MomentsUnderTest ref(n, mis, split), got(n, mis, split);
        const std::vector<const bf16_bits*> slots = {g16.data(), g16.data()};
        auto run = [&](Q8MomentsUnderTest& s) {
          adamw_update(s.state(), g32.data(), moment_format_hyper(), 0, n);
          adamw_update(s.state(), g16.data(), moment_format_hyper(), later, n);
          reduce_adamw_update(s.state(), GradSlots<bf16_bits>{slots, 0.5f, g32.data()}, moment_format_hyper(),
                              0, n);
        };
        use_scalar();
        run(ref);
        use_level(GetParam());
        run(got);
        expect_same(ref, got, n);
      }
}

INSTANTIATE_TEST_SUITE_P(Levels, Q8MomentsAdamwTest, ::testing::ValuesIn(simd_cases()), level_name);

TEST(Q8Moments, ScalarEqualsTheNaiveBlockUpdate) {
  const int64_t n = 2 * kQ8Block + 100;
  use_scalar();
  Q8MomentsUnderTest s(n, 0, false);
  std::vector<float> p = s.p.to_vector(), m(static_cast<size_t>(n)), v(m.size());
  for (int64_t i = 0; i < n; ++i) {
    m[static_cast<size_t>(i)] = static_cast<float>(first_moment_value(s.m[i])) * s.m_scale[i / kQ8Block];
    v[static_cast<size_t>(i)] = static_cast<float>(second_moment_value(s.v[i])) * s.v_scale[i / kQ8Block];
  }
  const std::vector<float> g = random_floats(n, 37, -2.0f, 2.0f);
  adamw_update(AdamwState{p.data(), m.data(), v.data(), nullptr}, g.data(), moment_format_hyper(), 0,
               n);  // fp32 moments
  adamw_update(s.state(), g.data(), moment_format_hyper(), 0, n);
  for (int64_t b = 0; b * kQ8Block < n; ++b) {
    const int64_t lo = b * kQ8Block, hi = std::min(n, lo + kQ8Block);
    float m_top = 0, v_top = 0;
    for (int64_t i = lo; i < hi; ++i)
      m_top = std::max(m_top, std::fabs(m[static_cast<size_t>(i)])),
      v_top = std::max(v_top, v[static_cast<size_t>(i)]);
    ASSERT_EQ(s.m_scale[b], m_top) << b;
    ASSERT_EQ(s.v_scale[b], v_top) << b;
    for (int64_t i = lo; i < hi; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(s.p[i]), std::bit_cast<uint32_t>(p[static_cast<size_t>(i)])) << i;
      ASSERT_EQ(s.m[i], nearest_first_moment(m[static_cast<size_t>(i)] * (1.0f / m_top))) << i;
      ASSERT_EQ(s.v[i], nearest_second_moment(v[static_cast<size_t>(i)] * (1.0f / v_top))) << i;
    }
  }
  set_simd_level(best_simd_level());
}

// v = 0.999 v per step (no gradient) for 1000 steps from values spread over four decades.
TEST(Q8Moments, SecondMomentDecaysAsInFp32BecauseTheScaleCarriesIt) {
  const int64_t n = kQ8Block;
  const int steps = 1000;
  std::vector<float> zero(static_cast<size_t>(n), 0.0f), p(static_cast<size_t>(n), 1.0f), p8(p);
  std::vector<float> m32(static_cast<size_t>(n), 0.0f), v32(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v32[static_cast<size_t>(i)] = std::pow(10.0f, -4.0f * static_cast<float>(i) / n);
  std::vector<uint8_t> m8(static_cast<size_t>(n)), v8(m8.size());
  float m_scale = 0, v_scale = 0;
  q8_encode(Moment::kFirst, m32.data(), n, m8.data(), &m_scale);
  q8_encode(Moment::kSecond, v32.data(), n, v8.data(), &v_scale);
  std::vector<float> v_start(static_cast<size_t>(n));
  q8_decode(Moment::kSecond, v8.data(), &v_scale, n, v_start.data());
  std::vector<float> v_ref = v_start;
  AdamwHyper h;
  h.lr = 0;
  h.weight_decay = 0;
  for (int t = 1; t <= steps; ++t) {
    h.step = t;
    adamw_update(AdamwState{p.data(), m32.data(), v_ref.data(), nullptr}, zero.data(), h, 0, n);
    AdamwState s{p8.data(), nullptr, nullptr, nullptr};
    s.exp_avg_q8 = m8.data(), s.exp_avg_sq_q8 = v8.data(), s.exp_avg_scale = &m_scale,
    s.exp_avg_sq_scale = &v_scale;
    adamw_update(s, zero.data(), h, 0, n);
  }
  std::vector<float> v_got(static_cast<size_t>(n));
  q8_decode(Moment::kSecond, v8.data(), &v_scale, n, v_got.data());
  const double decay = std::pow(0.999, steps);
  for (int64_t i = 0; i < n; ++i) {
    const double want = v_ref[static_cast<size_t>(i)];
    EXPECT_NEAR(want, v_start[static_cast<size_t>(i)] * decay, 1e-3 * want);
    // One code step (2^-3 of the value at most) bounds the drift; fp32's 1000 roundings add 1e-4.
    EXPECT_NEAR(v_got[static_cast<size_t>(i)], want, (0.0625 + 1e-4) * want) << i;
  }
}

}  // namespace
}  // namespace slidedp::kernels::testing
