// The search against exhaustive enumeration on spaces small enough to enumerate: the same top K in
// the same order, every candidate accounted for (scored + pruned + infeasible = space), no bound
// violated; the chosen plans respect every budget; a tighter GPU budget never yields a plan that
// uses more GPU memory; no feasible plan is an InfeasibleError that names the budget and the miss.
#include "planner/search.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <random>

#include "common/error.h"
#include "model/memory_model.h"
#include "model/step_model.h"

namespace slidedp::planner {
namespace {

struct SearchCase {
  std::string name;
  std::string model;
  std::string hardware;
  int64_t seq = 0;
  SearchSpec spec;
  int top_k = 3;
  bool no_fabric = false;
};

void PrintTo(const SearchCase& c, std::ostream* os) { *os << c.name; }

std::vector<SearchCase> cases() {
  std::vector<SearchCase> out;
  {
    SearchCase c{"tiny_cpudev_matched", "slidedp-tiny", "cpu-dev", 128, {}, 3};
    c.spec.ranks = 2;
    c.spec.global_batch_tokens = 2 * 128 * 4;
    out.push_back(c);
  }
  {
    // Memory binds: a 12 GiB budget for a 1B model at 8k tokens per rank.
    SearchCase c{"llama1b_h100x4_tight", "llama-3.2-1b", "h100-sxm-x4", 2048, {}, 4};
    c.spec.ranks = 4;
    c.spec.global_batch_tokens = 4 * 2048 * 4;
    c.spec.gpu_mem_budget_bytes = int64_t{12} << 30;
    c.spec.layer_counts = {0, 2, 4, 8, 16};
    c.spec.chunk_numels = {1 << 20, 1 << 23, 1 << 26};
    c.spec.buffer_depths = {1, 2, 3};
    out.push_back(c);
  }
  {
    SearchCase c{"qwen7b_rtx4090_throughput", "qwen2.5-7b", "rtx4090-x4", 4096, {}, 3};
    c.spec.ranks = 4;
    c.spec.objective = Objective::kMaxThroughput;
    c.spec.max_global_batch_tokens = 4 * 4096 * 8;
    c.spec.layer_counts = {0, 7, 14, 21, 28};
    c.spec.chunk_numels = {1 << 24, 1 << 26, 1 << 28};
    c.spec.buffer_depths = {1, 2};
    c.spec.update_threads = {0, 16};
    out.push_back(c);
  }
  {
    SearchCase c{"llama3b_a800_time_to_tokens", "llama-3.2-3b", "a800-x4", 1024, {}, 2};
    c.spec.ranks = 3;
    c.spec.objective = Objective::kMinTimeToTokens;
    c.spec.token_budget_tokens = 100'000'000;
    c.spec.max_global_batch_tokens = 3 * 1024 * 16;
    c.spec.layer_counts = {0, 1, 4, 28};
    c.spec.chunk_numels = {1 << 22, 1 << 25};
    c.spec.buffer_depths = {2, 4};
    c.spec.gpu_mem_budget_bytes = int64_t{20} << 30;
    out.push_back(c);
  }
  {
    // The default grids of a 16-layer model (every offload/keep count), threads and chunks narrowed.
    SearchCase c{"llama1b_h100x4_default_grid", "llama-3.2-1b", "h100-sxm-x4", 4096, {}, 5};
    c.spec.ranks = 4;
    c.spec.global_batch_tokens = 4 * 4096 * 4;
    c.spec.update_threads = {0};
    c.spec.chunk_numels = {1 << 21, 1 << 24, 1 << 27};
    out.push_back(c);
  }
  {
    // Two nodes with a sharded host state: the exchange between nodes in every bound.
    SearchCase c{"qwen7b_h100x8_two_nodes_sharded", "qwen2.5-7b", "h100-sxm-x8", 2048, {}, 3};
    c.spec.nodes = 2;
    c.spec.host_states = {HostState::kSharded};
    c.spec.ranks = 8;
    c.spec.global_batch_tokens = 2 * 8 * 2048 * 4;
    c.spec.layer_counts = {0, 1, 7, 28};
    c.spec.chunk_numels = {1 << 22, 1 << 25};
    c.spec.update_threads = {0, 16};
    out.push_back(c);
  }
  {
    SearchCase c{"tiny_no_fabric", "slidedp-tiny", "h100-sxm-x4", 256, {}, 1, true};
    c.spec.ranks = 4;
    c.spec.global_batch_tokens = 4 * 256 * 2;
    out.push_back(c);
  }
  return out;
}

Hardware case_hardware(const SearchCase& c) {
  Hardware hw = hardware_preset(c.hardware);
  if (c.no_fabric) hw.fabric.kind = "none";
  return hw;
}

void expect_accounted(const SearchStats& s) {
  EXPECT_EQ(s.evaluated + s.pruned + s.infeasible_total(), s.space_size);
  EXPECT_EQ(s.bound_violations, 0);
  EXPECT_EQ(s.relaxation_violations, 0);
}

class SearchVsExhaustive : public ::testing::TestWithParam<SearchCase> {};

TEST_P(SearchVsExhaustive, SameTopKAndEveryCandidateAccounted) {
  for (bool distinct : {true, false}) {
    SCOPED_TRACE(distinct ? "distinct families" : "all variants");
    const SearchCase c = GetParam();
    const Workload w = make_workload(model_preset(c.model), c.seq);
    const Hardware hw = case_hardware(c);
    SearchOptions o;
    o.top_k = c.top_k;
    o.distinct_families = distinct;
    o.rescore_with_simulator = false;
    SearchResult fast = search_plans(w, hw, c.spec, o);
    o.exhaustive = true;
    SearchResult all = search_plans(w, hw, c.spec, o);
    ASSERT_EQ(fast.top.size(), all.top.size());
    for (std::size_t i = 0; i < fast.top.size(); ++i) {
      SCOPED_TRACE("rank " + std::to_string(i + 1));
      EXPECT_EQ(fast.top[i].index, all.top[i].index)
          << fast.top[i].plan.summary(fast.space.num_layers) << " vs "
          << all.top[i].plan.summary(all.space.num_layers);
      EXPECT_EQ(fast.top[i].score, all.top[i].score);
    }
    expect_accounted(fast.stats);
    expect_accounted(all.stats);
    EXPECT_EQ(all.stats.pruned, 0);
    // The search must actually save work on these spaces, or it is not a search.
    EXPECT_LT(fast.stats.evaluated, all.stats.evaluated);
    if (c.no_fabric) {
      EXPECT_GT(fast.stats.infeasible.at(reason::kGpuFabric), 0);
      EXPECT_EQ(fast.best().plan.param_route, ParamRoute::kReplicated);
      EXPECT_EQ(fast.best().plan.grad_route, GradRoute::kCpu);
    }
    // Re-scoring reorders the same top K the same way in both.
    o.rescore_with_simulator = true;
    o.exhaustive = false;
    SearchResult fast_sim = search_plans(w, hw, c.spec, o);
    o.exhaustive = true;
    SearchResult all_sim = search_plans(w, hw, c.spec, o);
    EXPECT_EQ(fast_sim.best().index, all_sim.best().index);
    if (distinct) {
      for (std::size_t i = 0; i < fast.top.size(); ++i)
        for (std::size_t j = 0; j < i; ++j) {
          const CandidateIndex &a = fast.top[i].index, &b = fast.top[j].index;
          EXPECT_FALSE(a.shape == b.shape && a.mix == b.mix && a.route == b.route)
              << "two plans of one family";
        }
    }
  }
}

TEST_P(SearchVsExhaustive, ChosenPlansRespectEveryBudget) {
  const SearchCase c = GetParam();
  const Workload w = make_workload(model_preset(c.model), c.seq);
  const Hardware hw = case_hardware(c);
  SearchResult r = search_plans(w, hw, c.spec, {});
  for (const Candidate& cand : r.top) {
    const MemoryEstimate m = estimate_memory(w, hw, cand.plan, System::kSlideDP);
    EXPECT_TRUE(m.violations().empty()) << cand.plan.summary(r.space.num_layers);
    EXPECT_LE(m.gpu_peak_bytes, gpu_budget_bytes(cand.plan, hw));
    EXPECT_LE(m.host_bytes, static_cast<double>(hw.host.ram_bytes));
    EXPECT_LE(m.host_pinned_bytes, static_cast<double>(hw.host.pinned_limit_bytes));
    EXPECT_TRUE(cand.predicted.feasible);
    // What the table shows is the model's own prediction of that plan.
    EXPECT_EQ(cand.predicted.step_time_s, predict_analytical(w, hw, cand.plan).step_time_s);
    if (c.spec.objective == Objective::kMatchedBatch) {
      EXPECT_EQ(cand.plan.global_batch_sequences() * c.seq, c.spec.global_batch_tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Spaces, SearchVsExhaustive, ::testing::ValuesIn(cases()),
                         [](const auto& tp) { return tp.param.name; });

// Every bound the search uses, checked on every feasible candidate: with K larger than the space nothing
// is pruned, every leaf is scored, and its score is compared with the bound of each node above it.
// A top plan whose step the simulator cannot hold (SearchOptions::max_simulated_tasks) leaves every
// top plan with its analytical score, in the model's order, and says so; with room, all are re-scored.
TEST(Search, RescoringKeepsTheModelsRankingWhenTheSimulatorCannotHoldAStep) {
  const SearchCase c = cases().front();
  const Workload w = make_workload(model_preset(c.model), c.seq);
  const Hardware hw = case_hardware(c);
  SearchOptions o;
  o.top_k = 3;
  o.rescore_with_simulator = false;
  const SearchResult model_only = search_plans(w, hw, c.spec, o);
  o.rescore_with_simulator = true;
  const SearchResult rescored = search_plans(w, hw, c.spec, o);
  EXPECT_EQ(rescored.stats.simulations, static_cast<int64_t>(rescored.top.size()));
  EXPECT_EQ(rescored.stats.simulations_too_large, 0);
  for (const Candidate& cand : rescored.top) EXPECT_TRUE(cand.simulated.has_value());
  o.max_simulated_tasks = 1;
  const SearchResult refused = search_plans(w, hw, c.spec, o);
  EXPECT_EQ(refused.stats.simulations, 0);
  EXPECT_EQ(refused.stats.simulations_too_large, static_cast<int64_t>(refused.top.size()));
  ASSERT_EQ(refused.top.size(), model_only.top.size());
  for (std::size_t i = 0; i < refused.top.size(); ++i) {
    EXPECT_FALSE(refused.top[i].simulated.has_value());
    EXPECT_EQ(refused.top[i].index, model_only.top[i].index);
  }
}

// One test per preset machine (ctest runs them side by side; together they take minutes). The
// test's name is the preset's with '_' for '-', printed the same way, so that ctest's test name is
// that name alone.
struct Preset {
  std::string hardware;
  std::string name() const {
    std::string n = hardware;
    for (char& ch : n)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
  }
};
void PrintTo(const Preset& p, std::ostream* os) { *os << p.name(); }
std::vector<Preset> presets() {
  std::vector<Preset> all;
  for (const std::string& h : hardware_preset_names()) all.push_back({h});
  return all;
}
class BoundsOnPreset : public ::testing::TestWithParam<Preset> {};

TEST_P(BoundsOnPreset, HoldOnEveryCandidate) {
  const std::string hw_name = GetParam().hardware;
  for (const char* model : {"llama-3.2-1b", "qwen2.5-7b", "qwen3-14b"}) {
    SCOPED_TRACE(hw_name + " " + model);
    const Workload w = make_workload(model_preset(model), 2048);
    const Hardware hw = hardware_preset(hw_name);
    SearchSpec spec;
    spec.ranks = std::min(4, hw.gpu.count);
    spec.objective = Objective::kMaxThroughput;
    spec.max_global_batch_tokens = int64_t{spec.ranks} * 2048 * 4;
    const int L = static_cast<int>(w.model.num_layers);
    spec.layer_counts = {0, 1, L / 4, L / 2, L};
    spec.chunk_numels = {1 << 20, 1 << 23, 1 << 26};
    spec.buffer_depths = {1, 2, 3};
    SearchOptions o;
    o.top_k = 1'000'000;
    o.rescore_with_simulator = false;
    SearchResult r;
    try {
      r = search_plans(w, hw, spec, o);
    } catch (const InfeasibleError&) {
      continue;  // a 14B model on a small machine
    }
    EXPECT_EQ(r.stats.pruned, 0);
    expect_accounted(r.stats);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPresetMachine, BoundsOnPreset, ::testing::ValuesIn(presets()),
                         [](const auto& tp) { return tp.param.name(); });

// The same across nodes, both placements of the host state, on the preset that describes a network.
TEST(Search, BoundsHoldOnEveryCandidateAcrossNodes) {
  for (HostState hs : {HostState::kReplicated, HostState::kSharded}) {
    SCOPED_TRACE(host_state_name(hs));
    const Workload w = make_workload(model_preset("qwen2.5-7b"), 2048);
    const Hardware hw = hardware_preset("h100-sxm-x8");
    SearchSpec spec;
    spec.nodes = 4;
    spec.host_states = {hs};
    spec.ranks = 8;
    spec.objective = Objective::kMaxThroughput;
    spec.max_global_batch_tokens = int64_t{4} * 8 * 2048 * 4;
    spec.layer_counts = {0, 1, 7, 14, 28};
    spec.chunk_numels = {1 << 20, 1 << 23, 1 << 26};
    spec.buffer_depths = {1, 2, 3};
    SearchOptions o;
    o.top_k = 1'000'000;
    o.rescore_with_simulator = false;
    const SearchResult r = search_plans(w, hw, spec, o);
    EXPECT_EQ(r.stats.pruned, 0);
    expect_accounted(r.stats);
    for (const Candidate& c : r.top) EXPECT_EQ(c.plan.nodes, 4);
  }
}

// How often and how far the full model comes out below its own critical path, over random plans of
// every preset machine and several models. The planner floors its score there (ranked_step_time_s);
// the floor must stay a rare, small correction -- a large undershoot would mean the model changed in a
// way the floor should not hide.
TEST(Search, CriticalPathUndershoot) {
  std::mt19937 rng(20261130);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::string> hws = hardware_preset_names();
  const char* models[] = {"llama-3.2-1b", "qwen2.5-7b", "qwen3-14b",
                          "llama-3.1-8b", "qwen3-32b",  "slidedp-tiny"};
  double worst = 0;
  int below = 0;
  const int n = 1500;
  for (int t = 0; t < n; ++t) {
    const Hardware hw =
        hardware_preset(hws[static_cast<std::size_t>(pick(0, static_cast<int>(hws.size()) - 1))]);
    const Workload w = make_workload(model_preset(models[pick(0, 5)]), 256 << pick(0, 4));
    const int L = static_cast<int>(w.model.num_layers);
    Plan p;
    p.ranks = pick(1, std::min(8, hw.gpu.count));
    p.micro_batch = 1 << pick(0, 3);
    p.accum_steps = pick(1, 3);
    p.param_route = pick(0, 1) ? ParamRoute::kSharded : ParamRoute::kReplicated;
    p.grad_route = pick(0, 1) ? GradRoute::kGpu : GradRoute::kCpu;
    p.chunk_numel = int64_t{1} << pick(18, 28);
    p.offload_layers = pick(0, L);
    p.recompute_layers = pick(0, L - p.offload_layers);
    p.keep_layers = Plan::kRest;
    p.gpu_buffer_depth = pick(1, 4);
    p.update_threads = pick(0, 1) ? 0 : pick(1, hw.cpu.cores);
    const StepWork sw = build_step_work(w, hw, p, System::kSlideDP);
    const double cp = evaluate_step_work(sw, ModelFidelity::kCriticalPath).step_time_s;
    const Prediction full = evaluate_step_work(sw, ModelFidelity::kContention);
    EXPECT_GE(ranked_step_time_s(full), cp);  // the bound the search relies on, by construction
    if (cp > full.step_time_s) ++below;
    worst = std::max(worst, cp / full.step_time_s - 1.0);
  }
  RecordProperty("undershoot_plans", below);
  RecordProperty("undershoot_worst_percent", std::to_string(100 * worst));
  std::printf("full model below its critical path on %d of %d plans, by up to %.3f%%\n", below, n,
              100 * worst);
  EXPECT_LT(below, n / 20);
  EXPECT_LT(worst, 0.05);
}

// The feasible set only shrinks as the budget tightens, and the order of candidates does not depend
// on the budget, so the best plan either stays or is replaced by one that fits the smaller budget.
TEST(Search, TighterGpuBudgetNeverUsesMoreGpuMemory) {
  for (const char* model : {"llama-3.2-1b", "qwen2.5-7b"}) {
    SCOPED_TRACE(model);
    const Workload w = make_workload(model_preset(model), 4096);
    const Hardware hw = hardware_preset("h100-sxm-x4");
    SearchSpec spec;
    spec.ranks = 4;
    spec.global_batch_tokens = 4 * 4096 * 4;
    spec.layer_counts = {0, 2, 4, 8, 16, 28};
    spec.layer_counts.erase(std::remove_if(spec.layer_counts.begin(), spec.layer_counts.end(),
                                           [&](int n) { return n > w.model.num_layers; }),
                            spec.layer_counts.end());
    SearchOptions o;
    o.top_k = 1;
    o.rescore_with_simulator = false;
    double previous = 1e300;
    int steps = 0;
    for (double gib = 78; gib > 1; gib *= 0.8) {
      spec.gpu_mem_budget_bytes = static_cast<int64_t>(gib * (1 << 30));
      SearchResult r;
      try {
        r = search_plans(w, hw, spec, o);
      } catch (const InfeasibleError&) {
        break;
      }
      const double peak = r.best().predicted.memory.gpu_peak_bytes;
      EXPECT_LE(peak, static_cast<double>(spec.gpu_mem_budget_bytes));
      EXPECT_LE(peak, previous) << gib << " GiB: " << r.best().plan.summary(r.space.num_layers);
      previous = peak;
      ++steps;
    }
    EXPECT_GE(steps, 5);  // the sweep reached budgets that bind
  }
}

// An MLP token tile trades recompute for memory when nothing fits untiled, but only the Llama-style
// units can run one (card/family.h kMlpTokenTiles): a Qwen3.6 or Gemma 4 plan with a tile would be
// refused by the executor. Under a budget nothing fits, the search reports the closest candidate of the
// last tile it tried: a tiled one for the Llama-style control (so tiles were searched), an untiled one
// for Qwen3.6 (dense: no experts to exclude it otherwise).
TEST(Search, OnlyFamiliesWhoseUnitsCanTileTheMlpAreSearchedWithATile) {
  for (const char* model : {"llama-3.2-3b", "qwen3.6-27b"}) {
    SCOPED_TRACE(model);
    const Workload w = make_workload(model_preset(model), 16384);
    ASSERT_FALSE(w.model.moe());
    SearchSpec spec;
    spec.ranks = 4;
    spec.global_batch_tokens = int64_t{4} * 16384 * 2;
    spec.gpu_mem_budget_bytes = int64_t{1} << 30;
    try {
      search_plans(w, hardware_preset("h100-sxm-x4"), spec, {});
      FAIL() << "expected InfeasibleError at 1 GiB";
    } catch (const InfeasibleError& e) {
      const bool tiled = std::string(e.what()).find("mlp tile") != std::string::npos;
      EXPECT_EQ(tiled, w.model.mlp_token_tiles()) << e.what();
    }
  }
}

TEST(Search, NoFeasiblePlanNamesTheBudgetAndTheMiss) {
  const Workload w = make_workload(model_preset("qwen2.5-7b"), 4096);
  const Hardware hw = hardware_preset("h100-sxm-x4");
  SearchSpec spec;
  spec.ranks = 4;
  spec.global_batch_tokens = 4 * 4096;
  spec.gpu_mem_budget_bytes = int64_t{1} << 30;
  try {
    search_plans(w, hw, spec, {});
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gpu_memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("closest"), std::string::npos) << msg;
    EXPECT_NE(msg.find("exceeds the budget 1.00 GiB by"), std::string::npos) << msg;
  }
  // Host RAM: a 72B model's optimizer state does not fit a 24 GiB host.
  const Workload big = make_workload(model_preset("qwen2.5-72b"), 1024);
  spec.ranks = 2;
  spec.global_batch_tokens = 2 * 1024;
  spec.gpu_mem_budget_bytes = 0;
  try {
    search_plans(big, hardware_preset("cpu-dev"), spec, {});
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("host RAM"), std::string::npos) << e.what();
  }
}

TEST(Search, InfeasibleCountsAreExactWhenNothingIsPruned) {
  // With top K larger than the space nothing can be pruned, so the search's infeasibility counts (with
  // whole sub-spaces skipped by monotonicity) must equal exhaustive enumeration's.
  const Workload w = make_workload(model_preset("llama-3.2-1b"), 4096);
  const Hardware hw = hardware_preset("rtx4090-x4");
  SearchSpec spec;
  spec.ranks = 4;
  spec.global_batch_tokens = 4 * 4096 * 8;
  spec.layer_counts = {0, 4, 8, 12, 16};
  spec.chunk_numels = {1 << 20, 1 << 26};
  spec.buffer_depths = {1, 2, 4};
  spec.update_threads = {0};
  SearchOptions o;
  o.rescore_with_simulator = false;
  o.top_k = 1'000'000;
  SearchResult fast = search_plans(w, hw, spec, o);
  o.exhaustive = true;
  SearchResult all = search_plans(w, hw, spec, o);
  EXPECT_EQ(fast.stats.infeasible, all.stats.infeasible);
  EXPECT_GT(fast.stats.infeasible_by_monotonicity, 0);
  EXPECT_LT(fast.stats.memory_estimates, all.stats.memory_estimates);
  EXPECT_EQ(fast.stats.evaluated, all.stats.evaluated);
  ASSERT_EQ(fast.top.size(), all.top.size());
  for (std::size_t i = 0; i < fast.top.size(); ++i) EXPECT_EQ(fast.top[i].index, all.top[i].index);
}

}  // namespace
}  // namespace slidedp::planner
