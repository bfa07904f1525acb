// Failure handling: an exception in one rank's backward or a NaN gradient ends or skips as specified,
// with the original message and without hanging (ctest runs these under a timeout).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "executor/trainer.h"
#include "io/checkpoint.h"
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

// Every system checks a gradient before applying it. FSDP2 updates on the devices, where a NaN
// gradient of the last step was applied and saved with exit 0 (and, in longer runs, blamed on the next
// step's loss): it stops at its own step, for each of the step's ranks, and the run saves nothing.
TEST(Faults, NanGradientStopsEverySystemAtItsStep) {
  for (System system : {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload, System::kMegaTrain,
                        System::kFsdp2}) {
    for (int rank : {0, 1}) {
      SCOPED_TRACE(std::string(system_name(system)) + " rank " + std::to_string(rank));
      const std::filesystem::path saved =
          std::filesystem::temp_directory_path() / ("slidedp_nan_saved_" + std::to_string(::getpid()));
      std::filesystem::remove_all(saved);
      TrainOptions o = tiny_options(2, 1, 1, 3);
      o.system = system;
      o.inject_rank = rank;
      o.inject_nan_step = 2;  // the last step
      o.inject_nan_unit = 2;
      o.save_model_dir = saved.string();
      try {
        train(o);
        ADD_FAILURE() << "expected a NumericError";
      } catch (const NumericError& e) {
        EXPECT_NE(std::string(e.what()).find("step 3"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("non-finite gradient"), std::string::npos) << e.what();
      }
      EXPECT_FALSE(std::filesystem::exists(saved));
    }
  }
}

// With --on-nonfinite skip the step with the NaN leaves every weight untouched: weights after the
// skipped step equal the weights before it (run 1 step vs run 2 steps with the second poisoned). That
// the steps after it also update as if the step had never been is checked below.
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

// A skipped step applies no AdamW update, so -- as torch's optimizer, whose step() is simply not called
// -- it must not advance the bias-correction count: the update after it is AdamW's 2nd, not its 3rd.
// Step 1 updates, step 2 is poisoned and skipped, step 3 updates; from the checkpoint after step 3
// (m3, v3 and the weights) and the weights after step 1 (p1 = p2) the 3rd step's change is, in closed
// form with t = 2 and no weight decay:  p3 - p1 = -lr / (1 - b1^t) * m3 / (sqrt(v3 / (1 - b2^t)) + eps).
// Tolerance: the kernel evaluates this in fp32 (a handful of roundings of the update, < 1e-5 relative
// to it) and rounds p3 once (half an ulp of |p|, we allow 4 ulps). Counting the skipped step (t = 3)
// changes the update by (1 - b1^2) / (1 - b1^3) * sqrt((1 - b2^3) / (1 - b2^2)) = 0.86, i.e. by 14%.
TEST(Faults, ASkippedStepDoesNotAdvanceAdamwBiasCorrection) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("slidedp_skipcount_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions one = tiny_options(2, 1, 1, 1);
  one.exact_fp32 = true;
  one.optimizer.weight_decay = 0;
  one.optimizer.on_nonfinite = NonFinitePolicy::kSkip;
  one.lr.lr = 1e-2;
  TrainOptions three = one;
  three.steps = 3;
  three.inject_rank = 0;
  three.inject_nan_step = 1;
  three.inject_nan_unit = 2;
  three.checkpoint_dir = root.string();
  const TrainResult p1 = train(one), p3 = train(three);
  ASSERT_TRUE(p3.steps[1].skipped);
  const LoadedCheckpoint ck = load_checkpoint(p3.last_checkpoint);
  EXPECT_EQ(ck.state.optimizer_step, 3);
  EXPECT_EQ(ck.state.adamw_step, 2);
  const double lr = one.lr.lr, b1 = one.optimizer.beta1, b2 = one.optimizer.beta2, eps = one.optimizer.eps;
  const double t = 2;
  int64_t checked = 0;
  for (size_t u = 0; u < p1.master.size(); ++u)
    for (size_t i = 0; i < p1.master[u].size(); ++i) {
      const double m = ck.adam_m[u][i], v = ck.adam_v[u][i];
      if (v == 0) continue;  // padding and rows no batch touched
      const double expect = -lr / (1 - std::pow(b1, t)) * m / (std::sqrt(v / (1 - std::pow(b2, t))) + eps);
      const double got = static_cast<double>(p3.master[u][i]) - p1.master[u][i];
      const double ulp = std::ldexp(std::fabs(static_cast<double>(p1.master[u][i])), -23);
      ASSERT_NEAR(got, expect, 1e-5 * std::fabs(expect) + 4 * ulp) << "unit " << u << " element " << i;
      ++checked;
    }
  EXPECT_GT(checked, 1000);
  fs::remove_all(root);
}

// Resuming after a skipped step continues the same count (the checkpoint records adamw_step): 4 steps
// with the 2nd skipped equal 2 steps + resume + 2 steps bitwise.
TEST(Faults, ResumeAfterASkippedStepKeepsTheUpdateCount) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("slidedp_skipresume_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions base = tiny_options(2, 1, 1, 4);
  base.optimizer.on_nonfinite = NonFinitePolicy::kSkip;
  base.inject_rank = 1;
  base.inject_nan_step = 1;
  base.inject_nan_unit = 3;
  const TrainResult straight = train(base);
  TrainOptions first = base;
  first.steps = 2;
  first.checkpoint_dir = root.string();
  train(first);
  TrainOptions second = base;
  second.steps = 2;
  second.inject_rank = -1;
  second.resume_dir = root.string();
  const TrainResult resumed = train(second);
  EXPECT_TRUE(testing::bitwise_equal(resumed, straight));
  fs::remove_all(root);
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

// A loss mask of zeros has no target: the run would log loss 0 and apply no gradient. Refused up front
// naming the data set and the mask; one counted target is enough to train.
TEST(Faults, AMaskWithoutATargetIsRefused) {
  std::vector<uint32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7) % 256);
  TrainOptions o = testing::tiny_options(1, 1, 1, 1);
  o.dataset = TokenDataset::from_tokens("all-masked", tokens, std::vector<uint8_t>(tokens.size(), 0), 256);
  try {
    train(o);
    FAIL() << "trained on no target";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("all-masked: loss mask"), std::string::npos) << e.what();
  }
  std::vector<uint8_t> one(tokens.size(), 0);
  one[17] = 1;
  o.dataset = TokenDataset::from_tokens("one-target", tokens, one, 256);
  EXPECT_EQ(train(o).steps.size(), 1u);
}

}  // namespace
}  // namespace slidedp::exec
