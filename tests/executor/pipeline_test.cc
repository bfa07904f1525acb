// The executor's correctness oracle on the CPU backend (DESIGN section 5): streaming equals not
// streaming, every route combination gives bitwise identical weights, N ranks x micro-batch b equals
// 1 rank x N*b and equals accumulation, activation policies are invisible in the result, plans over
// the device budget are rejected before training, and the loss goes down on real text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "executor/backend_registry.h"
#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

using testing::bitwise_equal;
using testing::tiny_options;
using testing::weight_error;

TEST(Pipeline, StreamingEqualsResident) {
  for (bool tied : {false, true}) {
    TrainOptions streamed = tiny_options(2, 2, 1);
    streamed.card = testing::tiny_card(tied);
    streamed.plan.gpu_buffer_depth = 2;
    TrainOptions resident = streamed;
    resident.plan.gpu_buffer_depth = 5;  // every unit stays on the device
    TrainResult a = train(streamed), b = train(resident);
    ASSERT_EQ(a.steps.size(), 3u);
    for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "tied " << tied;
    EXPECT_TRUE(bitwise_equal(a, b)) << "tied " << tied;
  }
}

TEST(Pipeline, EveryRouteCombinationGivesBitwiseIdenticalWeights) {
  for (int ranks : {2, 3, 4}) {
    std::vector<TrainResult> results;
    for (ParamRoute pr : {ParamRoute::kReplicated, ParamRoute::kSharded})
      for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
        TrainOptions o = tiny_options(ranks, 1, 2);
        o.plan.param_route = pr;
        o.plan.grad_route = gr;
        results.push_back(train(o));
      }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(results[0], results[i])) << ranks << " ranks, combination " << i;
      EXPECT_EQ(results[0].steps.back().loss, results[i].steps.back().loss);
    }
  }
}

// fp32 delivery and gradients: N ranks x b and 1 rank x N*b differ only by the order of fp32 sums
// (per-rank partial sums vs one GEMM over the whole batch), relative 1e-6 or less. Adam divides the
// gradient by its own magnitude, which turns such differences in near-zero gradients into O(lr)
// weight differences; with eps = 1 (far above every |g|) the update is linear in the gradient, so
// weights must agree to 1e-5 relative. The first step's loss is computed before any update: 1e-6.
TEST(Pipeline, RanksTimesMicroBatchEqualsOneRankAndAccumulation) {
  for (int n : {1, 2, 3, 4}) {
    TrainOptions ranks = tiny_options(n, 1, 1, 3);
    ranks.exact_fp32 = true;
    ranks.optimizer.eps = 1.0;
    ranks.lr.lr = 0.1;
    TrainOptions single = ranks;
    single.plan.ranks = 1;
    single.plan.micro_batch = n;
    TrainOptions accum = ranks;
    accum.plan.ranks = 1;
    accum.plan.accum_steps = n;
    for (GradRoute gr : {GradRoute::kCpu, GradRoute::kGpu}) {
      ranks.plan.grad_route = gr;
      TrainResult a = train(ranks), b = train(single), c = train(accum);
      EXPECT_NEAR(a.steps[0].loss, b.steps[0].loss, 1e-6 * std::fabs(b.steps[0].loss)) << n;
      EXPECT_NEAR(a.steps[0].loss, c.steps[0].loss, 1e-6 * std::fabs(c.steps[0].loss)) << n;
      EXPECT_LE(weight_error(a, b, 1e-7, 1e-5), 1.0) << n << " ranks vs 1 rank x " << n;
      EXPECT_LE(weight_error(a, c, 1e-7, 1e-5), 1.0) << n << " ranks vs accumulation " << n;
      EXPECT_EQ(a.steps[0].tokens, b.steps[0].tokens);
    }
  }
}

TEST(Pipeline, ActivationPoliciesGiveIdenticalResults) {
  TrainOptions keep = tiny_options(2, 2, 1);
  keep.plan.recompute_layers = 0;
  keep.plan.keep_layers = Plan::kRest;
  TrainOptions recompute = keep;
  recompute.plan.recompute_layers = Plan::kRest;
  recompute.plan.keep_layers = 0;
  TrainOptions offload = keep;
  offload.plan.offload_layers = 3;
  offload.plan.recompute_layers = 0;
  offload.plan.keep_layers = 0;
  TrainOptions mixed = keep;
  mixed.plan.per_layer = {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep};
  TrainResult a = train(keep);
  for (const TrainOptions* o : {&recompute, &offload, &mixed}) {
    TrainResult b = train(*o);
    EXPECT_TRUE(bitwise_equal(a, b)) << o->plan.summary(3);
  }
}

