// AdamW against a double-precision closed form of torch.optim.AdamW over 5 steps with changing
// learning rates, gradient scales and clip coefficients, at every SIMD level; NaN/Inf handling;
// hyper-parameter validation; the clip coefficient.
#include "kernels/cpu/optim/adamw.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using AdamwClosedFormTest = LevelTest;

// Relative tolerance of the fp32 state against the double closed form, applied to the magnitude of
// the terms that make each value (not just the value, which can cancel to ~0): each step rounds
// about 10 fp32 operations (<= 2^-24 each) and feeds them forward, so 5 steps accumulate well under
// 1e-6; 4e-6 (~64 ulp) leaves margin while any formula slip (bias correction, eps placement, decay
// order) shows up at 1e-4 or more.
constexpr double kRtol = 4e-6;

struct Step {
  double lr, grad_scale, clip_coef;
};

template <class G>
void run_closed_form(const LevelCase& level) {
  const int64_t n = 1003;
  const std::vector<Step> steps = {
      {1e-3, 1.0, 1.0}, {3e-3, 0.5, 1.0}, {2e-4, 0.25, 0.6}, {1e-2, 1.0, 0.9}, {5e-3, 0.125, 1.0}};
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.1;

  std::vector<float> p = random_floats(n, 1, -1.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  std::vector<bf16_bits> mirror(static_cast<size_t>(n), 0);
  // Double-precision state and the running magnitudes that scale each tolerance.
  std::vector<double> pd(p.begin(), p.end()), md(static_cast<size_t>(n), 0.0),
      vd(static_cast<size_t>(n), 0.0);
  std::vector<double> g_mag(static_cast<size_t>(n), 0.0), update_mag(static_cast<size_t>(n), 0.0);

  use_level(level);
  for (size_t t = 0; t < steps.size(); ++t) {
    // Gradients with a wide spread of magnitudes and both signs, so m cancels across steps.
    std::vector<float> gf = random_floats(n, 100 + static_cast<uint32_t>(t), -1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i)
      gf[static_cast<size_t>(i)] *= std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
    std::vector<G> g(static_cast<size_t>(n));
    for (size_t i = 0; i < g.size(); ++i) {
      if constexpr (std::is_same_v<G, float>) {
        g[i] = gf[i];
      } else {
        g[i] = float_to_bf16(gf[i]);
      }
    }

    AdamwHyper h;
    h.lr = steps[t].lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.weight_decay = wd;
    h.step = static_cast<int64_t>(t) + 1;
    h.grad_scale = steps[t].grad_scale;
    h.clip_coef = steps[t].clip_coef;
    adamw_update(AdamwState{p.data(), m.data(), v.data(), mirror.data()}, g.data(), h, 0, n);

    // torch.optim.AdamW, single tensor, in double.
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(h.step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(h.step));
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      double gi;
      if constexpr (std::is_same_v<G, float>) {
        gi = g[i];
      } else {
        gi = bf16_to_float(g[i]);
      }
      gi *= h.grad_scale * h.clip_coef;
      pd[i] *= 1.0 - h.lr * wd;
      md[i] = beta1 * md[i] + (1.0 - beta1) * gi;
      vd[i] = beta2 * vd[i] + (1.0 - beta2) * gi * gi;
      const double update = (h.lr / bc1) * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + eps);
      pd[i] -= update;
      g_mag[i] = std::max(g_mag[i], std::abs(gi));
      update_mag[i] += std::abs(update);
    }

    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const double m_tol = kRtol * (std::abs(md[i]) + g_mag[i]);
      const double v_tol = kRtol * (vd[i] + g_mag[i] * g_mag[i]);
      const double p_tol = kRtol * (std::abs(pd[i]) + update_mag[i]);
      ASSERT_NEAR(m[i], md[i], m_tol) << "exp_avg, step " << h.step << " element " << i;
      ASSERT_NEAR(v[i], vd[i], v_tol) << "exp_avg_sq, step " << h.step << " element " << i;
      ASSERT_NEAR(p[i], pd[i], p_tol) << "param, step " << h.step << " element " << i;
      // The mirror is exactly the RNE rounding of the new fp32 weight.
      ASSERT_EQ(mirror[i], float_to_bf16(p[i])) << "mirror, step " << h.step << " element " << i;
    }
  }
}

TEST_P(AdamwClosedFormTest, Fp32GradientsFiveSteps) { run_closed_form<float>(GetParam()); }
TEST_P(AdamwClosedFormTest, Bf16GradientsFiveSteps) { run_closed_form<bf16_bits>(GetParam()); }

