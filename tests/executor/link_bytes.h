// The host-link bytes of a run two ways, for the tests that hold them equal: what the step model
// charges one rank per step (the recurrence's totals, one step, no jumps) and what a run's traced
// copies report (MeasuredSpan::bytes of the copies the model charges, by their tags).
#pragma once

#include <utility>

#include "executor/trainer.h"
#include "model/copy_bytes.h"
#include "model/step_recurrence.h"
#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp::exec::testing {

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

}  // namespace slidedp::exec::testing
