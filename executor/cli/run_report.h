// What slidedp-run prints when training is over: the --json summary, or the human report (the
// --bench table, the largest kernels, steady-state rate, memory, where the outputs went).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/table.h"
#include "executor/cli/run_flags.h"
#include "executor/trainer.h"
#include "model/plan.h"

namespace slidedp {

// A finished run as the report sees it.
struct RunOutcome {
  const RunFlags& flags;
  const exec::TrainOptions& options;
  const Plan& run_plan;  // the plan as the system overrides it
  const exec::TrainResult& result;
  std::optional<double> predicted_step_s;  // the model's step time, times the pacing scale
  double time_scale = 1;                   // 1 unless --emulate
  int64_t run_id = -1;                     // -1: no run log
};

// --bench: one row per step of each resource's busy time, the exposed time and the rate.
Table bench_table();
void add_bench_row(Table& table, const exec::TrainStep& s);

void print_json_report(const RunOutcome& run);
void print_human_report(const RunOutcome& run, const Table& bench);

}  // namespace slidedp
