// A tiny Qwen3.6 (three Gated DeltaNet layers and one gated full-attention layer, zero-centred norms,
// partial RoPE, untied head), dense and with the MoE block (router, packed SwiGLU experts, the gated
// shared expert), trained by the executor on the CPU backend: every route pair and every activation
// policy give bitwise the same weights, N ranks equal one rank with N times the micro-batch or N
// accumulation steps within fp32 summation order, the loss falls on the embedded text, and 6 steps
// straight equal 3 + resume + 3 bitwise.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

using testing::bitwise_equal;
using testing::tiny_options;
using testing::weight_error;

TrainOptions qwen_options(const ModelCard& card, int ranks, int micro_batch, int accum, int64_t steps = 3) {
  TrainOptions o = tiny_options(ranks, micro_batch, accum, steps);
  o.card = card;
  return o;
}

std::vector<ModelCard> qwen_cards() { return {testing::tiny_qwen3_5_card(), testing::tiny_qwen3_5_moe_card()}; }

TEST(Qwen35Training, EveryRouteAndPolicyGivesBitwiseIdenticalWeights) {
  for (const ModelCard& card : qwen_cards()) {
    SCOPED_TRACE(card.name);
    std::vector<TrainResult> results;
    for (ParamRoute pr : {ParamRoute::kReplicated, ParamRoute::kSharded})
      for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
        TrainOptions o = qwen_options(card, 2, 1, 2);
        o.plan.param_route = pr;
        o.plan.grad_route = gr;
        results.push_back(train(o));
      }
    TrainOptions keep = qwen_options(card, 2, 1, 2);
    keep.plan.recompute_layers = 0;
    keep.plan.keep_layers = Plan::kRest;
    results.push_back(train(keep));
    TrainOptions mixed = keep;
    mixed.plan.per_layer = {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep,
                            ActivationPolicy::kRecompute};
    results.push_back(train(mixed));
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(results[0], results[i])) << "variant " << i;
      EXPECT_EQ(results[0].steps.back().loss, results[i].steps.back().loss) << "variant " << i;
    }
  }
}

// As Pipeline.RanksTimesMicroBatchEqualsOneRankAndAccumulation (its comment derives the bounds).
TEST(Qwen35Training, RanksTimesMicroBatchEqualsOneRankAndAccumulation) {
  for (const ModelCard& card : qwen_cards()) {
    SCOPED_TRACE(card.name);
    TrainOptions ranks = qwen_options(card, 3, 1, 1);
    ranks.exact_fp32 = true;
    ranks.optimizer.eps = 1.0;
    ranks.lr.lr = 0.1;
    TrainOptions single = ranks;
    single.plan.ranks = 1;
    single.plan.micro_batch = 3;
    TrainOptions accum = ranks;
    accum.plan.ranks = 1;
    accum.plan.accum_steps = 3;
    TrainResult a = train(ranks), b = train(single), c = train(accum);
    EXPECT_NEAR(a.steps[0].loss, b.steps[0].loss, 1e-6 * std::fabs(b.steps[0].loss));
    EXPECT_LE(weight_error(a, b, 1e-7, 1e-5), 1.0);
    EXPECT_LE(weight_error(a, c, 1e-7, 1e-5), 1.0);
  }
}

TEST(Qwen35Training, TheLossFalls) {
  for (const ModelCard& card : qwen_cards()) {
    SCOPED_TRACE(card.name);
    TrainOptions o = qwen_options(card, 2, 4, 1, 50);
    o.seq_len = 32;
    o.lr.lr = 1e-2;
    TrainResult r = train(o);
    ASSERT_EQ(r.steps.size(), 50u);
    double first = 0, last = 0;
    for (int i = 0; i < 5; ++i) first += r.steps[static_cast<size_t>(i)].loss / 5;
    for (int i = 45; i < 50; ++i) last += r.steps[static_cast<size_t>(i)].loss / 5;
    EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
  }
}

TEST(Qwen35Training, SixStepsEqualThreePlusResumePlusThree) {
  for (const ModelCard& card : qwen_cards()) {
    SCOPED_TRACE(card.name);
    testing::expect_resume_is_bitwise(qwen_options(card, 2, 1, 2, 6), card.name);
  }
}

}  // namespace
}  // namespace slidedp::exec
