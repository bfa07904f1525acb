// One source of the bytes a copy moves: a paced run's copies, weighed by the CPU backend's pacer and
// reported by their spans (MeasuredSpan::bytes, the run log's phase_totals.bytes), add up per rank
// and step to the host-link bytes the step model charges for the same plan on the
// same target, for every system the executor runs, both routes of each kind, activation offload, and
// every family. Before, the pacer re-derived the bytes and weighed the gpu route's fp32 gradient
// shard at 2 bytes per element where the model (and the executor's fp32 shard) has 4: the gpu-route
// cases fail on that code by the shards' bytes.
//
// The same check found two schedules that differed in how many copies they make, now one schedule
// in the model, the simulator and the executor: a tied head's embedding takes a buffer slot of its
// own, evicting a layer the backward then delivers again (one decoder layer more per micro-step at
// depth 2; the model charged the embedding with the head and evicted nothing); and zero3-offload's
// recomputed layers are gathered again for the backward, as DeepSpeed's forward hook releases them
// after the recompute (the model charged every delivery of such a layer 1.5 times, the executor
// fetched once for the recompute and the backward together). And the first GPU run (results/gpu/
// 2026-12-04-h200) showed the model charging a tied head's embedding again with every unit resident
// (0.525 GB a step on Llama-3.2-1B that the H200 did not copy): the every-unit-resident case.
// ZeRO-Offload with accumulation (A = 2 here) moves DeepSpeed's fp16 gradient sum out on the first
// micro-step and back in on the second, then its fp32 partition: both directions are checked, with
// several ranks (shards) and one (the whole model by the cpu route's copies).
#include "model/copy_bytes.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "executor/trainer.h"
#include "tests/executor/executor_test_util.h"
#include "tests/executor/link_bytes.h"

namespace slidedp::exec {
namespace {

using testing::Case;
using testing::case_options;

void expect_paced_bytes_are_the_models(const ModelCard& card, const Case& c) {
  TrainOptions o = case_options(card, c);
  o.emulate = testing::paced_target(10.0, 1.5e7);
  o.time_scale = kMinTimeScale;  // the bytes are counted whatever the pace: run as fast as possible
  const TrainResult r = train(o);
  const testing::LinkBytes model = testing::model_link_bytes_per_step(o, *o.emulate);
  SCOPED_TRACE(fmt::format("{} {}", card.name, c.name));
  testing::expect_span_bytes_are_the_models(r, o, model);
  const double steps = static_cast<double>(o.steps);
  for (int rank = 0; rank < o.plan.ranks; ++rank) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const testing::LinkBytes paced = testing::span_link_bytes(r, rank);
    // The run log's per-step totals hold the same bytes plus the copies the model does not charge:
    // at most the token ids and targets in (4 bytes each) and a loss of a few floats out per
    // micro-step (64 bytes allowed).
    testing::LinkBytes logged;
    for (const TrainStep& s : r.steps)
      for (const PhaseTotal& t : s.totals) {
        if (t.rank != rank) continue;
        if (t.category == "h2d") logged.h2d += t.bytes.value_or(0.0);
        if (t.category == "d2h") logged.d2h += t.bytes.value_or(0.0);
      }
    const double micro_steps = steps * o.plan.accum_steps;
    const double uncharged = micro_steps * (8.0 * static_cast<double>(o.plan.micro_batch * o.seq_len) + 64.0);
    EXPECT_GE(logged.h2d, paced.h2d - 1e-6);
    EXPECT_LE(logged.h2d, paced.h2d + uncharged);
    EXPECT_GE(logged.d2h, paced.d2h - 1e-6);
    EXPECT_LE(logged.d2h, paced.d2h + uncharged);
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"slidedp cpu route", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kCpu, false},
      {"slidedp one rank", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kCpu, false, false, 1},
      {"slidedp gpu route", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kGpu, false},
      {"slidedp sharded gpu route", System::kSlideDP, ParamRoute::kSharded, GradRoute::kGpu, false},
      {"slidedp sharded cpu route offload", System::kSlideDP, ParamRoute::kSharded, GradRoute::kCpu, true},
      {"slidedp every unit resident", System::kSlideDP, ParamRoute::kReplicated, GradRoute::kCpu, false,
       true},
      {"slideformer-dp", System::kSlideFormerDP},
      {"zero-offload", System::kZeroOffload},
      // One rank: its partition is the whole model, leaving by the cpu route's copies.
      {"zero-offload one rank", System::kZeroOffload, ParamRoute::kReplicated, GradRoute::kGpu, false, false,
       1},
      {"zero3-offload", System::kZero3Offload},
      {"zero3-offload one rank", System::kZero3Offload, ParamRoute::kSharded, GradRoute::kGpu, false, false,
       1},
      {"fsdp-offload", System::kFsdpOffload},  // fp32 parameter shards: 4 bytes per element
      {"fsdp-offload one rank", System::kFsdpOffload, ParamRoute::kReplicated, GradRoute::kGpu, false, false,
       1},
      {"megatrain", System::kMegaTrain},
      {"fsdp2", System::kFsdp2},
  };
  return all;
}

