// Refinement with measurements (--refine K): runs the search's top K plans for a few steps with the
// executor on this machine's CPU backend, logs each run to the run database under one parent 'refine'
// run, picks the measured best and reports how the measured order compares with the predicted one
// (Kendall's tau-b). The CPU backend emulates the plan's devices with host threads and host memory.
// On a profile of this machine (emulated devices, e.g. cpu-dev) the runs are measured as they are; on
// a profile of real GPUs they are paced at its ratios (executor/target_pacing.h, each plan at its own
// measured time scale) and their step times divided by the scale, so the candidates are compared in
// that machine's seconds. Either way the model must fit this machine's RAM: small models only;
// big-model plans are refused with the numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/hardware.h"
#include "model/workload.h"
#include "planner/search.h"

namespace slidedp::planner {

struct RefineOptions {
  int candidates = 3;        // the first K of the search's final order
  int64_t steps = 8;         // optimizer steps per candidate and round
  int64_t warmup_steps = 2;  // of each run, not measured (allocation, first-touch, thread start-up)
  // Each round runs every candidate once, in the opposite order of the previous round (1..K, K..1, ...),
  // so a machine that warms up or slows down during the refinement favors no candidate.
  int rounds = 2;
  std::string db_path;       // run log; "" = none
  std::string command_line;  // recorded in the run log
  std::string model_name;    // as given on the command line (recorded)
  std::string data_path;     // token file; "" = the embedded default corpus
  uint64_t data_seed = 1234;
  // A candidate runs only if its host memory plus every emulated device's peak fits in this share
  // of this machine's physical RAM (the rest is the OS, the page cache and other processes).
  double host_ram_fraction = 0.75;
  // Paced runs (hardware of real GPUs): seconds here per second of the target; <= 0: measured per plan.
  double time_scale = 0;
  std::function<void(const std::string&)> on_progress;  // one line per finished candidate
};

struct RefinedRun {
  int predicted_rank = 0;  // 1-based position in the search's final order
  Plan plan;
  double predicted_step_s = 0;  // the step time the final order used (simulator when re-scored)
  double predicted_score = 0;
  std::vector<double> step_wall_s;  // every step of every round, warm-up included (the target's seconds when paced)
  double time_scale = 1;            // paced runs: the scale they ran at
  double measured_step_s = 0;       // median of the measured steps of all rounds
  double measured_tokens_per_s = 0;
  double measured_score = 0;
  std::vector<int64_t> run_ids;  // one per round (empty without a run log)
  std::string failed;            // why it did not run ("" = it ran)
};

struct RefineResult {
  std::vector<RefinedRun> runs;                                   // in predicted order
  int chosen = -1;                                                // index into runs: the measured best
  double kendall_tau = std::numeric_limits<double>::quiet_NaN();  // predicted vs measured (runs that ran)
  int64_t parent_run_id = -1;
  std::string db_path;
  // Measured tokens/s of the chosen plan over the best measured: 1 by construction (it is the best).
  double chosen_over_best_tokens_per_s = 0;
  const RefinedRun& chosen_run() const { return runs.at(static_cast<std::size_t>(chosen)); }
};

// Throws InfeasibleError when no candidate fits this machine's RAM (the message gives both sizes).
RefineResult refine_plans(const Workload& w, const Hardware& hw, const SearchResult& search,
                          const RefineOptions& o);

// Kendall's tau-b of two equally long samples (ties handled); NaN for fewer than two pairs that differ.
double kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y);

std::string render_refine(const RefineResult& r, int num_layers);
nlohmann::json refine_to_json(const RefineResult& r, int num_layers);

}  // namespace slidedp::planner
