// The planner and lossy optimizer states (SearchSpec::allow_lossy_states, slidedp-plan
// --allow-lossy-states): bf16 and 8-bit moments are never chosen unless allowed; when allowed, the
// choice follows the rule stated in planner/search.h, checked against separate searches of each format
// (the reference): going from fp32 to bf16 to 8bit, a format is taken over the one chosen so far where
// that one does not fit, or where its best plan takes at least kLossyStatesMinGain less time per
// token; the explanation says which and why.
#include <gtest/gtest.h>

#include "card/model_card.h"
#include "model/hardware.h"
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
  for (const Candidate& c : r.top)
    EXPECT_EQ(c.plan.optimizer_states, OptimizerStates::kFp32);  // neither lossy one
  EXPECT_TRUE(r.optimizer_states_reason.empty());
}

// The rule against separate searches of each format, on a GPU-bound and a host-memory-bound machine.
TEST(LossyStates, AllowedTheyWinOnlyByTheMarginOrByFitting) {
  for (const char* hw_name : {"h100-sxm-x4", "rtx4090-x4"}) {
    SCOPED_TRACE(hw_name);
    const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
    const Hardware hw = hardware_preset(hw_name);
    SearchSpec allowed = small_spec(4);
    allowed.allow_lossy_states = true;
    OptimizerStates want = OptimizerStates::kFp32;
    double want_score = 0;
    for (OptimizerStates f : {OptimizerStates::kFp32, OptimizerStates::kBf16, OptimizerStates::k8bit}) {
      SearchSpec one = small_spec(4);
      one.optimizer_states = f;
      const double score = search_plans(w, hw, one, quick()).best().final_score();
      if (f == OptimizerStates::kFp32 || 1.0 - score / want_score >= kLossyStatesMinGain)
        want = f, want_score = score;
    }
    const SearchResult r = search_plans(w, hw, allowed, quick());
    EXPECT_EQ(r.best().plan.optimizer_states, want) << r.optimizer_states_reason;
    EXPECT_EQ(r.best().final_score(), want_score);
    EXPECT_NE(r.optimizer_states_reason.find(std::string("in ") + optimizer_states_name(want)),
              std::string::npos)
        << r.optimizer_states_reason;
    EXPECT_NE(explain_choice(r).find(r.optimizer_states_reason), std::string::npos);
  }
}

// Hosts whose RAM holds the state with lossy moments but not with more exact ones: with the split
// master fp32 moments need 12 bytes per parameter, bf16 8, 8-bit 6.03, plus buffers. At 10.5 only bf16
// and 8bit fit, and bf16 is taken unless 8bit beats it by the margin; at 7.5 only 8bit fits. Without
// the permission both are infeasible.
TEST(LossyStates, ChosenWhereOnlyTheyFitTheHost) {
  const Workload w = make_workload(model_preset("qwen2.5-7b"), 2048);
  const double P = static_cast<double>(w.layout.total_flat_numel);
  for (double bytes_per_param : {10.5, 7.5}) {
    SCOPED_TRACE(bytes_per_param);
    Hardware hw = hardware_preset("h100-sxm-x4");
    hw.host.ram_bytes = static_cast<int64_t>(bytes_per_param * P);
    hw.host.pinned_limit_bytes = hw.host.ram_bytes;
    SearchSpec spec = small_spec(4);
    EXPECT_THROW(search_plans(w, hw, spec, quick()), InfeasibleError);
    spec.allow_lossy_states = true;
    const SearchResult r = search_plans(w, hw, spec, quick());
    if (bytes_per_param < 8) {
      EXPECT_EQ(r.best().plan.optimizer_states, OptimizerStates::k8bit);
      spec.optimizer_states = OptimizerStates::kBf16;
      spec.allow_lossy_states = false;
      EXPECT_THROW(search_plans(w, hw, spec, quick()), InfeasibleError) << "bf16 must not fit here";
    } else {
      EXPECT_NE(r.best().plan.optimizer_states, OptimizerStates::kFp32);
    }
    const bool by_margin = r.best().plan.optimizer_states == OptimizerStates::k8bit && bytes_per_param > 8;
    EXPECT_NE(r.optimizer_states_reason.find(by_margin ? "less time per token than the best plan with bf16"
                                                       : "no plan with more exact moments fits"),
              std::string::npos)
        << r.optimizer_states_reason;
    EXPECT_LE(r.best().predicted.memory.host_bytes, static_cast<double>(hw.host.ram_bytes));
  }
}

}  // namespace
}  // namespace slidedp::planner
