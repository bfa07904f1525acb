// The step model's jump over the periodic regime of identical layers (model/regime_jump.h)
// against the recurrence run through every layer: on random plans of every system, preset machine
// and activation layout, both fidelities must give the same step time, critical path and breakdown
// up to rounding, and the jumps must actually happen (else the comparison proves nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/error.h"
#include "model/hardware.h"
#include "model/step_model.h"
#include "model/step_work.h"
#include "tests/model/random_plan.h"

namespace slidedp {
namespace {


// Same up to rounding: relative 1e-9 of the step (the jumps extrapolate sums of ~100 terms).
void expect_same(double jumped, double full, double scale, const std::string& what, const std::string& where) {
  EXPECT_NEAR(jumped, full, 1e-9 * scale) << what << " | " << where;
}

// Every figure of a prediction with jumps (a) against the one without (b).
void expect_same_prediction(const Prediction& a, const Prediction& b, const std::string& where) {
  const double T = b.step_time_s;
  expect_same(a.step_time_s, b.step_time_s, T, "step", where);
  expect_same(a.critical_path_s, b.critical_path_s, T, "critical path", where);
  expect_same(a.breakdown.compute_s, b.breakdown.compute_s, T, "compute", where);
  expect_same(a.breakdown.stall_s, b.breakdown.stall_s, T, "stall", where);
  expect_same(a.breakdown.sync_s, b.breakdown.sync_s, T, "sync", where);
  expect_same(a.breakdown.exposed_head_s, b.breakdown.exposed_head_s, T, "head", where);
  expect_same(a.breakdown.exposed_tail_s, b.breakdown.exposed_tail_s, T, "tail", where);
  for (const auto& [res, busy] : b.busy_s) expect_same(a.busy_s.at(res), busy, T, "busy " + res, where);
  EXPECT_EQ(a.bottleneck, b.bottleneck) << where;
}

TEST(RegimeJump, MatchesTheFullRecurrenceOnRandomPlans) {
  std::mt19937_64 rng(20261130);
  const std::vector<std::string> models = {"llama-3.2-1b", "qwen2.5-7b", "qwen3-14b", "qwen2.5-72b", "llama-3.1-70b"};
  const std::vector<System> systems = {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload,
                                       System::kMegaTrain, System::kFsdp2};
  RecurrenceCounters total;
  long full_visits = 0;
  int compared = 0;
  for (int i = 0; i < 300; ++i) {
    const auto& names = hardware_preset_names();
    const std::string hwname = names[std::uniform_int_distribution<std::size_t>(0, names.size() - 1)(rng)];
    const Hardware hw = hardware_preset(hwname);
    const std::string& mname = models[std::uniform_int_distribution<std::size_t>(0, models.size() - 1)(rng)];
    const Workload w = make_workload(model_preset(mname), int64_t{1024} << std::uniform_int_distribution<int>(0, 3)(rng));
    const Plan plan = random_plan(rng, hw, w.model, RandomPlanRanges{3, 1, 4});
    const System system = i < 200 ? System::kSlideDP : systems[static_cast<std::size_t>(i) % systems.size()];
    StepWork sw;
    try {
      sw = build_step_work(w, hw, plan, system);
    } catch (const InputError&) {
      continue;  // e.g. more ranks than the system supports
    }
    for (ModelFidelity f : {ModelFidelity::kCriticalPath, ModelFidelity::kContention}) {
      RecurrenceCounters jc, fc;
      const Prediction a = evaluate_step_work(sw, f, true, &jc);
      const Prediction b = evaluate_step_work(sw, f, false, &fc);
      const std::string where = hwname + " " + mname + " " + system_name(system) + " seq " + std::to_string(w.seq_len) +
                                " | " + plan.summary(static_cast<int>(w.model.num_layers));
      expect_same_prediction(a, b, where);
      EXPECT_EQ(fc.jumps, 0);
      total += jc;
      full_visits += fc.unit_visits;
      ++compared;
    }
  }
  ASSERT_GE(compared, 400);
  // The jumps happen and pay: the plans above (2 to 80 layers) run in well under half the units.
  EXPECT_GT(total.jumps, compared);
  EXPECT_LT(2 * total.unit_visits, full_visits);
  std::printf("%d evaluations: %ld unit visits with jumps (%ld jumps over %ld layers), %ld without\n", compared,
              total.unit_visits, total.jumps, total.layers_jumped, full_visits);
}


// The jump over the middle micro-steps of a long accumulation (step_recurrence.cc, MicroStepJump)
// against the recurrence run through every micro-step and layer, on random plans of every system
// with 6 to 400 micro-steps. The critical path (and the pass without latencies) is a max-plus map:
// the jump is exact up to rounding, 1e-9 of the step as above. At contention fidelity a jumped pair
// of phases shares one factor per phase (contention.h), the steady one; held to the same bound.
TEST(MicroStepJump, MatchesTheFullRecurrenceOnRandomPlans) {
  std::mt19937_64 rng(20261202);
  const std::vector<std::string> models = {"llama-3.2-1b", "qwen2.5-7b", "qwen3-14b", "qwen2.5-72b", "gemma-4-26b-a4b",
                                           "qwen3.6-27b"};
  const std::vector<System> systems = {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload,
                                       System::kMegaTrain, System::kFsdp2};
  RecurrenceCounters total;
  long full_visits = 0;
  int compared = 0;
  double worst_contended = 0;
  std::string worst_where;
  int across_nodes = 0;
  for (int i = 0; i < 200; ++i) {
    const auto& names = hardware_preset_names();
    const std::string hwname = names[std::uniform_int_distribution<std::size_t>(0, names.size() - 1)(rng)];
    Hardware hw = hardware_preset(hwname);
    const std::string& mname = models[std::uniform_int_distribution<std::size_t>(0, models.size() - 1)(rng)];
    const Workload w = make_workload(model_preset(mname), int64_t{1024} << std::uniform_int_distribution<int>(0, 3)(rng));
    Plan plan = random_plan(rng, hw, w.model, RandomPlanRanges{3, 1, 4});
    plan.accum_steps = static_cast<int>(std::lround(std::exp(std::uniform_real_distribution<double>(std::log(6), std::log(400))(rng))));
    const System system = i < 120 ? System::kSlideDP : systems[static_cast<std::size_t>(i) % systems.size()];
    // A third of SlideDP's plans span 2-4 nodes (the network's queue and the exchanges of every
    // micro-step are part of the jumped state).
    if (system == System::kSlideDP && i % 3 == 0) {
      if (hw.network.nic_gbps <= 0) hw.network = {25.0, 5e-6};  // what-if: 2x 100 GbE
      plan.nodes = 2 + i % 3;
      plan.host_state = i % 2 ? HostState::kSharded : HostState::kReplicated;
      if (plan.host_state == HostState::kSharded) plan.verify_updates = false;
    }
    StepWork sw;
    try {
      sw = build_step_work(w, hw, plan, system);
    } catch (const InputError&) {
      continue;
    }
    if (sw.cap.nodes > 1) ++across_nodes;
    const std::string where = hwname + " " + mname + " " + system_name(system) + " seq " + std::to_string(w.seq_len) +
                              " | " + plan.summary(static_cast<int>(w.model.num_layers));
    RecurrenceCounters jc, fc;
    const Prediction a = evaluate_step_work(sw, ModelFidelity::kContention, true, &jc);
    const Prediction b = evaluate_step_work(sw, ModelFidelity::kContention, false, &fc);
    // The contended step: one factor per jumped phase is the full model's wherever the CPU's carry
    // into the jumped micro-steps is steady, which it is on all of these plans (worst 3e-12).
    expect_same_prediction(a, b, where);
    const double dev = std::fabs(a.step_time_s - b.step_time_s) / b.step_time_s;
    if (dev > worst_contended) worst_contended = dev, worst_where = where;
    EXPECT_EQ(fc.micro_jumps, 0);
    total += jc;
    full_visits += fc.unit_visits;
    ++compared;
  }
  ASSERT_GE(compared, 150);
  EXPECT_GE(across_nodes, 20);
  EXPECT_GT(total.micro_jumps, compared);
  std::printf("%d evaluations (%d across nodes): %ld micro-step jumps over %ld micro-steps; %ld unit visits with jumps, %ld without; "
              "worst contended step deviation %.3g (%s)\n",
              compared, across_nodes, total.micro_jumps, total.micro_steps_jumped, total.unit_visits, full_visits, worst_contended,
              worst_where.c_str());
}

}  // namespace
}  // namespace slidedp