// A NaN or Inf gradient poisons its parameter (AdamW cannot repair it; the executor checks the norm
// first), and the mirror carries a quiet NaN, never a signalling one or a finite value.
TEST_P(AdamwClosedFormTest, NonFiniteGradientsGiveQuietNanMirror) {
  const int64_t n = 37;
  std::vector<float> p = random_floats(n, 2, -1.0f, 1.0f), m(static_cast<size_t>(n), 0.0f),
                     v(static_cast<size_t>(n), 0.0f);
  std::vector<float> g = random_floats(n, 3, -1.0f, 1.0f);
  g[0] = std::numeric_limits<float>::quiet_NaN();
  g[17] = std::bit_cast<float>(0x7f800001u);  // signalling NaN
  g[33] = std::numeric_limits<float>::infinity();
  std::vector<bf16_bits> mirror(static_cast<size_t>(n), 0);
  use_level(GetParam());
  adamw_update(AdamwState{p.data(), m.data(), v.data(), mirror.data()}, g.data(), AdamwHyper{}, 0, n);
  for (int64_t i : {0, 17, 33}) {
    const auto u = static_cast<size_t>(i);
    EXPECT_TRUE(std::isnan(p[u])) << i;
    EXPECT_EQ(mirror[u] & 0x7fc0u, 0x7fc0u) << "mirror must be a quiet NaN at " << i;
  }
  EXPECT_TRUE(std::isfinite(p[1]));
  EXPECT_EQ(mirror[1], float_to_bf16(p[1]));
}

INSTANTIATE_TEST_SUITE_P(Levels, AdamwClosedFormTest, ::testing::ValuesIn(simd_cases()), level_name);

TEST(AdamwHyper, InvalidValuesThrowInputErrorNamingTheField) {
  auto bad = [](auto mutate) {
    AdamwHyper h;
    mutate(h);
    return h;
  };
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.lr = -1.0; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.beta1 = 1.0; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.beta2 = -0.1; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.eps = std::nan(""); })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.weight_decay = -0.01; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.step = 0; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.grad_scale = INFINITY; })), InputError);
  EXPECT_THROW(validate(bad([](AdamwHyper& h) { h.clip_coef = -1.0; })), InputError);
  EXPECT_NO_THROW(validate(AdamwHyper{}));
  try {
    validate(bad([](AdamwHyper& h) { h.beta1 = 1.5; }));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("beta1"), std::string::npos) << e.what();
  }
  // The kernels validate too, before touching any buffer.
  float x = 1.0f;
  EXPECT_THROW(
      adamw_update(AdamwState{&x, &x, &x, nullptr}, &x, bad([](AdamwHyper& h) { h.step = 0; }), 0, 1),
      InputError);
  EXPECT_EQ(x, 1.0f);
}

TEST(AdamwHyper, ClipCoefFollowsTorchClipGradNorm) {
  EXPECT_EQ(adamw_clip_coef(0.25, 1.0), 1.0);                        // norm 0.5 < 1: no clipping
  EXPECT_DOUBLE_EQ(adamw_clip_coef(16.0, 1.0), 1.0 / (4.0 + 1e-6));  // norm 4: scale to 1
  EXPECT_EQ(adamw_clip_coef(0.0, 1.0), 1.0);
  EXPECT_THROW(adamw_clip_coef(std::nan(""), 1.0), NumericError);
  EXPECT_THROW(adamw_clip_coef(INFINITY, 1.0), NumericError);
  EXPECT_THROW(adamw_clip_coef(1.0, 0.0), InputError);
}

// Updating with or without the mirror gives the same fp32 state; without it, it is not written.
TEST(AdamwMirror, NullMirrorSkipsOnlyTheMirror) {
  const int64_t n = 100;
  std::vector<float> p1 = random_floats(n, 5, -1, 1), p2 = p1, m1(static_cast<size_t>(n), 0.1f), m2 = m1,
                     v1(static_cast<size_t>(n), 0.01f), v2 = v1;
  const std::vector<float> g = random_floats(n, 6, -1, 1);
  std::vector<bf16_bits> mirror(static_cast<size_t>(n), 0x1234);
  adamw_update(AdamwState{p1.data(), m1.data(), v1.data(), mirror.data()}, g.data(), AdamwHyper{}, 0, n);
  adamw_update(AdamwState{p2.data(), m2.data(), v2.data(), nullptr}, g.data(), AdamwHyper{}, 0, n);
  EXPECT_TRUE(same_bits(p1.data(), p2.data(), n));
  EXPECT_TRUE(same_bits(m1.data(), m2.data(), n));
  EXPECT_TRUE(same_bits(v1.data(), v2.data(), n));
}

}  // namespace
}  // namespace slidedp::kernels::testing
