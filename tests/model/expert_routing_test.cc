// Expert hit rates (model/expert_routing.h) against closed forms and direct sampling, and the
// expert-aware delivery what-if in the step work: bytes fall by exactly the unrouted experts.
#include "model/expert_routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "card/model_card.h"
#include "model/hardware.h"
#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp {
namespace {

// Tolerance: a trial's hit fraction is the mean of E expert indicators whose covariances are
// negative (a token's k choices exclude each other), so its variance is at most 1/(4E); the mean of
// 400 trials at E = 128 has a standard deviation below 0.0023, and 0.012 is over five of them.
constexpr double kSampleTol = 0.012;

TEST(ExpertRouting, UniformRouterMatchesTheClosedForm) {
  const RouterModel r{128, 8, 0.0};
  const std::vector<double> pi = expert_selection_probabilities(r, 1, 1);
  for (double p : pi) EXPECT_DOUBLE_EQ(p, 8.0 / 128.0);
  for (int64_t tokens : {1, 4, 16, 64, 256}) {
    const double closed = 1.0 - std::pow(1.0 - 8.0 / 128.0, static_cast<double>(tokens));
    EXPECT_NEAR(expected_hit_fraction(pi, static_cast<double>(tokens)), closed, 1e-12);  // a mean of 128 equal terms
    EXPECT_NEAR(sampled_hit_fraction(r, tokens, 400, 7 + tokens), closed, kSampleTol) << tokens;
  }
  // One token hits exactly k experts.
  EXPECT_DOUBLE_EQ(sampled_hit_fraction(r, 1, 10, 3), 8.0 / 128.0);
}

TEST(ExpertRouting, SkewedRouterMarginalsPredictTheSampledHits) {
  const RouterModel r{128, 8, 1.2};
  const std::vector<double> pi = expert_selection_probabilities(r, 200000, 11);
  EXPECT_NEAR(std::accumulate(pi.begin(), pi.end(), 0.0), 8.0, 1e-9);  // k choices per token
  EXPECT_GT(pi.front(), 0.9);   // the most popular expert is nearly always chosen
  EXPECT_LT(pi.back(), 0.01);
  for (int64_t tokens : {4, 32, 256, 2048}) {
    const double predicted = expected_hit_fraction(pi, static_cast<double>(tokens));
    EXPECT_NEAR(sampled_hit_fraction(r, tokens, 400, 100 + tokens), predicted, kSampleTol) << tokens;
    // A skewed router touches fewer experts than a uniform one at the same batch.
    EXPECT_LT(predicted, 1.0 - std::pow(1.0 - 8.0 / 128.0, static_cast<double>(tokens))) << tokens;
  }
}

TEST(ExpertAwareDelivery, MovesOnlyTheRoutedExperts) {
  Workload w = make_workload(model_preset("gemma-4-26b-a4b"), 16);
  const Hardware hw = hardware_preset("h100-sxm-x4");
  Plan p;
  p.ranks = 1;
  p.micro_batch = 2;  // 32 tokens per micro-batch
  const StepWork all = build_step_work(w, hw, p, System::kSlideDP);
  w.expert_aware_delivery = true;
  const StepWork hit = build_step_work(w, hw, p, System::kSlideDP);
  const double miss = std::pow(1.0 - 8.0 / 128.0, 32.0);         // uniform router, closed form
  const double experts_bytes = 128.0 * 3.0 * 704.0 * 2816.0 * 2.0;  // bf16
  for (size_t u = 0; u < all.units.size(); ++u) {
    const double expected = all.units[u].kind == UnitKind::kDecoder ? miss * experts_bytes : 0.0;
    EXPECT_NEAR(all.units[u].deliver_h2d_bytes - hit.units[u].deliver_h2d_bytes, expected, 1e-6 * experts_bytes) << u;
    EXPECT_NEAR(all.units[u].grad_d2h_bytes - hit.units[u].grad_d2h_bytes, expected, 1e-6 * experts_bytes) << u;
    EXPECT_EQ(all.units[u].cpu_last_thread_s, hit.units[u].cpu_last_thread_s) << u;  // every expert updated
  }
  // A dense model is unaffected.
  Workload dense = make_workload(model_preset("gemma-4-31b"), 16);
  const StepWork d0 = build_step_work(dense, hw, p, System::kSlideDP);
  dense.expert_aware_delivery = true;
  const StepWork d1 = build_step_work(dense, hw, p, System::kSlideDP);
  for (size_t u = 0; u < d0.units.size(); ++u) EXPECT_EQ(d0.units[u].deliver_h2d_bytes, d1.units[u].deliver_h2d_bytes);
}

}  // namespace
}  // namespace slidedp
