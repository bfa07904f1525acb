// Checkpoints and resume (issue 6): 10 steps straight and 5 steps + resume + 5 steps give bitwise
// identical losses and weights, for 1 and 2 ranks, with a cosine schedule and gradient accumulation.
#include <gtest/gtest.h>

#include <filesystem>

#include "executor/trainer.h"
#include "io/checkpoint.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

namespace fs = std::filesystem;

TEST(Resume, TenStepsEqualFivePlusResumePlusFive) {
  for (int ranks : {1, 2}) {
    const fs::path root = fs::temp_directory_path() / ("slidedp_resume_" + std::to_string(ranks) + "_" + std::to_string(::getpid()));
    fs::remove_all(root);
    TrainOptions base = testing::tiny_options(ranks, 1, 2, 10);
    base.lr.kind = LrScheduleKind::kCosine;
    base.lr.warmup_steps = 2;
    base.lr.total_steps = 10;
    base.lr.min_lr = 1e-4;
    TrainResult straight = train(base);

    TrainOptions first = base;
    first.steps = 5;
    first.checkpoint_dir = (root / "ckpt").string();
    first.checkpoint_every = 5;
    TrainResult a = train(first);
    ASSERT_FALSE(a.last_checkpoint.empty());
    EXPECT_TRUE(fs::exists(fs::path(a.last_checkpoint) / "model.safetensors"));

    TrainOptions second = base;
    second.steps = 5;
    second.resume_dir = (root / "ckpt").string();
    TrainResult b = train(second);
    EXPECT_EQ(b.start_step, 5);
    ASSERT_EQ(b.steps.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(a.steps[static_cast<size_t>(i)].loss, straight.steps[static_cast<size_t>(i)].loss);
      EXPECT_EQ(b.steps[static_cast<size_t>(i)].loss, straight.steps[static_cast<size_t>(5 + i)].loss) << ranks << " ranks, step " << 6 + i;
      EXPECT_EQ(b.steps[static_cast<size_t>(i)].step, 6 + i);
      EXPECT_EQ(b.steps[static_cast<size_t>(i)].lr, straight.steps[static_cast<size_t>(5 + i)].lr);
    }
    EXPECT_TRUE(testing::bitwise_equal(b, straight)) << ranks << " ranks";
    fs::remove_all(root);
  }
}

TEST(Resume, KeepsOnlyTheLastCheckpoints) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_keep_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions o = testing::tiny_options(1, 1, 1, 6);
  o.checkpoint_dir = root.string();
  o.checkpoint_every = 1;
  o.keep_checkpoints = 2;
  train(o);
  auto list = list_checkpoints(root.string());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].first, 5);
  EXPECT_EQ(list[1].first, 6);
  fs::remove_all(root);
}

}  // namespace
}  // namespace slidedp::exec
