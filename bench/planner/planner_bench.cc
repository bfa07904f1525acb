// Speed of slidedp-plan's search: a full search for Qwen2.5-72B (80 layers) on 4 and 8 GPUs, for a
// matched batch of 256k and 1M tokens per step and for maximum throughput (up to 1M tokens per step),
// listing the 5 best plans (the default) or the best of 5 families (--list families).
// Target (issue 9): under 1 second on one core for the analytical search. The simulator re-scoring of
// the top 5 is measured separately (the *_with_simulator cases); it runs one thread per candidate.
// Counters: candidates in the space, scored with the full model, critical-path bounds, pruned.
// Run pinned to one core: taskset -c 0 ./build/bin/bench_planner (results/planner/README.md).
#include <benchmark/benchmark.h>

#include "planner/search.h"

namespace slidedp::planner {
namespace {

SearchSpec spec_for(int ranks, Objective goal, int64_t tokens) {
  SearchSpec s;
  s.ranks = ranks;
  s.objective = goal;
  if (goal == Objective::kMatchedBatch)
    s.global_batch_tokens = tokens;
  else
    s.max_global_batch_tokens = tokens;
  return s;
}

enum Listing { kPlans, kFamilies };

void BM_Search(benchmark::State& state, const char* hw_name, int ranks, Objective goal, int64_t tokens,
               Listing listing, bool simulator) {
  const Workload w = make_workload(model_preset("qwen2.5-72b"), 4096);
  const Hardware hw = hardware_preset(hw_name);
  const SearchSpec spec = spec_for(ranks, goal, tokens);
  SearchOptions o;
  o.rescore_with_simulator = simulator;
  o.distinct_families = listing == kFamilies;
  SearchStats stats;
  for (auto _ : state) {
    SearchResult r = search_plans(w, hw, spec, o);
    stats = r.stats;
    benchmark::DoNotOptimize(r.top.front().score);
  }
  state.counters["space"] = static_cast<double>(stats.space_size);
  state.counters["scored"] = static_cast<double>(stats.evaluated);
  state.counters["bounds"] = static_cast<double>(stats.bound_evaluations);
  state.counters["pruned"] = static_cast<double>(stats.pruned);
  state.counters["infeasible"] = static_cast<double>(stats.infeasible_total());
  if (simulator) state.counters["rescore_s"] = stats.rescore_s;
}

constexpr int64_t k256k = int64_t{1} << 18, k1M = int64_t{1} << 20;
constexpr Objective kMatched = Objective::kMatchedBatch, kThroughput = Objective::kMaxThroughput;
#define SEARCH(name, hw, ranks, goal, tokens, listing) \
  BENCHMARK_CAPTURE(BM_Search, name, hw, ranks, goal, tokens, listing, false)->Unit(benchmark::kMillisecond)
SEARCH(x4_matched_256k, "h100-sxm-x4", 4, kMatched, k256k, kPlans);
SEARCH(x8_matched_256k, "h100-sxm-x8", 8, kMatched, k256k, kPlans);
SEARCH(x4_matched_1M, "h100-sxm-x4", 4, kMatched, k1M, kPlans);
SEARCH(x8_matched_1M, "h100-sxm-x8", 8, kMatched, k1M, kPlans);
SEARCH(x4_throughput_1M, "h100-sxm-x4", 4, kThroughput, k1M, kPlans);
SEARCH(x8_throughput_1M, "h100-sxm-x8", 8, kThroughput, k1M, kPlans);
// --list families: the best plan of 5 different (batch shape, routes, activation mix) families.
SEARCH(x4_matched_256k_families, "h100-sxm-x4", 4, kMatched, k256k, kFamilies);
SEARCH(x8_matched_256k_families, "h100-sxm-x8", 8, kMatched, k256k, kFamilies);
SEARCH(x4_matched_1M_families, "h100-sxm-x4", 4, kMatched, k1M, kFamilies);
SEARCH(x8_matched_1M_families, "h100-sxm-x8", 8, kMatched, k1M, kFamilies);
SEARCH(x4_throughput_1M_families, "h100-sxm-x4", 4, kThroughput, k1M, kFamilies);
SEARCH(x8_throughput_1M_families, "h100-sxm-x8", 8, kThroughput, k1M, kFamilies);
#undef SEARCH
// The whole of slidedp-plan's default: search plus the simulator re-scoring of the top 5.
BENCHMARK_CAPTURE(BM_Search, x4_matched_256k_with_simulator, "h100-sxm-x4", 4, kMatched, k256k, kPlans, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_Search, x8_matched_256k_with_simulator, "h100-sxm-x8", 8, kMatched, k256k, kPlans, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
}  // namespace slidedp::planner

BENCHMARK_MAIN();
