// The regime plans of a paced fidelity study are what fidelity_regimes.h promises: each the predicted
// bottleneck of its resource by the stated lead, recomputed here from the model's busy times.
// (The paced runs themselves: fidelity_paced_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "model/hardware.h"
#include "sweeps/fidelity.h"
#include "sweeps/fidelity_regimes.h"

namespace slidedp {
namespace {

TEST(FidelityRegimes, EachPlanIsItsResourcesPredictedBottleneckByTheStatedLead) {
  const Workload w = make_workload(model_preset("slidedp-small"), 16);
  const Hardware hw = hardware_preset("a800-x4");
  const RegimeSelection sel = regime_fidelity_plans(w, hw, 3, 4, 1.05, 4.0);
  ASSERT_EQ(sel.plans.size(), sel.chosen.size());
  std::map<std::string, int> per_resource;
  std::set<std::string> names;
  for (const RegimeCandidate& c : sel.chosen) {
    // Independently: predict again and find the busiest of the measured resources and the runner-up.
    const FidelityPrediction p = predict_for_fidelity(w, hw, c.plan.plan);
    std::vector<std::pair<double, std::string>> busy;
    for (const auto& [r, b] : p.busy) busy.push_back({b, r});
    std::sort(busy.rbegin(), busy.rend());
    EXPECT_EQ(busy[0].second, c.predicted.bottleneck) << c.plan.name;
    const double lead = busy[0].first / busy[1].first;
    EXPECT_GE(lead, 1.05) << c.plan.name;
    EXPECT_LE(lead, 4.0) << c.plan.name;
    EXPECT_TRUE(p.feasible) << c.plan.name;
    EXPECT_LE(c.plan.plan.ranks, 4);
    ++per_resource[c.predicted.bottleneck];
    names.insert(c.plan.name);
  }
  EXPECT_EQ(names.size(), sel.plans.size());  // r01, r02, ... unique
  for (const auto& [r, n] : per_resource) EXPECT_LE(n, 3) << r;
  // On this target the grid reaches every resource the executor measures.
  EXPECT_EQ(per_resource.size(), fidelity_resources().size());
  // Deterministic: the same call chooses the same plans.
  const RegimeSelection again = regime_fidelity_plans(w, hw, 3, 4, 1.05, 4.0);
  ASSERT_EQ(again.plans.size(), sel.plans.size());
  for (std::size_t i = 0; i < sel.plans.size(); ++i)
    EXPECT_EQ(again.plans[i].plan.summary(4), sel.plans[i].plan.summary(4)) << i;
}

}  // namespace
}  // namespace slidedp
