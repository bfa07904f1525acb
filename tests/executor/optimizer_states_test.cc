// bf16 AdamW moments (Plan::optimizer_states, --optimizer-states bf16) in training runs:
//  * the rounding noise is a function of the unit element, the AdamW step and the unit, never of how
//    the work is cut: every parameter and gradient route and activation policy gives the same bits,
//    and a run resumed from its checkpoint continues bit for bit (the checkpoint holds the moments
//    widened to fp32, exactly, and records "bf16");
//  * against fp32 moments (the reference), the run trains the same within a bound: over 30 steps of
//    the tiny model the mean loss of the last 10 steps differs by less than 5% of what the fp32 run's
//    loss fell over the run (bf16 m and v are within one bf16 step, 2^-8 relative, of their fp32
//    values, unbiased; a run that did not train, or trained with moments off by more, fails);
//  * host state is 4 bytes per parameter smaller; a checkpoint moves between the formats (widened or
//    rounded on load); lossy states are refused with --exact and for a baseline.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"
#include "executor/trainer.h"
#include "io/checkpoint.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

namespace fs = std::filesystem;
using testing::tiny_options;

TrainOptions bf16_states(TrainOptions o) {
  o.plan.optimizer_states = OptimizerStates::kBf16;
  return o;
}

TEST(OptimizerStates, Bf16MomentsGiveTheSameBitsOnEveryRouteAndPolicy) {
  TrainOptions o = bf16_states(tiny_options(2, 1, 2, 3));
  o.plan.recompute_layers = Plan::kRest;
  testing::expect_every_route_and_policy_bitwise(
      o, {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep});
}

TEST(OptimizerStates, Bf16MomentsResumeBitwise) {
  testing::expect_resume_is_bitwise(bf16_states(tiny_options(2, 1, 1, 6)), "bf16_states");
}

TEST(OptimizerStates, Bf16MomentsTrainAsFp32MomentsDo) {
  TrainOptions o = tiny_options(2, 2, 1, 30);
  o.lr.lr = 3e-3;
  const TrainResult fp32 = train(o), bf16 = train(bf16_states(o));
  const double fell = fp32.steps.front().loss - testing::mean_loss(fp32, 20, 30);
  ASSERT_GT(fell, 0.5) << "the reference run must train for the comparison to mean anything";
  const double gap = std::fabs(testing::mean_loss(bf16, 20, 30) - testing::mean_loss(fp32, 20, 30));
  EXPECT_LT(gap, 0.05 * fell) << "fp32 " << testing::mean_loss(fp32, 20, 30) << ", bf16 "
                              << testing::mean_loss(bf16, 20, 30);
  EXPECT_FALSE(testing::bitwise_equal(fp32, bf16)) << "the bf16 run must not be the fp32 run";
}

TEST(OptimizerStates, Bf16MomentsTakeFourBytesPerParameterLess) {
  TrainOptions o = tiny_options(1, 1, 1, 1);
  o.card = testing::tiny_card(true);
  const TrainResult fp32 = train(o), bf16 = train(bf16_states(o));
  const auto P = static_cast<int64_t>(make_model_layout(o.card).total_flat_numel);
  EXPECT_EQ(fp32.host_state_bytes - bf16.host_state_bytes, 4 * P);
}

// A bf16 run's checkpoint says so; it resumes with fp32 moments (widened, exactly) and an fp32 run's
// resumes with bf16 ones (rounded to nearest): both run on.
TEST(OptimizerStates, CheckpointsRecordTheFormatAndConvertOnResume) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_states_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions first = bf16_states(tiny_options(2, 1, 1, 2));
  first.checkpoint_dir = (root / "bf16").string();
  first.checkpoint_every = 2;
  train(first);
  const std::string dir = resolve_checkpoint_dir(first.checkpoint_dir);
  EXPECT_NE(read_text_file(dir + "/trainer_state.json").find("\"optimizer_states\": \"bf16\""),
            std::string::npos);
  TrainOptions widened = tiny_options(2, 1, 1, 2);
  widened.resume_dir = first.checkpoint_dir;
  EXPECT_EQ(train(widened).steps.size(), 2u);
  TrainOptions fp32_first = tiny_options(2, 1, 1, 2);
  fp32_first.checkpoint_dir = (root / "fp32").string();
  fp32_first.checkpoint_every = 2;
  train(fp32_first);
  EXPECT_EQ(read_text_file(resolve_checkpoint_dir(fp32_first.checkpoint_dir) + "/trainer_state.json")
                .find("optimizer_states"),
            std::string::npos);
  TrainOptions rounded = bf16_states(tiny_options(2, 1, 1, 2));
  rounded.resume_dir = fp32_first.checkpoint_dir;
  EXPECT_EQ(train(rounded).steps.size(), 2u);
  fs::remove_all(root);
}

TEST(OptimizerStates, LossyStatesAreRefusedWithExactAndForABaseline) {
  TrainOptions exact = bf16_states(tiny_options(1, 1, 1, 1));
  exact.exact_fp32 = true;
  EXPECT_THROW(train(exact), InputError);
  TrainOptions baseline = bf16_states(tiny_options(1, 1, 1, 1));
  baseline.system = System::kZeroOffload;
  EXPECT_THROW(train(baseline), InputError);
}

}  // namespace
}  // namespace slidedp::exec
