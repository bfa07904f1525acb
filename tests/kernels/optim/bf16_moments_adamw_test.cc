// AdamW with bf16 moments (adamw.h, stochastic_rounding.h):
//  * every SIMD level equals the scalar reference bit for bit (the noise is a function of seed and
//    element index, not of the level or the tiling), over fp32 and split masters, both gradient types
//    and the fused reduction;
//  * the scalar reference equals a naive one: the fp32 update of the widened moments, each result
//    rounded by float_to_bf16_stochastic with its element's noise;
//  * the rounding is unbiased: a value a quarter of the way between two bf16 neighbours rounds up in a
//    quarter of 2^16 trials, within 5 standard deviations of the binomial;
//  * what it is for: with beta2 = 0.999 and no gradient, v decays as 0.999^t in fp32; a nearest-rounded
//    bf16 v never moves (a 0.1% step is under half a bf16 step), the stochastic one decays on average
//    as fp32 does (mean over 4096 elements within 2%).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/stochastic_rounding.h"
#include "tests/kernels/optim/moment_format_fixture.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using Bf16MomentsAdamwTest = LevelTest;

// The bf16 moments of n elements beside the master (moment_format_fixture.h).
struct Bf16MomentsUnderTest : MasterUnderTest {
  GuardedBuffer<bf16_bits> m, v;
  Bf16MomentsUnderTest(int64_t n, int mis, bool split_master)
      : MasterUnderTest(n, mis, split_master), m(n, mis), v(n, mis) {
    m.assign(random_bf16(n, 32, -0.1f, 0.1f));
    v.assign(random_bf16(n, 33, 0.0f, 0.01f));
  }
  AdamwState state() {
    AdamwState s;
    point(s);
    s.exp_avg_bf16 = m.data();
    s.exp_avg_sq_bf16 = v.data();
    s.m_seed = 0x1111u;
    s.v_seed = 0x2222u;
    s.moment_index_base = 1000;
    return s;
  }
};

void expect_same(const Bf16MomentsUnderTest& a, const Bf16MomentsUnderTest& b, int64_t n) {
  a.expect_same_as(b, n);
  EXPECT_TRUE(same_bits(a.m.data(), b.m.data(), n)) << "m";
  EXPECT_TRUE(same_bits(a.v.data(), b.v.data(), n)) << "v";
  EXPECT_TRUE(b.m.guards_intact() && b.v.guards_intact());
}

TEST_P(Bf16MomentsAdamwTest, EveryLevelEqualsTheScalarReference) {
  for (int64_t n : odd_sizes())
    for (int mis : {0, 1})
      for (bool split : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis << " split=" << split);
        GuardedBuffer<float> g32(n, mis);
        GuardedBuffer<bf16_bits> g16(n, mis);
        g32.assign(random_floats(n, 35, -2.0f, 2.0f));
        g16.assign(random_bf16(n, 36, -2.0f, 2.0f));
        const int64_t begin = n > 2 ? 2 : 0;
        Bf16MomentsUnderTest ref(n, mis, split), got(n, mis, split);
        use_scalar();
        adamw_update(ref.state(), g32.data(), moment_format_hyper(), begin, n);
        adamw_update(ref.state(), g16.data(), moment_format_hyper(), begin, n);
        const std::vector<const bf16_bits*> slots = {g16.data(), g16.data()};
        reduce_adamw_update(ref.state(), GradSlots<bf16_bits>{slots, 0.5f, g32.data()}, moment_format_hyper(),
                            begin, n);
        use_level(GetParam());
        adamw_update(got.state(), g32.data(), moment_format_hyper(), begin, n);
        adamw_update(got.state(), g16.data(), moment_format_hyper(), begin, n);
        reduce_adamw_update(got.state(), GradSlots<bf16_bits>{slots, 0.5f, g32.data()}, moment_format_hyper(),
                            begin, n);
        expect_same(ref, got, n);
      }
}

INSTANTIATE_TEST_SUITE_P(Levels, Bf16MomentsAdamwTest, ::testing::ValuesIn(simd_cases()), level_name);

