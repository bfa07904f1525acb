// The planner and lossy optimizer states (SearchSpec::allow_lossy_states, slidedp-plan
// --allow-lossy-states): bf16 moments are never chosen unless allowed; when allowed, the choice follows
// the rule stated in planner/search.h, checked against separate searches of each format (the
// reference): bf16 where no plan with fp32 moments fits, or where its best plan takes at least
// kLossyStatesMinGain less time per token; fp32 otherwise; the explanation says which and why.
#include <gtest/gtest.h>

#include "model/hardware.h"
#include "model/model_card.h"
#include "model/workload.h"
#include "planner/report.h"
#include "planner/search.h"

namespace slidedp::planner {
namespace {

SearchSpec small_spec(int ranks) {
  SearchSpec spec;
  spec.ranks = ranks;
  spec.objective = Objective::kMaxThroughput;
  spec.max_global_batch_tokens = int64_t{ranks} * 4096 * 4;
  spec.chunk_numels = {1 << 23, 1 << 25};
  spec.buffer_depths = {2};
  return spec;
}

SearchOptions quick() {
  SearchOptions o;
  o.rescore_with_simulator = false;
  return o;
}

TEST(LossyStates, NeverChosenUnlessAllowed) {
  const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
  const SearchResult r = search_plans(w, hardware_preset("h100-sxm-x4"), small_spec(4), quick());
  for (const Candidate& c : r.top) EXPECT_EQ(c.plan.optimizer_states, OptimizerStates::kFp32);
  EXPECT_TRUE(r.optimizer_states_reason.empty());
}

// The rule against separate searches of each format, on a GPU-bound and a host-memory-bound machine.
TEST(LossyStates, AllowedTheyWinOnlyByTheMarginOrByFitting) {
  for (const char* hw_name : {"h100-sxm-x4", "rtx4090-x4"}) {
    SCOPED_TRACE(hw_name);
    const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
    const Hardware hw = hardware_preset(hw_name);
    SearchSpec fp32 = small_spec(4), bf16 = small_spec(4), allowed = small_spec(4);
    bf16.optimizer_states = OptimizerStates::kBf16;
    allowed.allow_lossy_states = true;
    const SearchResult a = search_plans(w, hw, fp32, quick()), b = search_plans(w, hw, bf16, quick());
    const SearchResult r = search_plans(w, hw, allowed, quick());
    const double gain = 1.0 - b.best().final_score() / a.best().final_score();
    const OptimizerStates want =
        gain >= kLossyStatesMinGain ? OptimizerStates::kBf16 : OptimizerStates::kFp32;
    EXPECT_EQ(r.best().plan.optimizer_states, want) << "gain " << gain;
    EXPECT_EQ(r.best().final_score(),
              want == OptimizerStates::kBf16 ? b.best().final_score() : a.best().final_score());
    EXPECT_NE(r.optimizer_states_reason.find(want == OptimizerStates::kBf16 ? "in bf16" : "in fp32"),
              std::string::npos)
        << r.optimizer_states_reason;
    EXPECT_NE(explain_choice(r).find(r.optimizer_states_reason), std::string::npos);
  }
}

// A host whose RAM holds the state with bf16 moments (8 bytes per parameter with the split master,
// plus buffers) but not with fp32 ones (12): only bf16 fits, so it is chosen when allowed, and without
// the permission the search is infeasible.
TEST(LossyStates, ChosenWhereOnlyTheyFitTheHost) {
  const Workload w = make_workload(model_preset("qwen2.5-7b"), 2048);
  Hardware hw = hardware_preset("h100-sxm-x4");
  const double P = static_cast<double>(w.layout.total_flat_numel);
  hw.host.ram_bytes = static_cast<int64_t>(10.5 * P);
  hw.host.pinned_limit_bytes = hw.host.ram_bytes;
  SearchSpec spec = small_spec(4);
  EXPECT_THROW(search_plans(w, hw, spec, quick()), InfeasibleError);
  spec.allow_lossy_states = true;
  const SearchResult r = search_plans(w, hw, spec, quick());
  EXPECT_EQ(r.best().plan.optimizer_states, OptimizerStates::kBf16);
  EXPECT_NE(r.optimizer_states_reason.find("no plan with fp32 moments fits"), std::string::npos)
      << r.optimizer_states_reason;
  EXPECT_LE(r.best().predicted.memory.host_bytes, static_cast<double>(hw.host.ram_bytes));
}

}  // namespace
}  // namespace slidedp::planner
