// Clipping (and skipping non-finite steps) with the gradient norm summed as the chunks are reduced
// (executor/grad_norm_blocks.h) against the same run with the norm summed by a pass over every
// accumulator after the backward (TrainOptions::norm_pass_after_backward, the schedule before the
// fused sum): every step's loss and gradient norm and the weights, bit for bit, for every family,
// both gradient routes (the gpu route's shards cut the blocks elsewhere), both parameter routes,
// accumulation 1 and 2, the tied head's second contribution, and chunks that do not divide the sum's
// 32,768-element blocks (so blocks complete across chunks and shards). The fused sum is independent
// of the pass: it is assembled from per-block sums in an order the jobs do not set. (Summing a block
// over only the part its last job wrote fails here; reversing the block order changes no bit at
// these sizes: a norm's last bits rarely reach an fp32 clip coefficient.)
// And on a paced run, the clipped step's update overlaps the next step's forward: deliveries of step
// s+1 start while step s's update is still running (each unit is released as it is updated).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

using testing::tiny_options;

// Units of several sum-of-squares blocks: a decoder layer of ~86K elements (3 blocks), a 16K-element
// embedding; chunks of 10,000 (3.3 per block).
ModelCard blocks_card(bool tied, const std::string& type) {
  std::string y = "name: blocks\nmodel_type: " + type +
                  "\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                  "head_dim: 16\nintermediate_size: 384\nvocab_size: 256\nrope_theta: 10000\n";
  y += tied ? "tie_word_embeddings: true\n" : "tie_word_embeddings: false\n";
  return model_card_from_yaml(y, "blocks");
}

ModelCard wide(ModelCard c) {
  c.intermediate_size = 384;
  c.validate("wide");
  return c;
}

struct Family {
  const char* name;
  ModelCard card;
};

void expect_same_clipped_run(const TrainOptions& base) {
  TrainOptions fused = base, pass = base;
  pass.norm_pass_after_backward = true;
  const TrainResult a = train(fused), b = train(pass);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i;
    EXPECT_GT(a.steps[i].grad_norm, 0) << "step " << i << ": the norm was measured";
  }
  EXPECT_TRUE(testing::bitwise_equal(a, b)) << "weights";
}

TEST(ClipSchedule, FusedNormEqualsTheNormPassForEveryFamilyRouteAndAccumulation) {
  const std::vector<Family> families = {{"llama tied", blocks_card(true, "llama")},
                                        {"qwen3", blocks_card(false, "qwen3")},
                                        {"gemma4 moe", testing::tiny_gemma4_moe_card()},
                                        {"qwen3.6", wide(testing::tiny_qwen3_5_card())}};
  int runs = 0;
  for (const Family& f : families)
    for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu})
      for (int accum : {1, 2}) {
        TrainOptions o = tiny_options(2, 1, accum, 3);
        o.card = f.card;
        o.plan.chunk_numel = 10000;
        o.plan.grad_route = gr;
        o.plan.param_route = accum == 2 ? ParamRoute::kSharded : ParamRoute::kReplicated;
        o.optimizer.clip_grad_norm = 0.05;  // clips every step of these runs (the norms are ~1)
        SCOPED_TRACE(fmt::format("{} {} route, accumulation {}", f.name,
                                 gr == GradRoute::kGpu ? "gpu" : "cpu", accum));
        expect_same_clipped_run(o);
        ++runs;
      }
  EXPECT_EQ(runs, 16);
}

TEST(ClipSchedule, FusedNormEqualsTheNormPassWhenSkippingAndForMegaTrain) {
  TrainOptions o = tiny_options(2, 1, 2, 3);
  o.card = blocks_card(true, "llama");
  o.plan.chunk_numel = 10000;
  o.optimizer.on_nonfinite = NonFinitePolicy::kSkip;  // verify mode without clipping
  expect_same_clipped_run(o);
  // MegaTrain adds each rank's gradient on its own (4 contributions per element here).
  o.system = System::kMegaTrain;
  o.optimizer.clip_grad_norm = 0.05;
  expect_same_clipped_run(o);
}

struct Span {
  double start, end;
};

TEST(ClipSchedule, TheClippedUpdateOverlapsTheNextStepsForward) {
  TrainOptions o = tiny_options(2, 2, 1, 3);
  o.card = testing::tiny16_card();
  o.plan.chunk_numel = 4096;
  o.plan.update_threads = 1;
  o.update_threads = 1;
  // A slow CPU update (the update-bound target of overlap_test.cc): the update after the backward
  // takes about as long as a step's compute, so a next step that waited for all of it would show.
  o.emulate = testing::paced_target(10.0, 1.5e7);
  o.time_scale = testing::paced_test_time_scale();
  o.trace = true;
  o.optimizer.clip_grad_norm = 1e30;  // measured, never clipping: the overlap is what is tested
  const TrainResult r = train(o);
  const int s = 1;  // the second step's update against the third step's forward
  std::vector<Span> update, next_fwd;
  for (const MeasuredSpan& x : r.spans) {
    const std::string category = x.tag.category, what = x.tag.what;
    if (category == "cpu_update" && what == "verify+adamw" && x.tag.step == s)
      update.push_back({x.start_s, x.end_s});
    if (category == "compute" && what == "fwd" && x.tag.step == s + 1 && x.rank == 0)
      next_fwd.push_back({x.start_s, x.end_s});
  }
  ASSERT_EQ(update.size(), 1u) << "one update pass per step";
  ASSERT_GE(next_fwd.size(), 2u);
  std::sort(next_fwd.begin(), next_fwd.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  // The next step's forward of its first units ran before this step's update finished: it did not
  // wait for the whole update.
  EXPECT_LT(next_fwd[1].end, update.front().end)
      << "step 3's second forward unit ended at " << next_fwd[1].end << " s, step 2's update at "
      << update.front().end;
}

}  // namespace
}  // namespace slidedp::exec
