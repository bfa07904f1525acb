// The profiler's fits recover known parameters from synthetic samples (exact data and data with a
// deterministic +-2% wobble), respect non-negativity where unconstrained least squares would not,
// and report residuals relative to the samples. Also the median/spread summary and the repeat loop.
#include "profiler/fit.h"

#include <gtest/gtest.h>

#include <cmath>

#include "profiler/stats.h"

namespace slidedp::profiler {
namespace {

// Relative tolerance of an exact fit: the solve is QR in double on unit-norm columns (~1e-15 per
// operation); 1e-9 leaves room for conditioning over 4 decades of sizes.
constexpr double kExactRtol = 1e-9;
// A +-2% wobble on every sample moves a two-parameter fit by at most a few percent.
constexpr double kNoisyRtol = 0.05;

double wobble(int i) { return 1.0 + (i % 2 ? 0.02 : -0.02); }

std::vector<XY> link_samples(double latency_s, double gbps, bool noisy) {
  std::vector<XY> s;
  int i = 0;
  for (double bytes = 65536; bytes <= 268435456; bytes *= 4, ++i)
    s.push_back({bytes, (latency_s + bytes / (gbps * 1e9)) * (noisy ? wobble(i) : 1.0)});
  return s;
}

TEST(Fit, LatencyBandwidthRecoversExactParameters) {
  const std::vector<XY> s = link_samples(7e-6, 12.5, false);
  LatencyBandwidth f = fit_latency_bandwidth(s);
  EXPECT_NEAR(f.latency_s, 7e-6, 7e-6 * kExactRtol);
  EXPECT_NEAR(f.gbps, 12.5, 12.5 * kExactRtol);
  EXPECT_EQ(f.quality.n, static_cast<int>(s.size()));
  EXPECT_LT(f.quality.max_rel_residual, kExactRtol);
}

TEST(Fit, LatencyBandwidthWithNoiseStaysCloseAndReportsTheResidual) {
  const std::vector<XY> s = link_samples(20e-6, 25.0, true);
  LatencyBandwidth f = fit_latency_bandwidth(s);
  EXPECT_NEAR(f.latency_s, 20e-6, 20e-6 * kNoisyRtol);
  EXPECT_NEAR(f.gbps, 25.0, 25.0 * kNoisyRtol);
  // The wobble is +-2%: residuals are of that size, not zero and not more.
  EXPECT_GT(f.quality.rms_rel_residual, 0.005);
  EXPECT_LT(f.quality.max_rel_residual, 0.05);
}

TEST(Fit, NegativeUnconstrainedLatencyIsClampedToZero) {
  // Small copies faster per byte than big ones (a cache): unconstrained least squares would give a
  // negative latency; the non-negative fit puts it at 0 and keeps the bandwidth positive.
  std::vector<XY> s;
  for (double bytes = 65536; bytes <= 16777216; bytes *= 4)
    s.push_back({bytes, bytes / 10e9 * (bytes < 1e6 ? 0.7 : 1.0)});
  LatencyBandwidth f = fit_latency_bandwidth(s);
  EXPECT_EQ(f.latency_s, 0.0);
  EXPECT_GT(f.gbps, 9.0);
  EXPECT_LT(f.gbps, 15.0);
}

TEST(Fit, SizeIndependentTimesFallBackToTheLargestSizesRate) {
  // Noise made the bigger copy no slower: the slope is 0, so the bandwidth is that of the largest
  // size and the fit says it did not resolve the size dependence.
  const std::vector<XY> s = {{65536, 2e-5}, {262144, 1.9e-5}};
  LatencyBandwidth f = fit_latency_bandwidth(s);
  EXPECT_FALSE(f.resolved);
  EXPECT_NEAR(f.gbps, 262144 / 1.9e-5 / 1e9, 1e-9);
  EXPECT_TRUE(fit_latency_bandwidth(link_samples(5e-6, 10, false)).resolved);
}

TEST(Fit, NonNegativeMatchesUnconstrainedWhenThatIsFeasible) {
  // y = 2 + 3 x1 + 0.5 x2 exactly: every coefficient positive, so NNLS = least squares.
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (int i = 1; i <= 6; ++i)
    for (int j = 1; j <= 3; ++j) {
      X.push_back({1.0, static_cast<double>(i), static_cast<double>(i * j * j)});
      y.push_back(2 + 3.0 * i + 0.5 * i * j * j);
    }
  LinearFit f = fit_nonnegative(X, y);
  ASSERT_EQ(f.coef.size(), 3u);
  EXPECT_NEAR(f.coef[0], 2.0, 2.0 * kExactRtol);
  EXPECT_NEAR(f.coef[1], 3.0, 3.0 * kExactRtol);
  EXPECT_NEAR(f.coef[2], 0.5, 0.5 * kExactRtol);
  ASSERT_EQ(f.rel_residual.size(), y.size());
  for (double r : f.rel_residual) EXPECT_LT(std::abs(r), kExactRtol);
}

TEST(Fit, UnitTimeWithTwoSequenceLengthsRecoversTheContextTerm) {
  const TimeFit truth{1.5e-3, 2e-6, 3e-9};
  std::vector<UnitSample> s;
  for (double T : {64.0, 128.0})
    for (double B : {1.0, 2.0, 4.0, 8.0}) s.push_back({B * T, T, truth.eval(B * T, T)});
  UnitFit f = fit_unit_time(s);
  EXPECT_TRUE(f.ctx_term);
  EXPECT_NEAR(f.fit.fixed_s, truth.fixed_s, truth.fixed_s * 1e-6);
  EXPECT_NEAR(f.fit.per_token_s, truth.per_token_s, truth.per_token_s * 1e-6);
  EXPECT_NEAR(f.fit.per_token_ctx_s, truth.per_token_ctx_s, truth.per_token_ctx_s * 1e-6);
  EXPECT_EQ(f.quality.n, 8);
}

TEST(Fit, UnitTimeWithOneSequenceLengthFoldsTheContextTermIntoPerToken) {
  const TimeFit truth{1e-3, 2e-6, 3e-9};
  const double T = 128;
  std::vector<UnitSample> s;
  int i = 0;
  for (double B : {1.0, 2.0, 4.0, 8.0}) s.push_back({B * T, T, truth.eval(B * T, T) * wobble(i++)});
  UnitFit f = fit_unit_time(s);
  EXPECT_FALSE(f.ctx_term);
  EXPECT_EQ(f.fit.per_token_ctx_s, 0.0);
  // At this T the fit predicts the truth within the wobble.
  for (double B : {1.0, 3.0, 8.0}) {
    const double want = truth.eval(B * T, T);
    EXPECT_NEAR(f.fit.eval(B * T, T), want, want * kNoisyRtol);
  }
  EXPECT_NEAR(f.fit.per_token_s, truth.per_token_s + truth.per_token_ctx_s * T,
              (truth.per_token_s + truth.per_token_ctx_s * T) * kNoisyRtol);
}

TEST(Stats, SummaryIsMedianMinMaxAndRelativeSpread) {
  Spread s = summarize({3.0, 1.0, 2.0});
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.median, 2.0);
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.max, 3.0);
  EXPECT_DOUBLE_EQ(s.relative(), 1.0);
  EXPECT_EQ(summarize({4.0, 1.0, 3.0, 2.0}).median, 2.5);
  EXPECT_EQ(summarize({5.0}).relative(), 0.0);
}

