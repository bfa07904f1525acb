// The baselines' data movement on the executor (slidedp-run --system): each is the same math as
// SlideDP over the plan the system imposes, so after a few steps its weights equal a SlideDP run of
// that plan -- bitwise where the reduction order is the same (SlideFormer-DP: the fused rank-ordered
// reduce + AdamW; ZeRO-Offload; FSDP2, whose AdamW runs on the devices; MegaTrain without
// accumulation), within a few fp32 ulps where it is not
// (MegaTrain adds every rank's gradient separately, micro-step by micro-step). And each shows its own
// schedule in the measured timeline: MegaTrain's optimizer runs after the backward with one
// accumulation per rank; SlideFormer converts every delivered chunk on the host before copying it,
// and a unit's gradient leaves only after the next unit's update.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "common/error.h"
#include "executor/trainer.h"
#include "model/step_work.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

TrainOptions options(System system, int accum, bool exact) {
  TrainOptions o = testing::tiny_options(2, 2, accum, 3);
  o.system = system;
  o.exact_fp32 = exact;
  o.trace = true;
  return o;
}

// SlideDP over the plan `system` imposes: the same routes, chunks and activation policies, and the
// baselines' fp32 master (SlideDP's default split master rounds its mirror's exact ties otherwise).
TrainResult slidedp_reference(const TrainOptions& o) {
  TrainOptions r = o;
  r.system = System::kSlideDP;
  r.master = MasterStorage::kFp32;
  r.plan = plan_for_system(o.plan, o.system, o.card);
  return train(r);
}

struct Span {
  double start, end;
};
std::vector<Span> spans(const TrainResult& r, const std::string& category, const std::string& what, int step, int rank,
                        int unit = -2) {
  std::vector<Span> out;
  for (const MeasuredSpan& s : r.spans)
    if (s.tag.category == category && s.tag.what == what && s.tag.step == step && (rank < 0 || s.rank == rank) &&
        (unit == -2 || s.tag.unit == unit))
      out.push_back({s.start_s, s.end_s});
  return out;
}
double last_end(const std::vector<Span>& v) {
  double e = -1;
  for (const Span& s : v) e = std::max(e, s.end);
  return e;
}
double first_start(const std::vector<Span>& v) {
  double t = 1e300;
  for (const Span& s : v) t = std::min(t, s.start);
  return t;
}

// Every combination of dtype and accumulation: the system's weights equal SlideDP's bitwise.
void expect_bitwise_like_slidedp(System system) {
  for (bool exact : {false, true})
    for (int accum : {1, 2}) {
      const TrainOptions o = options(system, accum, exact);
      EXPECT_TRUE(testing::bitwise_equal(train(o), slidedp_reference(o)))
          << system_name(system) << " exact " << exact << " accum " << accum;
    }
}

// Paced at a slow CPU update (the overlap tests' update-bound target, 16 small layers, one update
// thread), so that whatever waits for an update visibly waits.
TrainOptions paced_slow_update(System system) {
  TrainOptions o = options(system, 1, false);
  o.card = testing::tiny16_card();
  o.plan.update_threads = 1;
  o.update_threads = 1;
  o.emulate = testing::paced_target(10.0, 1.5e7);
  o.time_scale = 20;
  return o;
}

TEST(Systems, SlideFormerReachesSlideDPsWeightsBitwise) { expect_bitwise_like_slidedp(System::kSlideFormerDP); }

TEST(Systems, MegaTrainReachesSlideDPsWeights) {
  // Without accumulation the sums are the same fp32 additions in the same rank order: bitwise.
  const TrainOptions one = options(System::kMegaTrain, 1, true);
  EXPECT_TRUE(testing::bitwise_equal(train(one), slidedp_reference(one)));
  // With accumulation MegaTrain adds (((r0 m0 + r1 m0) + r0 m1) + r1 m1) where SlideDP adds
  // (r0 m1 + r1 m1) + (r0 m0 + r1 m0): the gradients differ by a few ulps. AdamW moves a weight by
  // lr g / (|g| + eps), so a gradient that cancels to rounding residue (3e-12 in one order, 0 in the
  // other) moves it by up to lr |g| / eps: 9e-7 after one step at eps 1e-8 (measured). With eps 1e-3
  // that amplification is gone and the runs differ by 1-2 ulps of the weights (7e-9 measured over 3
  // steps): inside 1e-7 absolute + 1e-6 relative.
  TrainOptions two = options(System::kMegaTrain, 2, true);
  two.optimizer.eps = 1e-3;
  EXPECT_LE(testing::weight_error(train(two), slidedp_reference(two), 1e-7, 1e-6), 1.0);
}

