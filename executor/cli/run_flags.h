// slidedp-run's command line: every flag's value with its default, the flags' registration (their
// --help text), and the parts of the trainer's options that follow from the flags alone.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/plan_flags.h"
#include "executor/lr_schedule.h"
#include "executor/trainer.h"

namespace slidedp {

struct RunFlags {
  PlanFlags plan;
  // data and evaluation
  std::string data, eval_data;
  int64_t eval_every = 0;
  std::optional<int32_t> document_end;
  uint64_t data_seed = 1234, init_seed = 42;
  // schedule and optimizer
  int64_t steps = 40, warmup = 0, total_steps = 0;
  double lr = 3e-3, min_lr = 0, weight_decay = 0.01, clip = 0, adam_eps = 1e-8, router_aux_loss_coef = 0;
  std::string schedule = "constant", lr_file, no_decay_on = "none", on_nonfinite = "abort";
  std::vector<double> adam_betas = {0.9, 0.999};
  // what runs where
  std::string backend = "cpu", system = "slidedp", master = "auto", emulate, host_pinned_limit;
  double time_scale = 0;
  int64_t device_budget = 0;
  int update_threads = 0;
  bool exact = false;
  // outputs
  std::string db = "runs/runs.db", trace, save_model, checkpoint_dir, resume;
  int64_t checkpoint_every = 0;
  int keep = 3;
  bool json = false, bench = false, no_db = false, quiet = false, trace_kernels = false;
  // several nodes, signals, testing
  double node_timeout = 300, stop_grace = 120;
  std::string inject_nan;  // STEP:UNIT:RANK

  // Registers every flag with its --help text, in --help's order.
  void add_to(CLI::App& app);

 private:
  void add_training_flags(CLI::App& app);
  void add_execution_flags(CLI::App& app);
  void add_output_flags(CLI::App& app);
};

// The learning-rate schedule: --lr-schedule's file, else the one a resumed checkpoint recorded
// (`resumed_json`, unless a schedule flag was given), else the schedule flags. Its steps count from
// the start of training, so a resumed cosine decays to the end of this run.
exec::LrScheduleConfig lr_schedule_from(const RunFlags& f, const CLI::App& app, int64_t start_step,
                                        const std::string& resumed_json, const std::string& resume_dir);

// The optimizer's settings from the flags (clipping, skipping, AdamW's constants, decay groups).
exec::OptimizerConfig optimizer_from(const RunFlags& f);

// --test-inject-nan STEP:UNIT:RANK into the options (InputError naming the flag when malformed).
void apply_inject_nan(const std::string& spec, exec::TrainOptions& o);

}  // namespace slidedp