TEST(Stats, RepeatPicksInnerIterationsFromTheWarmUp) {
  // A fake operation of exactly 1 ms (the body reports its own time): with min_rep_s 20 ms each
  // repetition runs it 20 times, and the result is per operation.
  RepeatPolicy p;
  p.reps = 4;
  p.min_rep_s = 0.02;
  std::vector<int> calls;
  std::vector<double> v = repeat_timed(p, [&](int inner) {
    calls.push_back(inner);
    return inner * 1e-3;
  });
  ASSERT_EQ(v.size(), 4u);
  for (double x : v) EXPECT_DOUBLE_EQ(x, 1e-3);
  ASSERT_EQ(calls.size(), 5u);  // warm-up + 4
  EXPECT_EQ(calls[0], 1);
  for (std::size_t i = 1; i < calls.size(); ++i) EXPECT_EQ(calls[i], 20);
  // The multi form: two things, the slower one decides inner.
  std::vector<std::vector<double>> m = repeat_timed_multi(p, [](int inner) {
    return std::vector<double>{inner * 1e-3, inner * 4e-3};
  });
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(m[0].size(), 4u);
  EXPECT_DOUBLE_EQ(m[1][0], 4e-3);
  EXPECT_EQ(inner_for(p, 4e-3), 5);
}

}  // namespace
}  // namespace slidedp::profiler
