// The planner's search space: what it may choose (routes, chunk size, activation policy mix, batch
// shape, buffer depth, update threads), for which goal (matched batch, maximum throughput, minimum time
// to a token budget), under which budgets. A SearchSpec is what a user or a sweep asks for; a
// SearchSpace is that request resolved against one workload and machine into one sorted value list per
// dimension, so the search and exhaustive enumeration walk exactly the same candidates.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/hardware.h"
#include "model/plan.h"
#include "model/workload.h"

namespace slidedp::planner {

enum class Objective {
  kMatchedBatch,     // tokens per step fixed (the paper's comparisons): minimize the step time
  kMaxThroughput,    // free batch: maximize tokens/s, i.e. minimize seconds per token
  kMinTimeToTokens,  // free batch: minimize ceil(budget / tokens per step) x step time
};
const char* objective_name(Objective o);  // "matched-batch" | "max-throughput" | "time-to-tokens"

// Sequences per rank per micro-step x micro-steps per optimizer step.
struct BatchShape {
  int micro_batch = 1;
  int accum_steps = 1;
  bool operator==(const BatchShape&) const = default;
};

// Activation policy counts over decoder layers in the plan's order: the first `offload` layers offload
// their input, the last `keep` keep everything, the ones between recompute.
struct ActivationMix {
  int offload = 0;
  int keep = 0;
  bool operator==(const ActivationMix&) const = default;
};

struct SearchSpec {
  int nodes = 1;  // several nodes: each plan's host state is searched too (host_states)
  std::vector<HostState> host_states;  // empty: both placements when nodes > 1
  // AdamW's moments: fp32, unless lossy states are allowed (--allow-lossy-states): then bf16 is
  // searched too and chosen where fp32 does not fit or bf16 is at least kLossyStatesMinGain faster.
  bool allow_lossy_states = false;
  OptimizerStates optimizer_states = OptimizerStates::kFp32;  // the one searched (search_plans sets it)
  // The run clips or skips (Plan::verify_updates): every plan is scored with the update after the
  // backward.
  bool verify_updates = false;
  int ranks = 1;  // per node
  Objective objective = Objective::kMatchedBatch;
  int64_t global_batch_tokens = 0;                     // kMatchedBatch: ranks x micro x accum x seq_len
  int64_t token_budget_tokens = 0;                     // kMinTimeToTokens
  int64_t max_global_batch_tokens = int64_t{1} << 20;  // free batch: the largest step considered
  int max_micro_batch = 0;                             // 0: no limit (memory decides)
  int max_accum_steps = 0;                             // 0: no limit
  int64_t gpu_mem_budget_bytes = 0;                    // 0: the GPU's memory minus the reserve
  int64_t gpu_mem_reserve_bytes = int64_t{512} << 20;  // allocator slack, fragmentation (model/plan.h)
  int64_t loss_chunk_tokens = 4096;
  // MLP token tiles (Plan::mlp_token_tile), tried in this order, each only when no plan fits with
  // the ones before (a tile never speeds a step up: it trades the gate/up GEMMs once more in
  // backward for memory). Empty: kDefaultMlpTokenTiles.
  std::vector<int64_t> mlp_token_tiles;
  // Restrictions of single dimensions (empty: the default grid). Sweeps pin dimensions with these;
  // tests use them to make spaces small enough to enumerate.
  std::vector<ParamRoute> param_routes;
  std::vector<GradRoute> grad_routes;
  std::vector<int64_t> chunk_numels;
  std::vector<int> buffer_depths;
  std::vector<int> update_threads;  // thread counts; 0 = all free cores
  std::vector<int> layer_counts;    // activation grid: allowed offload and keep counts
  std::vector<BatchShape> batch_shapes;
};

// Where a candidate sits in the space: one index per dimension.
struct CandidateIndex {
  int shape = 0, mix = 0, route = 0, depth = 0, thread = 0, chunk = 0;
  auto operator<=>(const CandidateIndex&) const = default;
};

struct SearchSpace {
  std::vector<BatchShape> shapes;    // micro-batch ascending
  std::vector<ActivationMix> mixes;  // offload, then keep, ascending
  std::vector<std::pair<ParamRoute, GradRoute>> routes;
  std::vector<int64_t> chunks;  // ascending
  std::vector<int> depths;      // ascending
  std::vector<int> threads;     // resolved thread counts, descending
  int free_threads = 1;         // what update_threads = 0 resolves to (written to the plan as 0)
  int num_layers = 0;
  int nodes = 1;
  HostState host_state = HostState::kReplicated;
  OptimizerStates optimizer_states = OptimizerStates::kFp32;
  bool verify_updates = false;
  int ranks = 1;
  Objective objective = Objective::kMatchedBatch;
  int64_t seq_len = 0;
  int64_t token_budget_tokens = 0;
  int64_t gpu_mem_budget_bytes = 0;
  int64_t gpu_mem_reserve_bytes = 0;
  int64_t loss_chunk_tokens = 4096;
  int64_t mlp_token_tile = 0;  // every plan of this space; search_plans picks it (SearchSpec)
  std::vector<std::string> notes;  // how the grids were chosen, for the report

  // Candidates below one node of each level (used to count what a bound or a budget cut off).
  int64_t per_shape_mix() const;  // routes x depths x threads x chunks
  int64_t size() const;
  // The plan at an index: counts written as offload k, recompute j, keep rest.
  Plan plan(const CandidateIndex& i) const;
  // The objective value of a step (lower is better): seconds, seconds per token, or seconds to the
  // token budget.
  double score(double step_time_s, const BatchShape& shape) const;
  double score_factor(const BatchShape& shape) const;
  int64_t tokens_per_step(const BatchShape& shape) const;
};

// Resolves a spec against a workload and machine. Throws InputError naming the flag when the request
// cannot describe any plan (a global batch that is not a multiple of ranks x seq_len, more ranks than
// GPUs, an empty dimension after restrictions).
SearchSpace make_search_space(const Workload& w, const Hardware& hw, const SearchSpec& spec);

// 0 (untiled) first, then 16384 and 4096 token rows per MLP tile.
inline const std::vector<int64_t> kDefaultMlpTokenTiles = {0, 16384, 4096};

// The default grids, exposed for tests and docs.
std::vector<int> default_layer_counts(int num_layers);
std::vector<int64_t> default_chunk_numels(const ModelLayout& layout);

}  // namespace slidedp::planner
