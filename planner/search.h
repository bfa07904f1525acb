// The plan search: branch and bound over a SearchSpace, ranking by the analytical model (kContention)
// and re-scoring the top K with the discrete-event simulator. Nodes are expanded best bound first:
//   level 1  (batch shape, activation mix)          bound: the step's GPU compute (exact lower bound)
//   level 2  (+ routes, depth, threads)             memory checked here; bound: the critical path with
//                                                   the finest chunks and no latencies
//   level 3  (+ chunk)                              bound: the critical path (kCriticalPath)
//   leaf                                            score: the full model (kContention)
// A node whose bound exceeds the K-th best score found so far is not expanded, so the top K equal
// those of exhaustive enumeration (tests/planner/search_test.cc checks it). Infeasible candidates are
// counted per reason, including whole sub-spaces skipped because GPU memory only grows with
// micro-batch, keep layers and depth.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/simulator.h"
#include "model/prediction.h"
#include "planner/search_space.h"

namespace slidedp::planner {

// The step time the planner ranks by: the full model's (kContention), floored at its own critical path
// (the same pipeline without contention). Contention can only slow a pipeline down, but the model
// measures the second of two simulated steps, and on about 1% of plans a slower first step shifts the
// second's start enough that the measured step comes out below the critical path (by up to 1.2% on the
// preset machines; tests/planner/search_test.cc, Search.CriticalPathUndershoot). The floor makes the
// critical path a lower bound of the score by construction, which every bound of the search relies on.
double ranked_step_time_s(const Prediction& full_model);

// Why a candidate cannot run (keys of SearchStats::infeasible).
namespace reason {
inline constexpr const char* kGpuMemory = "gpu_memory";
inline constexpr const char* kHostRam = "host_ram";
inline constexpr const char* kHostPinned = "host_pinned";
inline constexpr const char* kGpuFabric =
    "gpu_fabric";  // a route that needs a GPU fabric on a machine without one
}  // namespace reason

struct Candidate {
  CandidateIndex index;
  Plan plan;
  Prediction predicted;                 // analytical model (kContention) with the memory estimate
  double ranked_step_s = 0;             // ranked_step_time_s(predicted)
  std::optional<Prediction> simulated;  // when re-scored
  double score = 0;                     // objective by the analytical model (lower is better)
  double simulated_score = 0;           // objective by the simulator (0 when not re-scored)
  double final_score() const { return simulated ? simulated_score : score; }
};

struct SearchStats {
  int64_t space_size = 0;
  std::map<std::string, int64_t> infeasible;  // candidates per reason (first violated budget)
  int64_t infeasible_by_monotonicity = 0;     // of those, never estimated: implied by a smaller one
  int64_t pruned = 0;                         // candidates cut off by a bound
  int64_t evaluated = 0;                      // candidates scored with the full model
  int64_t memory_estimates = 0;
  int64_t bound_evaluations = 0;  // critical-path runs (relaxed and per candidate)
  int64_t simulations = 0;
  // Candidates the simulator could not hold (SimulationTooLarge): they keep their analytical score.
  int64_t simulations_too_large = 0;
  int64_t nodes_expanded = 0;
  // A candidate scored below the key of its own node: the search may have cut a better plan. Zero
  // unless the model loses a property the search relies on; the report prints it when not zero.
  int64_t bound_violations = 0;
  // A candidate's critical path below the relaxed critical path of a node above it: one of the
  // relaxations (finest chunk, no latency, deepest buffer, fastest threads) is not one.
  int64_t relaxation_violations = 0;
  double search_s = 0;   // wall time of the search (analytical)
  double rescore_s = 0;  // wall time of the simulator re-scoring (one thread per candidate, up to the cores)
  int64_t infeasible_total() const;
};

struct SearchOptions {
  int top_k = 5;
  // false: the K best plans (they often differ only in chunk size, depth or threads, which shows how
  // flat the optimum is). true: the best plans of K different families (batch shape, routes,
  // activation mix), each with its own best chunk, depth and threads -- more informative, but proving
  // each family's best costs more evaluations (several times more for large accumulation counts).
  bool distinct_families = false;
  bool rescore_with_simulator = true;
  // The simulator's graph limit for the re-scoring, shared by the simulations that run at once.
  std::int64_t max_simulated_tasks = kMaxSimulatedTasks;
  bool exhaustive = false;  // score every feasible candidate (for checks; slow on large spaces)
};

struct SearchResult {
  SearchSpace space;
  std::vector<Candidate> top;  // best first: by the simulator when re-scored, else by the model
  SearchStats stats;
  // Per infeasibility reason, the violation of the candidate that came closest to fitting.
  std::map<std::string, std::string> closest_miss;
  // With lossy states allowed: which moments the winner holds and why (explain_choice prints it).
  std::string optimizer_states_reason;
  const Candidate& best() const { return top.front(); }
};

// Searches the space. Throws InfeasibleError when no candidate fits, naming each failed budget, how
// many candidates it excluded and by how much the closest one missed it.
SearchResult search_plans(const Workload& w, const Hardware& hw, const SearchSpec& spec,
                          const SearchOptions& options = {});
// bf16 moments are lossy: with them allowed, the planner takes them only for at least this much
// less time per token than the best plan with fp32 moments (or when none of those fits).
constexpr double kLossyStatesMinGain = 0.02;
SearchResult search_space(const Workload& w, const Hardware& hw, const SearchSpace& space,
                          const SearchOptions& options = {});

// Total order of candidates by the model: score, then less GPU memory (more headroom), then index.
bool model_order(const Candidate& a, const Candidate& b);

}  // namespace slidedp::planner
