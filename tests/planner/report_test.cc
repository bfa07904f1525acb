// The planner's report: the table and the why line name what they should, the JSON has its stable
// keys, the plan file reads back to the same plan, and Kendall's tau-b on known rankings.
#include "planner/report.h"

#include <gtest/gtest.h>

#include <cmath>

#include "planner/refine.h"

namespace slidedp::planner {
namespace {

SearchResult small_search() {
  const Workload w = make_workload(model_preset("llama-3.2-1b"), 2048);
  SearchSpec spec;
  spec.ranks = 4;
  spec.global_batch_tokens = 4 * 2048 * 2;
  spec.layer_counts = {0, 4, 8, 16};
  spec.chunk_numels = {1 << 22, 1 << 24};
  return search_plans(w, hardware_preset("h100-sxm-x4"), spec, {});
}

TEST(Report, TableWhyLineAndJson) {
  const SearchResult r = small_search();
  ASSERT_GE(r.top.size(), 2u);
  const std::string table = render_top_table(r);
  for (const char* col : {"step (model)", "step (sim)", "tokens/s", "bottleneck", "exposed", "GPU peak"})
    EXPECT_NE(table.find(col), std::string::npos) << col;
  const std::string why = explain_choice(r);
  EXPECT_EQ(why.rfind("why: the winner is bound by " + r.best().predicted.bottleneck, 0), 0u) << why;
  EXPECT_NE(why.find("runner-up (" + plan_difference(r.top[0].plan, r.top[1].plan, 16) + ")"),
            std::string::npos)
      << why;
  const nlohmann::json j = search_result_to_json(r);
  for (const char* key : {"top", "why", "stats", "space", "objective", "closest_miss"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["top"].size(), r.top.size());
  EXPECT_EQ(j["stats"]["space_size"].get<int64_t>(), r.stats.space_size);
  EXPECT_NE(render_search_stats(r).find("searched"), std::string::npos);
}

TEST(Report, PlanFileReadsBack) {
  const SearchResult r = small_search();
  const PlanFile f = best_plan_file(r, "llama-3.2-1b", "h100-sxm-x4", 2048);
  const PlanFile g = plan_file_from_yaml(plan_file_to_yaml(f), "test");
  EXPECT_EQ(g.model, "llama-3.2-1b");
  EXPECT_EQ(g.hardware, "h100-sxm-x4");
  EXPECT_EQ(g.seq_len, 2048);
  EXPECT_EQ(plan_to_yaml(g.plan), plan_to_yaml(r.best().plan));
}

TEST(Report, PlanDifferenceNamesEachChangedKnob) {
  Plan a, b;
  b.micro_batch = 2;
  b.chunk_numel = a.chunk_numel * 2;
  b.gpu_buffer_depth = 3;
  EXPECT_EQ(plan_difference(a, b, 4), "mb 1 x acc 1 -> mb 2 x acc 1, chunk 32M -> 64M, depth 2 -> 3");
  EXPECT_EQ(plan_difference(a, a, 4), "");
}

TEST(Refine, KendallTauB) {
  EXPECT_DOUBLE_EQ(kendall_tau_b({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(kendall_tau_b({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // One tie in y: concordant 2, discordant 0, ties_y 1 -> 2 / sqrt(2 * 3).
  EXPECT_NEAR(kendall_tau_b({1, 2, 3}, {1, 1, 2}), 2.0 / std::sqrt(6.0), 1e-15);
  EXPECT_TRUE(std::isnan(kendall_tau_b({1}, {1})));
}

}  // namespace
}  // namespace slidedp::planner
