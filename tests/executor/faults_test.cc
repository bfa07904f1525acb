// Failure handling: an exception in one rank's backward or a NaN gradient ends or skips as specified,
// with the original message and without hanging (ctest runs these under a timeout).
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

using testing::tiny_options;

TEST(Faults, ExceptionInOneRanksBackwardStopsEveryRankWithTheOriginalError) {
  for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
    TrainOptions o = tiny_options(3, 1, 2, 4);
    o.plan.grad_route = gr;
    o.inject_rank = 1;
    o.inject_throw_step = 1;  // the second step
    o.inject_throw_unit = 2;
    try {
      train(o);
      FAIL() << "expected the injected error";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("injected fault: rank 1"), std::string::npos) << e.what();
    }
  }
}

TEST(Faults, NanGradientAbortsByDefault) {
  TrainOptions o = tiny_options(2, 1, 1, 3);
  o.inject_rank = 0;
  o.inject_nan_step = 1;
  o.inject_nan_unit = 2;
  try {
    train(o);
    FAIL() << "expected a NumericError";
  } catch (const NumericError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("non-finite gradient"), std::string::npos) << e.what();
  }
}

// With --on-nonfinite skip the step with the NaN leaves every weight untouched: the run equals one
// that simply has no such step... which we check directly: weights after the skipped step equal the
// weights before it (run 1 step vs run 2 steps with the second poisoned).
TEST(Faults, NanGradientSkipsTheStepAndLeavesTheStateUntouched) {
  for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
    TrainOptions one = tiny_options(2, 1, 1, 1);
    one.plan.grad_route = gr;
    one.optimizer.on_nonfinite = NonFinitePolicy::kSkip;
    TrainOptions two = one;
    two.steps = 2;
    two.inject_rank = 1;
    two.inject_nan_step = 1;
    two.inject_nan_unit = 3;
    TrainResult a = train(one), b = train(two);
    ASSERT_EQ(b.steps.size(), 2u);
    EXPECT_FALSE(b.steps[0].skipped);
    EXPECT_TRUE(b.steps[1].skipped);
    EXPECT_EQ(b.steps[1].skipped_reason, "non-finite gradient");
    EXPECT_TRUE(testing::bitwise_equal(a, b));
  }
}

// Clipping (verify mode): with a bound above the gradient norm, the result is bitwise that of the
// overlapped mode (the two-pass update computes the same fp32 values); with a bound at a quarter of
// the norm, the first update is scaled by c = max_norm / (norm + 1e-6). With eps = 1e5 >> |g| and no
// weight decay, Adam's first update is lr * g / eps, linear in g, so every weight's change scales by
// c exactly, up to fp32 rounding: each stored weight is rounded once per update (half an ulp of |w|),
// so the two changes differ from c times each other by at most about 2 ulps of |w|; we allow 3 ulps
// plus 1e-4 relative for Adam's residual nonlinearity |g| / eps (gradients here are below 1, so < 1e-5).
TEST(Faults, GradientClippingScalesTheUpdateByTheClosedFormCoefficient) {
  TrainOptions plain = tiny_options(2, 1, 1, 1);
  plain.optimizer.eps = 1e5;
  plain.optimizer.weight_decay = 0;
  plain.lr.lr = 1.0;
  plain.exact_fp32 = true;
  TrainOptions loose = plain;
  loose.optimizer.clip_grad_norm = 1e9;
  TrainResult a = train(plain), b = train(loose);
  EXPECT_TRUE(testing::bitwise_equal(a, b));
  ASSERT_GT(b.steps[0].grad_norm, 0.0);
  const double norm = b.steps[0].grad_norm;
  TrainOptions tight = plain;
  tight.optimizer.clip_grad_norm = norm / 4;
  TrainResult c = train(tight);
  TrainOptions none = plain;
  none.steps = 0;
  TrainResult w0 = train(none);  // the initial weights
  const double coef = (norm / 4) / (norm + 1e-6);
  int64_t checked = 0;
  for (size_t u = 0; u < w0.master.size(); ++u)
    for (size_t i = 0; i < w0.master[u].size(); ++i) {
      const double full = a.master[u][i] - w0.master[u][i], clipped = c.master[u][i] - w0.master[u][i];
      if (std::fabs(full) < 1e-9) continue;  // rows the batch does not touch
      const double ulp = std::ldexp(std::fabs(static_cast<double>(w0.master[u][i])), -23);
      EXPECT_NEAR(clipped, coef * full, 1e-4 * std::fabs(coef * full) + 3 * ulp + 1e-12) << "unit " << u << " element " << i;
      ++checked;
    }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace slidedp::exec
