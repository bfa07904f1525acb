// The search space: batch shapes of each goal, the default grids, the plans it builds, and the input
// errors for requests that describe no plan.
#include "planner/search_space.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace slidedp::planner {
namespace {

Workload tiny(int64_t seq = 128) { return make_workload(model_preset("slidedp-tiny"), seq); }

TEST(SearchSpace, MatchedBatchShapesAreTheDivisorsOfTheSequencesPerRank) {
  SearchSpec spec;
  spec.ranks = 2;
  spec.global_batch_tokens = 2 * 128 * 12;
  SearchSpace sp = make_search_space(tiny(), hardware_preset("cpu-dev"), spec);
  std::vector<BatchShape> want = {{1, 12}, {2, 6}, {3, 4}, {4, 3}, {6, 2}, {12, 1}};
  EXPECT_EQ(sp.shapes, want);
  for (const BatchShape& s : sp.shapes) EXPECT_EQ(sp.tokens_per_step(s), spec.global_batch_tokens);
  spec.max_micro_batch = 4;
  spec.max_accum_steps = 6;
  sp = make_search_space(tiny(), hardware_preset("cpu-dev"), spec);
  want = {{2, 6}, {3, 4}, {4, 3}};
  EXPECT_EQ(sp.shapes, want);
}

TEST(SearchSpace, GlobalBatchThatIsNotAMultipleSaysTheNearestOnes) {
  SearchSpec spec;
  spec.ranks = 8;
  spec.global_batch_tokens = 100000;
  try {
    make_search_space(tiny(4096), hardware_preset("h100-sxm-x8"), spec);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("8 x 4096 = 32768"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("98304 or 131072"), std::string::npos) << e.what();
  }
}

TEST(SearchSpace, FreeBatchShapesArePowersOfTwoUnderTheCap) {
  SearchSpec spec;
  spec.ranks = 2;
  spec.objective = Objective::kMaxThroughput;
  spec.max_global_batch_tokens = 2 * 128 * 4;
  SearchSpace sp = make_search_space(tiny(), hardware_preset("cpu-dev"), spec);
  std::vector<BatchShape> want = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}};
  EXPECT_EQ(sp.shapes, want);
  EXPECT_DOUBLE_EQ(sp.score(2.0, {2, 2}), 2.0 / (2 * 128 * 4));
  spec.objective = Objective::kMinTimeToTokens;
  spec.token_budget_tokens = 10000;
  sp = make_search_space(tiny(), hardware_preset("cpu-dev"), spec);
  EXPECT_DOUBLE_EQ(sp.score(2.0, {2, 2}), 2.0 * 10);  // ceil(10000 / 1024) = 10 steps
}

TEST(SearchSpace, RanksBeyondTheGpusAreBadInput) {
  SearchSpec spec;
  spec.ranks = 8;
  spec.global_batch_tokens = 8 * 128;
  EXPECT_THROW(make_search_space(tiny(), hardware_preset("h100-sxm-x4"), spec), InputError);
}

// The collectives split a chunk into one shard per rank (of every node, for the gpu route across
// nodes); NCCL takes one ring call only when the shards are equal, else one call per rank (D16 in
// docs/CUDA_BACKEND.md). Every unit is a multiple of 64 elements and so is every chunk the planner
// offers, so every chunk, a unit's last included, splits evenly over any power-of-two rank count up
// to 64 (8 nodes x 8 GPUs).
TEST(SearchSpace, EveryPlannedChunkSplitsEvenlyOverPowerOfTwoRanks) {
  for (const std::string& name : model_preset_names()) {
    SCOPED_TRACE(name);
    const Workload w = make_workload(model_preset(name), 4096);
    for (int64_t chunk : default_chunk_numels(w.layout)) {
      ASSERT_EQ(chunk % 64, 0) << chunk;
      for (const UnitLayout& u : w.layout.units) {
        const int64_t last = u.flat_numel - (num_chunks(u.flat_numel, chunk) - 1) * chunk;
        for (int ranks : {2, 4, 8, 16, 32, 64})
          ASSERT_EQ(last % ranks, 0) << "unit " << u.flat_numel << " chunk " << chunk << " ranks " << ranks;
      }
    }
  }
}

TEST(SearchSpace, DefaultGridsAndPlans) {
  EXPECT_EQ(default_layer_counts(4), (std::vector<int>{0, 1, 2, 3, 4}));
  const std::vector<int> g80 = default_layer_counts(80);
  EXPECT_EQ(g80.front(), 0);
  EXPECT_EQ(g80.back(), 80);
  EXPECT_LE(g80.size(), 21u);
  for (int i : {1, 2, 4, 5, 40, 75}) EXPECT_NE(std::find(g80.begin(), g80.end(), i), g80.end()) << i;

  const Workload w = make_workload(model_preset("qwen2.5-72b"), 4096);
  const std::vector<int64_t> chunks = default_chunk_numels(w.layout);
  const int64_t layer = w.layout.units[1].flat_numel;
  EXPECT_NE(std::find(chunks.begin(), chunks.end(), layer), chunks.end());  // one chunk per layer
  EXPECT_GE(chunks.front(), layer / 64);
  EXPECT_TRUE(std::is_sorted(chunks.begin(), chunks.end()));

  SearchSpec spec;
  spec.ranks = 4;
  spec.global_batch_tokens = 4 * 4096 * 2;
  spec.gpu_mem_budget_bytes = int64_t{60} << 30;
  const SearchSpace sp = make_search_space(w, hardware_preset("h100-sxm-x4"), spec);
  EXPECT_EQ(sp.routes.size(), 4u);
  EXPECT_EQ(sp.threads, (std::vector<int>{112, 56, 28}));
  EXPECT_EQ(sp.size(), static_cast<int64_t>(sp.shapes.size() * sp.mixes.size() * 4 * sp.depths.size() * 3 *
                                            sp.chunks.size()));
  for (int m = 0; m < static_cast<int>(sp.mixes.size()); m += 7) {
    const Plan p = sp.plan({1, m, 3, 1, 1, 2});
    EXPECT_NO_THROW(p.validate(80, "test"));
    const Plan::PolicyCounts pc = p.policy_counts(80);
    EXPECT_EQ(pc.offload, sp.mixes[static_cast<std::size_t>(m)].offload);
    EXPECT_EQ(pc.keep, sp.mixes[static_cast<std::size_t>(m)].keep);
    EXPECT_EQ(p.update_threads, 56);
    EXPECT_EQ(p.gpu_mem_budget_bytes, spec.gpu_mem_budget_bytes);
  }
  EXPECT_EQ(sp.plan({0, 0, 0, 0, 0, 0}).update_threads, 0);  // all free cores is written as 0
}

TEST(SearchSpace, OneRankSearchesOneRoute) {
  SearchSpec spec;
  spec.ranks = 1;
  spec.global_batch_tokens = 128;
  const SearchSpace sp = make_search_space(tiny(), hardware_preset("cpu-dev"), spec);
  ASSERT_EQ(sp.routes.size(), 1u);
  EXPECT_EQ(sp.routes[0].first, ParamRoute::kReplicated);
}

}  // namespace
}  // namespace slidedp::planner
