// Checkpoints and resume (issue 6): 10 steps straight and 5 steps + resume + 5 steps give bitwise
// identical losses and weights, for 1 and 2 ranks, with a cosine schedule and gradient accumulation.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
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

// A checkpoint of another model whose units have the same sizes (heads 4 x 8 vs 2 x 16, another eps)
// loads without complaint if only sizes are compared, then trains with the wrong math. Resume
// compares the whole architecture and names the first difference in the checkpoint's config.json.
TEST(Resume, ACheckpointOfAnotherModelWithTheSameSizesIsRefusedNamingTheField) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_other_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions first = testing::tiny_options(1, 1, 1, 1);
  first.checkpoint_dir = root.string();
  train(first);
  TrainOptions other = first;
  other.checkpoint_dir.clear();
  other.resume_dir = root.string();
  other.card.num_heads = 2;
  other.card.num_kv_heads = 1;
  other.card.head_dim = 16;
  other.card.rms_norm_eps = 1e-5;
  ASSERT_EQ(make_model_layout(other.card).total_flat_numel, make_model_layout(first.card).total_flat_numel);
  try {
    train(other);
    FAIL() << "resumed another model's checkpoint";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("num_attention_heads: 2 vs 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("and 3 more"), std::string::npos) << msg;  // kv heads, head_dim, eps
  }
  TrainOptions same = first;  // the model that wrote it resumes
  same.checkpoint_dir.clear();
  same.resume_dir = root.string();
  EXPECT_EQ(train(same).start_step, 1);
  fs::remove_all(root);
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

// Every step is reported (and so logged by slidedp-run) before its checkpoint is published, so a kill
// between the two can lose a checkpoint, never a checkpointed step's log row: when a step is reported,
// its checkpoint is not on disk yet, and after the run the last reported step has its checkpoint.
TEST(Resume, AStepIsReportedBeforeItsCheckpointIsPublished) {
  const fs::path root = fs::temp_directory_path() / ("slidedp_order_" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions o = testing::tiny_options(1, 1, 1, 4);
  o.checkpoint_dir = root.string();
  o.checkpoint_every = 1;
  std::vector<int64_t> reported;
  train(o, [&](const TrainStep& s) {
    EXPECT_FALSE(fs::exists(root / checkpoint_dir_name(s.step))) << "step " << s.step << " checkpointed before it was reported";
    reported.push_back(s.step);
  });
  EXPECT_EQ(reported, (std::vector<int64_t>{1, 2, 3, 4}));
  const auto saved = list_checkpoints(root.string());
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(saved.back().first, 4);
  fs::remove_all(root);
}

}  // namespace
}  // namespace slidedp::exec