TEST(Systems, MegaTrainUpdatesAfterTheBackwardAddingOneRankAtATime) {
  const TrainOptions o = options(System::kMegaTrain, 2, false);
  const TrainResult r = train(o);
  const int U = static_cast<int>(o.card.num_layers) + 2;
  int64_t chunks = 0;
  for (const auto& unit : r.master) chunks += (static_cast<int64_t>(unit.size()) + o.plan.chunk_numel - 1) / o.plan.chunk_numel;
  for (int step = 1; step < 3; ++step) {
    const auto updates = spans(r, "cpu_update", "verify+adamw", step, -1);
    ASSERT_FALSE(updates.empty());
    double backward_end = 0;
    for (int rank = 0; rank < 2; ++rank) backward_end = std::max(backward_end, last_end(spans(r, "compute", "bwd", step, rank)));
    EXPECT_GE(first_start(updates), backward_end) << "step " << step << ": an update ran during a backward";
    // One accumulation per rank, chunk and micro-step (ranks 2, micro-steps 2).
    EXPECT_EQ(static_cast<int64_t>(spans(r, "cpu_update", "reduce", step, -1).size()), chunks * 2 * 2) << U;
  }
}

TEST(Systems, SlideFormerConvertsEachDeliveryAndWaitsForTheNextUnitsUpdate) {
  // Paced at a slow CPU update (the overlap tests' update-bound target), so that a gradient that did
  // not wait would visibly leave before the next unit's update ends.
  const TrainOptions o = paced_slow_update(System::kSlideFormerDP);
  const TrainResult r = train(o);
  const int U = static_cast<int>(o.card.num_layers) + 2;
  for (int step = 1; step < 3; ++step)
    for (int rank = 0; rank < 2; ++rank) {
      // Every delivered chunk was converted by this rank just before its copy.
      for (const MeasuredSpan& copy : r.spans) {
        if (copy.rank != rank || copy.tag.step != step || copy.tag.category != std::string("h2d") ||
            copy.tag.what != std::string("params"))
          continue;
        bool converted = false;
        for (const MeasuredSpan& c : r.spans)
          if (c.rank == rank && c.tag.category == std::string("convert") && c.tag.step == step &&
              c.tag.unit == copy.tag.unit && c.tag.chunk == copy.tag.chunk && c.end_s <= copy.start_s + 1e-9)
            converted = true;
        EXPECT_TRUE(converted) << "rank " << rank << " step " << step << " unit " << copy.tag.unit;
      }
      // Decoder units' gradients leave after the next unit's update (one shared gradient buffer). The
      // update's span ends when its work is done, stamped before it releases the gradient slots, so the
      // order holds on the timeline however the threads are scheduled: no slack.
      for (int u = 1; u < U - 1; ++u) {
        const double leaves = first_start(spans(r, "d2h", "grad", step, rank, u));
        const double next_updated = last_end(spans(r, "cpu_update", "adamw", step, -1, u + 1));
        EXPECT_GE(leaves, next_updated) << "rank " << rank << " step " << step << " unit " << u;
      }
    }
}

TEST(Systems, ZeroOffloadReachesSlideDPsWeightsBitwise) {
  // The same rank-ordered reduce-scatter, the same host accumulation and AdamW per chunk, and the
  // all-gathered partitions hold the same bf16 mirror bits a replicated delivery copies.
  expect_bitwise_like_slidedp(System::kZeroOffload);
}

TEST(Systems, ZeroOffloadUploadsEachPartitionOncePerStepAfterTheUpdate) {
  const TrainOptions o = options(System::kZeroOffload, 2, false);
  const TrainResult r = train(o);
  const int U = static_cast<int>(o.card.num_layers) + 2;
  for (int step = 1; step < 3; ++step) {
    double backward_end = 0;
    for (int rank = 0; rank < 2; ++rank) backward_end = std::max(backward_end, last_end(spans(r, "compute", "bwd", step - 1, rank)));
    const auto updates = spans(r, "cpu_update", "verify+adamw", step - 1, -1);
    ASSERT_FALSE(updates.empty());
    EXPECT_GE(first_start(updates), backward_end) << "step " << step - 1 << ": an update ran during a backward";
    for (int rank = 0; rank < 2; ++rank) {
      // Never a whole unit over the link: this rank's partition of each chunk, once per step although
      // the step has two micro-steps (the parameters stay resident between them), and the all-gather.
      EXPECT_TRUE(spans(r, "h2d", "params", step, rank).empty());
      for (int u = 0; u < U; ++u) {
        const int64_t numel = static_cast<int64_t>(r.master[static_cast<size_t>(u)].size());
        const size_t chunks = static_cast<size_t>((numel + o.plan.chunk_numel - 1) / o.plan.chunk_numel);
        EXPECT_EQ(spans(r, "h2d", "params shard", step, rank, u).size(), chunks) << "rank " << rank << " unit " << u;
        EXPECT_EQ(spans(r, "fabric", "all-gather", step, rank, u).size(), chunks) << "rank " << rank << " unit " << u;
      }
      // The new parameters go up only once the previous step's update has produced them.
      EXPECT_GE(first_start(spans(r, "h2d", "params shard", step, rank)), first_start(updates));
    }
  }
}