// The MLP token tile (plan key mlp_token_tile) through the whole pipeline. fp32 delivery: the tiled
// MLP differs from the untiled one only in the order its weight gradients sum over tokens (tile by
// tile), relative 1e-6 or less; with Adam's eps = 1 the update is linear in the gradient, so (as in
// RanksTimesMicroBatchEqualsOneRankAndAccumulation) losses agree to 1e-6 and weights to 1e-5
// relative. bf16 delivery and wire: a gradient that lands on the other side of a bf16 rounding
// boundary moves by one bf16 ulp (2^-8 relative) in one element; over 3 steps at lr 3e-3 that changes
// the loss by far less than 1e-3 relative.
// Sharded delivery with the gpu route: the all-gather and the reduce-scatter share a rank's comm
// stream, so in backward the next unit's all-gather is queued before this unit's reduce-scatter
// (model/plan.h backward_delivery_lookahead); queued after it, the backward could never overlap
// communication (cuda-review D13). On rank 0's comm stream (in order), between the reduce-scatters of
// units u + 1 and u sits an all-gather of unit u - 1, for every backward unit.
TEST(Pipeline, ShardedGpuRouteQueuesTheNextDeliveryBeforeThisGradient) {
  TrainOptions o = tiny_options(2, 1, 1, 1);
  o.plan.param_route = ParamRoute::kSharded;
  o.plan.grad_route = GradRoute::kGpu;
  o.plan.gpu_buffer_depth = 2;  // every backward unit is delivered again
  o.trace = true;
  const TrainResult r = train(o);
  std::vector<const MeasuredSpan*> comm;
  for (const MeasuredSpan& sp : r.spans)
    if (sp.rank == 0 && sp.tag.category == std::string("fabric") && sp.tag.step == 0) comm.push_back(&sp);
  std::sort(comm.begin(), comm.end(), [](auto* a, auto* b) { return a->start_s < b->start_s; });
  auto first = [&](const char* what, int unit, size_t from) {
    for (size_t i = from; i < comm.size(); ++i)
      if (comm[i]->tag.what == std::string(what) && comm[i]->tag.unit == unit) return i;
    return comm.size();
  };
  const int L = static_cast<int>(o.card.num_layers);
  size_t after = first("reduce-scatter", L + 1, 0);  // the head's gradient: backward has begun
  ASSERT_LT(after, comm.size());
  for (int u = L; u >= 1; --u) {
    const size_t rs = first("reduce-scatter", u, after);
    const size_t ag = first("all-gather", u - 1, after);
    ASSERT_LT(rs, comm.size()) << "unit " << u;
    EXPECT_LT(ag, rs) << "the all-gather of unit " << u - 1 << " must precede the reduce-scatter of unit " << u;
    after = rs;
  }
}

TEST(Pipeline, MlpTokenTileGivesTheSameLossesAndLessDeviceMemory) {
  TrainOptions untiled = tiny_options(2, 2, 1, 3);
  untiled.plan.per_layer = {ActivationPolicy::kOffload, ActivationPolicy::kRecompute, ActivationPolicy::kKeep};
  TrainOptions tiled = untiled;
  tiled.plan.mlp_token_tile = 5;  // 2 sequences x 16 tokens = 32 rows: tiles of 5 and a last one of 2
  {
    TrainResult a = train(untiled), b = train(tiled);
    ASSERT_EQ(b.steps.size(), 3u);
    for (size_t i = 0; i < a.steps.size(); ++i)
      EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 1e-3 * std::fabs(a.steps[i].loss)) << "bf16, step " << i;
  }
  for (TrainOptions* o : {&untiled, &tiled}) {
    o->exact_fp32 = true;
    o->optimizer.eps = 1.0;
    o->lr.lr = 0.1;
  }
  TrainResult a = train(untiled), b = train(tiled);
  for (size_t i = 0; i < a.steps.size(); ++i)
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 1e-6 * std::fabs(a.steps[i].loss)) << "fp32, step " << i;
  EXPECT_LE(weight_error(b, a, 1e-7, 1e-5), 1.0);

  // The device budget accounting sees the tiled layer: less saved state for the kept layer and a
  // smaller decoder working set, from the backend's own (kernel-carved) sizes.
  const ModelLayout layout = make_model_layout(untiled.card);
  RunControl control;
  BackendOptions bo;
  bo.device_budget_bytes = int64_t{64} << 20;
  auto plain = make_backend("cpu", untiled.card, layout, bo, control);
  bo.mlp_token_tile = tiled.plan.mlp_token_tile;
  auto tiles = make_backend("cpu", untiled.card, layout, bo, control);
  const UnitMemory ma = plain->device(0).unit_memory(UnitKind::kDecoder, 2, 16);
  const UnitMemory mb = tiles->device(0).unit_memory(UnitKind::kDecoder, 2, 16);
  EXPECT_LT(mb.saved_bytes, ma.saved_bytes);
  // (In this tiny layer the attention gradients, not the MLP's, are the larger backward scratch.)
  EXPECT_LE(mb.backward_workspace_bytes, ma.backward_workspace_bytes);
  const RankMemoryAccount ia = rank_memory_account(layout, untiled.plan, 16, false, plain->device(0).memory_spec(2, 16));
  const RankMemoryAccount ib = rank_memory_account(layout, tiled.plan, 16, false, tiles->device(0).memory_spec(2, 16));
  EXPECT_LT(ib.peak_bytes, ia.peak_bytes);
}

