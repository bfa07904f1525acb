// The host-link bytes of a run two ways, for the tests that hold them equal: what the step model
// charges one rank per step (the recurrence's totals, one step, no jumps) and what a run's traced
// copies report (MeasuredSpan::bytes of the copies the model charges, by their tags).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "executor/trainer.h"
#include "model/copy_bytes.h"
#include "model/step_recurrence.h"
#include "model/step_work.h"
#include "model/workload.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec::testing {

// One plan feature set of the copy-bytes tests.
struct Case {
  std::string name;
  System system = System::kSlideDP;
  ParamRoute param_route = ParamRoute::kReplicated;
  GradRoute grad_route = GradRoute::kCpu;
  bool offload = false;
  bool every_unit_resident = false;  // buffer depth = units: nothing is delivered twice in a step
  int ranks = 2;
};

// Two steps of two micro-steps of `card` under `c`, traced: the copies' spans carry their bytes.
inline TrainOptions case_options(const ModelCard& card, const Case& c) {
  TrainOptions o = tiny_options(c.ranks, 2, 2, 2);
  o.card = card;
  o.system = c.system;
  o.plan.param_route = c.param_route;
  o.plan.grad_route = c.grad_route;
  if (c.offload) {
    o.plan.per_layer.assign(static_cast<std::size_t>(card.num_layers), ActivationPolicy::kOffload);
    o.plan.offload_layers = static_cast<int>(card.num_layers);
  }
  if (c.every_unit_resident) o.plan.gpu_buffer_depth = static_cast<int>(card.num_layers) + 2;
  o.trace = true;
  return o;
}

struct LinkBytes {
  double h2d = 0, d2h = 0;
};

// `target`: whose hardware the model's StepWork is built for (the bytes do not depend on its rates).
inline LinkBytes model_link_bytes_per_step(const TrainOptions& o, const Hardware& target) {
  const Plan plan = plan_for_system(o.plan, o.system, o.card);
  const StepWork sw = build_step_work(make_workload(o.card, o.seq_len), target, plan, o.system);
  RecurrenceCounters counters;
  const Passes p = run_passes(sw, ModelFidelity::kCriticalPath, /*jump=*/false, counters);
  return {p.critical.h2d_bytes, p.critical.d2h_bytes};
}

// The bytes a baseline's executor moves beyond the model's, per step and rank: its gradient sum stays
// exact (fp32, summed on the host), so where DeepSpeed's sum between micro-steps leaves the GPU in 16
// bits (ZeRO-Offload's accumulation, ZeRO-3's round trip: on every micro-step but the last), the
// executor's copy is its fp32 shard on the gpu route, twice the model's bytes for those copies. On
// the cpu route (one rank) the executor's copy is the bf16 gradient: none.
inline LinkBytes exact_sum_surplus_per_step(const TrainOptions& o, const Hardware& target) {
  const Plan plan = plan_for_system(o.plan, o.system, o.card);
  if (plan.grad_shards() <= 1) return {};
  const StepWork sw = build_step_work(make_workload(o.card, o.seq_len), target, plan, o.system);
  double sum_out = 0;
  for (const UnitWork& u : sw.units) sum_out += u.accum_out_d2h_bytes + u.trip_out_d2h_bytes;
  return {0.0, sum_out * (plan.accum_steps - 1)};
}

// Over the whole run (training steps, not evaluations), one rank; token ids and the loss, which the
// model does not charge, left out.
inline LinkBytes span_link_bytes(const TrainResult& r, int rank) {
  LinkBytes b;
  for (const MeasuredSpan& s : r.spans) {
    if (s.rank != rank || s.tag.eval || !copy_kind_of(s.tag.what)) continue;
    const std::string_view category = s.tag.category;
    if (category == "h2d") b.h2d += s.bytes;
    if (category == "d2h") b.d2h += s.bytes;
  }
  return b;
}

// Each rank's copies in `r` (a run of `o`), per step, carry the model's bytes per step: sums of a
// few hundred copies of whole elements, equal up to the summation's rounding.
inline void expect_span_bytes_are_the_models(const TrainResult& r, const TrainOptions& o,
                                             const LinkBytes& model) {
  const double steps = static_cast<double>(o.steps);
  for (int rank = 0; rank < o.plan.ranks; ++rank) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const LinkBytes copied = span_link_bytes(r, rank);
    EXPECT_NEAR(copied.h2d / steps, model.h2d, 1e-9 * model.h2d + 1e-6);
    EXPECT_NEAR(copied.d2h / steps, model.d2h, 1e-9 * model.d2h + 1e-6);
  }
}

}  // namespace slidedp::exec::testing