// The host update of `step` began only after both ranks' backward of it had ended.
void expect_update_after_the_backward(const TrainResult& r, int step) {
  double backward_end = 0;
  for (int rank = 0; rank < 2; ++rank) backward_end = std::max(backward_end, last_end(spans(r, "compute", "bwd", step, rank)));
  const auto updates = spans(r, "cpu_update", "verify+adamw", step, -1);
  ASSERT_FALSE(updates.empty()) << "step " << step;
  EXPECT_GE(first_start(updates), backward_end) << "step " << step << ": an update ran during a backward";
}

size_t chunks_of(const TrainResult& r, const TrainOptions& o, int u) {
  const int64_t numel = static_cast<int64_t>(r.master[static_cast<size_t>(u)].size());
  return static_cast<size_t>((numel + o.plan.chunk_numel - 1) / o.plan.chunk_numel);
}

// A baseline whose parameters live on the host (ZeRO-3 offload, FSDP offload): bitwise SlideDP's
// weights, and in each of three steps (2 ranks, 2 micro-steps) the update after the backward, no whole
// unit over any link, and per rank what `fetches` checks of its deliveries.
void expect_host_offload_schedule(System system,
                                  const std::function<void(const TrainResult&, const TrainOptions&, int, int)>& fetches) {
  expect_bitwise_like_slidedp(system);
  const TrainOptions o = options(system, 2, false);
  const TrainResult r = train(o);
  for (int step = 0; step < 3; ++step) {
    expect_update_after_the_backward(r, step);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(spans(r, "h2d", "params", step, rank).empty()) << "a whole unit crossed the link";
      fetches(r, o, step, rank);
    }
  }
}

// ZeRO-3 with parameters and optimizer on the host: every micro-step fetches each rank's partition of
// every unit and all-gathers it (again for the backward unless the unit is still in a slot; ZeRO-Offload
// keeps them resident: once a step), and the host update follows the whole backward. The weights are SlideDP's
// for the same plan, bit for bit (sharded delivery, gpu route, the update after the backward).
TEST(Systems, Zero3OffloadFetchesPartitionsEveryPassAndUpdatesAfterTheBackward) {
  expect_host_offload_schedule(System::kZero3Offload, [](const TrainResult& r, const TrainOptions& o, int step, int rank) {
    const int U = static_cast<int>(o.card.num_layers) + 2;
    size_t decoder_fetches = 0, decoder_chunks = 0;
    for (int u = 1; u + 1 < U; ++u) {  // the decoder layers: fetched in every micro-step
      const size_t chunks = chunks_of(r, o, u);
      const size_t fetched = spans(r, "h2d", "params shard", step, rank, u).size();
      EXPECT_GE(fetched, 2 * chunks) << "rank " << rank << " unit " << u << ": once in each of two micro-steps";
      decoder_fetches += fetched, decoder_chunks += chunks;
    }
    // and again for the backward of what the two slots no longer hold (3 of 4 passes in this 3-layer model)
    EXPECT_GE(decoder_fetches, 3 * decoder_chunks) << "rank " << rank;
  });
}

// FSDP with CPU offload: the host holds the fp32 parameters, so every delivery copies this rank's fp32
// shard of each chunk (4 bytes per element, where ZeRO-3 offload copies 2), casts it on the device and
// all-gathers the rest; the layers are fetched again for the backward (two slots); the optimizer runs
// after the backward. The cast is the rounding the host mirror holds: bitwise SlideDP's weights.
TEST(Systems, FsdpOffloadFetchesFp32ShardsAndUpdatesAfterTheBackward) {
  expect_host_offload_schedule(System::kFsdpOffload, [](const TrainResult& r, const TrainOptions& o, int step, int rank) {
    EXPECT_TRUE(spans(r, "h2d", "params shard", step, rank).empty()) << "a 16-bit shard crossed the link";
    for (int u = 0; u < static_cast<int>(o.card.num_layers) + 2; ++u)
      EXPECT_GE(spans(r, "h2d", "params shard fp32", step, rank, u).size(), 2 * chunks_of(r, o, u))
          << "rank " << rank << " unit " << u << ": once in each of two micro-steps";
  });
}

