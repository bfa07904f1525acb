// What a sweep's rows say, as numbers: SlideDP's geometric-mean speedup over each baseline per group
// of matched points, the longest sequence each system fits, weak and strong scaling efficiency, and the
// value of each paper claim the spec names. Pure functions of the rows (no I/O), so tests can check
// them on hand-made rows; sweep_report.h turns them into tables and plots.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sweeps/sweep_runner.h"

namespace slidedp {

// A "case" is one point of the grid without the system: the systems of a case are compared.
struct CaseKey {
  int grid = 0, hardware = 0, model = 0;
  int64_t seq_len = 0;
  int ranks = 0;
  int64_t batch_value = 0;
  auto operator<=>(const CaseKey&) const = default;
};
CaseKey case_key(const SweepPoint& p);
using CaseMap = std::map<CaseKey, std::map<System, const SweepRow*>>;
CaseMap index_cases(const std::vector<SweepRow>& rows);

// SlideDP's throughput over a baseline's, geometric mean over the cases where both fit.
struct SpeedupStat {
  std::string hardware, model;  // the group ("" in totals over several)
  int64_t seq_len = 0;
  int ranks = 0;
  std::string baseline;
  double geomean = 0, min = 0, max = 0;  // 0 when no case has both
  int points = 0;                        // cases where both fit
  int baseline_infeasible = 0;           // cases where SlideDP fits and the baseline does not
  int slidedp_infeasible = 0;            // cases where SlideDP does not fit
};
// Which figure a ratio is taken of: the scored one (the simulator's when the sweep re-scored), or the
// analytical model's (to show how much the re-scoring changes a conclusion).
enum class Figure { kScored, kAnalytical };
// One entry per (grid, hardware, model, seq_len, ranks) group and baseline, in sweep order.
std::vector<SpeedupStat> speedup_stats(const std::vector<SweepRow>& rows, Figure figure = Figure::kScored);
// One entry per baseline over every row matching the filters ("" = any).
std::vector<SpeedupStat> speedup_totals(const std::vector<SweepRow>& rows, const std::string& hardware,
                                        const std::string& model, Figure figure = Figure::kScored);

// The longest swept sequence a system fits, per (grid, hardware, model, ranks, batch) and system.
struct LongestFit {
  std::string hardware, model, system;
  int ranks = 0;
  int64_t batch_value = 0;
  int64_t longest_seq = 0;  // 0 when no swept length fits
  double tokens_per_s = 0;  // at longest_seq
  std::string plan;
  int64_t first_failing_seq = 0;  // the next swept length, which does not fit (0: none failed above)
  std::string why;                // its reason
};
std::vector<LongestFit> longest_fits(const std::vector<SweepRow>& rows);

// Where streaming stops being exposed: per (grid, hardware, ranks, model, seq_len), SlideDP's points
// in tokens-per-step order and the smallest swept size from which every larger swept point is bound
// by GPU compute.
struct ComputeBound {
  std::string grid, hardware, model;
  int ranks = 0;
  int64_t seq_len = 0;
  int64_t from_tokens = 0;        // 0: no swept size is (the largest point is bound elsewhere)
  double tokens_per_s_from = 0;   // at from_tokens
  int64_t below_tokens = 0;       // the largest swept size below from_tokens (0: none)
  std::string below_binding;      // what binds there (or at the largest point when from_tokens is 0)
  double below_exposed_share = 0; // its step time not covered by GPU compute
  int64_t smallest_tokens = 0;    // the smallest feasible point, its throughput and what binds it
  double smallest_tokens_per_s = 0;
  std::string smallest_binding;
};
std::vector<ComputeBound> compute_bound_thresholds(const std::vector<SweepRow>& rows);

// Throughput against ranks: speedup and efficiency relative to the smallest rank count swept.
// Weak scaling (sequences_per_rank grids): the step grows with ranks; strong (tokens_per_step): fixed.
struct ScalingPoint {
  std::string hardware, model, system;
  int64_t seq_len = 0;
  bool weak = false;
  int64_t batch_value = 0;
  int ranks = 0;       // GPUs: nodes x ranks per node
  int base_ranks = 0;
  int nodes = 1;
  std::string host_state;  // the chosen plan's ("" when infeasible)
  double host_gib = 0;     // its host RAM per node
  double tokens_per_s = 0;
  double speedup = 0;     // tokens_per_s / base's
  double efficiency = 0;  // speedup x base_ranks / ranks
  std::string bottleneck;
};
std::vector<ScalingPoint> scaling_points(const SweepResult& result);

// A paper claim next to this sweep's value of its metric, in words.
struct ClaimResult {
  PaperClaim claim;
  std::string model;         // "slideformer-dp 5.12x, megatrain 1.31x, ... (range 1.25-5.12x over 18 points)"
  double low = 0, high = 0;  // the metric's range as numbers (ratios, fractions or tokens), for tests
};
std::vector<ClaimResult> evaluate_claims(const SweepResult& result);

// "64K", "1M", "3000": tokens in binary K/M when exact.
std::string format_tokens(int64_t tokens);
// Geometric mean of positive values (0 for none).
double geometric_mean(const std::vector<double>& v);

}  // namespace slidedp