TEST(CopyBytes, PacedCopiesWeighWhatTheModelCharges) {
  for (const ModelCard& card : {testing::tiny_card(), testing::tiny_card(true), testing::tiny_gemma4_card(),
                                testing::tiny_gemma4_moe_card(), testing::tiny_qwen3_5_card(),
                                testing::tiny_qwen3_5_moe_card()})
    for (const Case& c : cases())
      expect_paced_bytes_are_the_models(card, c);
}

// Unpaced, a span reports the bytes the CPU backend really copied, in the dtypes the CUDA backend
// copies too without --exact (the same rank driver: bf16 parameters and gradients on the wire, fp32
// shards and fp32 parameter shards), except activations (fp32 here, bf16 on a GPU). So where no activation is
// offloaded, these are the bytes a GPU run moves, and they must be the model's: the check the GPU
// test (cuda_copy_bytes_test.cc) makes, here without a GPU (SlideFormer-DP offloads every layer's
// input, so it is left out with the activation-offload cases). The ZeRO offloads' sums between
// micro-steps on the gpu route move more than DeepSpeed's, by a closed amount (link_bytes.h,
// exact_sum_surplus_per_step).
TEST(CopyBytes, UnpacedCopiesMoveTheModelsBytesInTheWireDtypes) {
  const Hardware target = testing::paced_target(10.0, 1.5e7);
  for (const ModelCard& card :
       {testing::tiny_card(), testing::tiny_gemma4_card(), testing::tiny_qwen3_5_card()})
    for (const Case& c : cases()) {
      if (c.offload || c.system == System::kSlideFormerDP) continue;  // fp32 activations here
      const TrainOptions o = case_options(card, c);
      SCOPED_TRACE(fmt::format("{} {}", card.name, c.name));
      testing::LinkBytes expected = testing::model_link_bytes_per_step(o, target);
      expected.d2h += testing::exact_sum_surplus_per_step(o, target).d2h;
      testing::expect_span_bytes_are_the_models(train(o), o, expected);
    }
}

// The surplus is what it says: the ZeRO offloads' sums between micro-steps, on the gpu route only.
TEST(CopyBytes, OnlyTheZeroOffloadsSumsOnTheGpuRouteMoveMoreThanTheModel) {
  const Hardware target = testing::paced_target(10.0, 1.5e7);
  const ModelCard card = testing::tiny_card();
  for (const Case& c :
       std::vector<Case>{{"zero-offload", System::kZeroOffload}, {"zero3-offload", System::kZero3Offload}}) {
    SCOPED_TRACE(c.name);
    const TrainOptions o = case_options(card, c);
    EXPECT_GT(testing::exact_sum_surplus_per_step(o, target).d2h, 0.0);
    TrainOptions once = o;
    once.plan.accum_steps = 1;
    EXPECT_EQ(testing::exact_sum_surplus_per_step(once, target).d2h, 0.0);
  }
  for (System s : {System::kSlideDP, System::kFsdpOffload, System::kMegaTrain, System::kFsdp2})
    EXPECT_EQ(testing::exact_sum_surplus_per_step(case_options(card, {"", s}), target).d2h, 0.0)
        << system_name(s);
}

// The kinds the model charges, by the executor's tags; the rest (token ids, the loss) it does not.
TEST(CopyBytes, TagsNameTheKindsTheModelCharges) {
  EXPECT_EQ(copy_kind_of("params"), CopyKind::kParams);
  EXPECT_EQ(copy_kind_of("params shard"), CopyKind::kParams);
  EXPECT_EQ(copy_kind_of("params fp32"), CopyKind::kParams);
  EXPECT_EQ(copy_kind_of("params shard fp32"), CopyKind::kParams);
  EXPECT_EQ(copy_kind_of("grad"), CopyKind::kGrad);
  EXPECT_EQ(copy_kind_of("grad fp32"), CopyKind::kGrad);
  EXPECT_EQ(copy_kind_of("grad shard"), CopyKind::kGradShard);
  EXPECT_EQ(copy_kind_of("offload"), CopyKind::kActivation);
  EXPECT_EQ(copy_kind_of("prefetch"), CopyKind::kActivation);
  for (const char* what : {"grad accum in", "grad accum out", "grad shard accum in", "grad shard accum out"})
    EXPECT_EQ(copy_kind_of(what), CopyKind::kGradAccum) << what;
  EXPECT_FALSE(copy_kind_of("tokens"));
  EXPECT_FALSE(copy_kind_of("loss"));
  // SlideDP's gpu-route shard is the fp32 sum (4 bytes). The ZeRO offloads' partitions leave as fp32 on
  // the last micro-step (DeepSpeed casts them on the GPU before the copy) and as their 16-bit sum on the
  // others (ZeRO-3's every micro-step, out and back in).
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kSlideDP), CopyKind::kGradShard), 4.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZeroOffload), CopyKind::kGradShard), 4.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZeroOffload), CopyKind::kGrad), 4.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZeroOffload), CopyKind::kGradAccum), 2.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZero3Offload), CopyKind::kGradShard), 4.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZero3Offload), CopyKind::kGrad), 4.0);
  EXPECT_EQ(target_bytes_per_element(system_traits(System::kZero3Offload), CopyKind::kGradAccum), 2.0);
}

}  // namespace
}  // namespace slidedp::exec
