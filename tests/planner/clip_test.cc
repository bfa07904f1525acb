// The planner and clipping (SearchSpec::verify_updates, slidedp-plan --clip): every plan is scored
// with the update after the backward (the step model's clipped schedule), the winner says so in its
// plan, and the search's pruning still finds what enumerating every candidate finds (its bounds stay
// lower bounds under the clipped schedule).
#include <gtest/gtest.h>

#include "card/model_card.h"
#include "model/hardware.h"
#include "model/step_model.h"
#include "model/workload.h"
#include "planner/search.h"

namespace slidedp::planner {
namespace {

SearchSpec small_spec(bool clip) {
  SearchSpec spec;
  spec.ranks = 4;
  spec.objective = Objective::kMatchedBatch;
  spec.global_batch_tokens = int64_t{4} * 4096 * 4;
  spec.chunk_numels = {1 << 23, 1 << 25};
  spec.buffer_depths = {2, 3};
  spec.verify_updates = clip;
  return spec;
}

SearchOptions quick(bool exhaustive) {
  SearchOptions o;
  o.rescore_with_simulator = false;
  o.exhaustive = exhaustive;
  return o;
}

TEST(PlannerClip, EveryPlanIsScoredClippedAndTheWinnerSaysSo) {
  const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
  const Hardware hw = hardware_preset("h100-sxm-x4");
  const SearchResult clipped = search_plans(w, hw, small_spec(true), quick(false));
  ASSERT_FALSE(clipped.top.empty());
  for (const Candidate& c : clipped.top) {
    EXPECT_TRUE(c.plan.verify_updates);
    Plan plain = c.plan;
    plain.verify_updates = false;
    // Scored as the model predicts the clipped plan, and clipping costs on this machine (the update
    // outlasts the forward it overlaps).
    EXPECT_EQ(c.predicted.step_time_s, predict_analytical(w, hw, c.plan, System::kSlideDP).step_time_s);
    EXPECT_GT(c.predicted.step_time_s, predict_analytical(w, hw, plain, System::kSlideDP).step_time_s);
  }
  const SearchResult plain = search_plans(w, hw, small_spec(false), quick(false));
  for (const Candidate& c : plain.top) EXPECT_FALSE(c.plan.verify_updates);
  EXPECT_GT(clipped.best().final_score(), plain.best().final_score());
}

TEST(PlannerClip, ThePrunedSearchFindsWhatEnumerationFinds) {
  for (const char* hw_name : {"h100-sxm-x4", "rtx4090-x4"}) {
    SCOPED_TRACE(hw_name);
    const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
    const Hardware hw = hardware_preset(hw_name);
    const SearchResult pruned = search_plans(w, hw, small_spec(true), quick(false));
    const SearchResult all = search_plans(w, hw, small_spec(true), quick(true));
    EXPECT_EQ(pruned.best().final_score(), all.best().final_score());
    EXPECT_EQ(pruned.stats.bound_violations, 0);
  }
}

}  // namespace
}  // namespace slidedp::planner