TEST(Bf16Moments, ScalarEqualsTheFp32UpdateRoundedStochastically) {
  const int64_t n = 1003;
  use_scalar();
  Bf16MomentsUnderTest s(n, 0, false);
  GuardedBuffer<float> p(n, 0), m(n, 0), v(n, 0), g(n, 0);
  p.assign(s.p.to_vector());
  for (int64_t i = 0; i < n; ++i) m[i] = bf16_to_float(s.m[i]), v[i] = bf16_to_float(s.v[i]);
  g.assign(random_floats(n, 37, -2.0f, 2.0f));
  adamw_update(AdamwState{p.data(), m.data(), v.data(), nullptr}, g.data(), moment_format_hyper(), 0, n);
  adamw_update(s.state(), g.data(), moment_format_hyper(), 0, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(s.p[i]), std::bit_cast<uint32_t>(p[i])) << i;
    const auto index = static_cast<uint32_t>(1000 + i);
    ASSERT_EQ(s.m[i], float_to_bf16_stochastic(m[i], rounding_noise(0x1111u, index))) << i;
    ASSERT_EQ(s.v[i], float_to_bf16_stochastic(v[i], rounding_noise(0x2222u, index))) << i;
  }
  set_simd_level(best_simd_level());
}

TEST(Bf16Moments, StochasticRoundingIsUnbiased) {
  // 1 + 2^-9: a quarter of the way from bf16 1.0 to its upper neighbour 1 + 2^-7; and its negative.
  for (float x : {1.0f + std::ldexp(1.0f, -9), -(1.0f + std::ldexp(1.0f, -9))}) {
    const bf16_bits down = float_to_bf16(std::copysign(1.0f, x));
    int up = 0;
    const int trials = 1 << 16;
    for (int i = 0; i < trials; ++i) {
      const bf16_bits r = float_to_bf16_stochastic(x, rounding_noise(0xabcdu, static_cast<uint32_t>(i)));
      ASSERT_TRUE(r == down || r == static_cast<bf16_bits>(down + 1)) << r;
      up += r != down;
    }
    const double sigma = std::sqrt(trials * 0.25 * 0.75);
    EXPECT_NEAR(up, trials * 0.25, 5 * sigma) << x;
  }
}

// v = 0.999 v per step (no gradient, beta2 = 0.999) for 1000 steps from 1.0.
TEST(Bf16Moments, SecondMomentDecaysAsInFp32OnlyWithStochasticRounding) {
  const int64_t n = 4096;
  const int steps = 1000;
  std::vector<float> zero(static_cast<size_t>(n), 0.0f), p(static_cast<size_t>(n), 1.0f);
  std::vector<float> m32(static_cast<size_t>(n), 0.0f), v32(static_cast<size_t>(n), 1.0f);
  std::vector<bf16_bits> m16(static_cast<size_t>(n), 0), v16(static_cast<size_t>(n), float_to_bf16(1.0f));
  std::vector<float> p16(p);
  AdamwHyper h;
  h.lr = 0;
  h.weight_decay = 0;
  for (int t = 1; t <= steps; ++t) {
    h.step = t;
    adamw_update(AdamwState{p.data(), m32.data(), v32.data(), nullptr}, zero.data(), h, 0, n);
    AdamwState s{p16.data(), nullptr, nullptr, nullptr};
    s.exp_avg_bf16 = m16.data();
    s.exp_avg_sq_bf16 = v16.data();
    s.m_seed = moment_seed(t, 0, 0);
    s.v_seed = moment_seed(t, 0, 1);
    adamw_update(s, zero.data(), h, 0, n);
  }
  const double fp32 = v32[0], closed_form = std::pow(0.999, steps);
  EXPECT_NEAR(fp32, closed_form, 1e-4 * closed_form);
  double mean = 0;
  for (bf16_bits b : v16) mean += bf16_to_float(b);
  mean /= static_cast<double>(n);
  EXPECT_NEAR(mean, fp32, 0.02 * fp32);
  // Nearest rounding of the same recurrence stays at 1.0.
  float nearest = 1.0f;
  for (int t = 1; t <= steps; ++t) nearest = round_to_bf16(nearest * 0.999f);
  EXPECT_EQ(nearest, 1.0f);
}

}  // namespace
}  // namespace slidedp::kernels::testing
