// A trained step as the run log records it: what slidedp-run and the planner's --refine runs write.
#pragma once

#include <optional>

#include "executor/trainer.h"
#include "runlog/run_log.h"

namespace slidedp::exec {

// `predicted_step_s`: the model's step time on this machine (times the pacing scale), if any.
inline runlog::StepRecord step_record(const TrainStep& s, std::optional<double> predicted_step_s) {
  runlog::StepRecord r;
  r.step = s.step;
  r.loss = s.loss;
  r.tokens = s.tokens;
  r.wall_s = s.wall_s;
  if (predicted_step_s) r.predicted_step_s = *predicted_step_s;
  r.lr = s.lr;
  if (s.grad_norm >= 0) r.grad_norm = s.grad_norm;
  r.skipped = s.skipped;
  r.skip_reason = s.skipped_reason;
  return r;
}

}  // namespace slidedp::exec