TEST(Systems, MegaTrainAndZeroOffloadMoveNoParameterBeforeTheWholeUpdate) {
  // Their training loops call step() and only then the next forward, so no delivery of step s+1 may
  // start before the last chunk of step s is updated (SlideDP's verify mode releases each chunk as
  // it is updated). Paced at a slow CPU update so the update lasts about 235 ms: a delivery that
  // waited only for its own chunk would start near the update's beginning (measured: 235 ms early).
  for (System system : {System::kMegaTrain, System::kZeroOffload}) {
    const TrainResult r = train(paced_slow_update(system));
    const char* what = system == System::kMegaTrain ? "params" : "params shard";
    for (int step = 1; step < 3; ++step) {
      const auto updates = spans(r, "cpu_update", "verify+adamw", step - 1, -1);
      ASSERT_FALSE(updates.empty()) << system_name(system);
      // Slack: a tenth of the update (the span ends after its job returned; a loaded host delays
      // that by milliseconds), against a delivery that did not wait starting about the whole update early.
      const double slack = 0.1 * (last_end(updates) - first_start(updates));
      for (int rank = 0; rank < 2; ++rank)
        EXPECT_GE(first_start(spans(r, "h2d", what, step, rank)), last_end(updates) - slack)
            << system_name(system) << " step " << step << " rank " << rank;
    }
  }
}

TEST(Systems, Fsdp2ReachesSlideDPsWeightsBitwise) {
  // AdamW on the device is the same kernel arithmetic over the same reduce-scattered fp32 sums (and
  // the same accumulation order), and the all-gathered parameters are the same bf16 roundings of the
  // master that the host mirror holds. One rank too (a reduce-scatter of one) and weight-decay groups
  // (the shard cut where decay changes).
  expect_bitwise_like_slidedp(System::kFsdp2);
  TrainOptions one = testing::tiny_options(1, 2, 2, 3);
  one.system = System::kFsdp2;
  EXPECT_TRUE(testing::bitwise_equal(train(one), slidedp_reference(one))) << "one rank";
  TrainOptions groups = options(System::kFsdp2, 1, false);
  groups.optimizer.no_decay.norms = groups.optimizer.no_decay.embeddings = true;
  groups.optimizer.weight_decay = 0.1;
  EXPECT_TRUE(testing::bitwise_equal(train(groups), slidedp_reference(groups))) << "no-decay groups";
}

TEST(Systems, Fsdp2UpdatesOnTheDevicesAndNothingCrossesTheLinkDuringSteps) {
  const TrainOptions o = options(System::kFsdp2, 2, false);
  const TrainResult r = train(o);
  const int U = static_cast<int>(o.card.num_layers) + 2;
  for (int step = 0; step < 3; ++step) {
    EXPECT_TRUE(spans(r, "cpu_update", "adamw", step, -1).empty());
    EXPECT_TRUE(spans(r, "cpu_update", "verify+adamw", step, -1).empty());
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(spans(r, "h2d", "params", step, rank).empty());
      EXPECT_TRUE(spans(r, "d2h", "grad shard", step, rank).empty());
      // Every unit updated on the device once per step, after the step's last backward on this rank.
      const double backward_end = last_end(spans(r, "compute", "bwd", step, rank));
      for (int u = 0; u < U; ++u) {
        const auto updates = spans(r, "compute", "adamw", step, rank, u);
        EXPECT_FALSE(updates.empty()) << "rank " << rank << " unit " << u;
        EXPECT_GE(first_start(updates), backward_end) << "rank " << rank << " unit " << u;
      }
      EXPECT_FALSE(spans(r, "fabric", "all-gather", step, rank).empty());
      EXPECT_FALSE(spans(r, "fabric", "reduce-scatter", step, rank).empty());
    }
  }
}

TEST(Systems, UnsupportedAndUnknownSystemsAreRefused) {
  {
    TrainOptions o = options(System::kFsdp2, 1, false);
    o.checkpoint_dir = "/tmp/slidedp_fsdp2_never_written";
    try {
      train(o);
      FAIL() << "fsdp2 with checkpoints";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
    }
  }
  try {
    parse_system("deepspeed", "--system");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("megatrain"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slidedp::exec