TEST(Pipeline, PlanOverTheDeviceBudgetIsRejectedBeforeTrainingAndTheBudgetHolds) {
  TrainOptions o = tiny_options(2, 2, 1);
  o.device_budget_bytes = 64 << 10;  // 64 KiB: not even the parameter slots fit
  try {
    train(o);
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the budget"), std::string::npos) << e.what();
  }
  o.device_budget_bytes = 4 << 20;
  TrainResult r = train(o);
  for (int64_t hw : r.device_high_water_bytes) {
    EXPECT_GT(hw, 0);
    EXPECT_LE(hw, r.device_budget_bytes);
  }
}

TEST(Pipeline, LossGoesDownOnTheEmbeddedText) {
  TrainOptions o = tiny_options(2, 4, 1, 50);
  o.seq_len = 32;
  o.lr.lr = 1e-2;
  TrainResult r = train(o);
  ASSERT_EQ(r.steps.size(), 50u);
  const double first = testing::mean_loss(r, 0, 5), last = testing::mean_loss(r, 45, 50);
  EXPECT_NEAR(r.steps[0].loss, std::log(256.0), 0.1);  // random init: about uniform over 256 bytes
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace slidedp::exec

namespace slidedp::exec {
namespace {

// Evaluation (executor/evaluation.h) against the training step on the same tokens: with data of
// exactly one step's sequences, the evaluation of the starting weights (--steps 0) is step 1's loss,
// and the one after step s is step s + 1's (CPU backend, fp32 throughout, one rank). Training takes
// the rows in its shuffled order, the evaluation in file order, and OpenBLAS rounds an fp32 row's dot
// products by where the row falls in its blocks: 1e-9 relative measured; 1e-7 is about one fp32
// rounding of the loss, while the weights of the step before move it by 1e-2. Two ranks evaluate their
// halves of the held-out rows after the weights their split trained (fp32 gradient sums in another
// order): within 1e-6.
TEST(Pipeline, EvaluationEqualsTheTrainingLossOfTheSameTokens) {
  TrainOptions o = testing::tiny_options(1, 4, 1, 3);
  o.exact_fp32 = true;
  o.dataset = testing::embedded_prefix(4, o.seq_len, 0);
  o.eval_dataset = o.dataset;
  o.eval_every = 1;
  const TrainResult trained = train(o);
  ASSERT_EQ(trained.evals.size(), 3u);
  for (size_t s = 0; s + 1 < trained.steps.size(); ++s) {
    EXPECT_EQ(trained.evals[s].step, static_cast<int64_t>(s + 1));
    EXPECT_EQ(trained.evals[s].tokens, trained.steps[s + 1].tokens);
    EXPECT_NEAR(trained.evals[s].loss, trained.steps[s + 1].loss, 1e-7 * trained.steps[s + 1].loss);
  }
  TrainOptions before = o;
  before.steps = 0;
  const TrainResult start = train(before);
  ASSERT_EQ(start.evals.size(), 1u);
  EXPECT_EQ(start.evals[0].step, 0);
  EXPECT_NEAR(start.evals[0].loss, trained.steps[0].loss, 1e-7 * trained.steps[0].loss);
  TrainOptions two = o;
  two.plan.ranks = 2;
  two.plan.micro_batch = 2;
  const TrainResult split = train(two);
  ASSERT_EQ(split.evals.size(), 3u);
  EXPECT_NEAR(split.evals[0].loss, trained.evals[0].loss, 1e-6 * trained.evals[0].loss);
}

// The held-out file's tokens after its last whole sequence are evaluated too (training leaves them
// out), in a part-filled row; rows past the end count nothing: every target of the file counts once.
TEST(Pipeline, EvaluationCountsEveryTargetOfTheFile) {
  TrainOptions o = testing::tiny_options(2, 2, 1, 1);
  o.eval_dataset =
      testing::embedded_prefix(5, o.seq_len, 7);  // 5 whole sequences and 7 tokens: rows 0..5 of 8
  const TrainResult r = train(o);
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_EQ(r.evals[0].tokens, 5 * o.seq_len + 7);
  EXPECT_TRUE(std::isfinite(r.evals[0].loss));
}

}  // namespace
}  // namespace slidedp::exec
