// Validation plans for a paced fidelity study (issue 18): plans chosen so that every resource the
// executor measures (GPU compute, the H2D and D2H links, the device fabric, the CPU update) is the
// predicted bottleneck of several of them on the target, so the study tests the model in every regime
// and "bottleneck right" cannot be scored by always answering the same resource.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/hardware.h"
#include "model/workload.h"
#include "sweeps/fidelity.h"

namespace slidedp {

struct RegimeCandidate {
  FidelityPlan plan;
  FidelityPrediction predicted;
  double margin = 0;  // the predicted bottleneck's busy time over the next busiest resource's
};

struct RegimeSelection {
  std::vector<FidelityPlan> plans;                 // named r01, r02, ... in resource order
  std::vector<RegimeCandidate> chosen;             // the same, with their predictions
  std::map<std::string, int> candidates_per_resource;  // how many grid plans each resource binds
  int grid_size = 0;                               // grid plans that fit the target's memory
};

// The grid: ranks 1, 2 and all of the target's GPUs (at most max_ranks), micro-batch 1 or 2,
// accumulation 1 or 4, both routes, all or 8 update threads, chunks of 256Ki or 4Mi elements, every
// layer kept or recomputed. Each is predicted on the target; of those whose bottleneck leads the next
// resource by a factor in [min_margin, max_margin] (closer calls are a coin toss for any model and
// noise; far clearer ones test little and, paced, cost the most time here), up to `per_resource` per
// resource are kept, spread evenly over their margins. Deterministic: ties broken by grid order.
RegimeSelection regime_fidelity_plans(const Workload& w, const Hardware& target, int per_resource, int max_ranks,
                                      double min_margin = 1.05, double max_margin = 4.0);

}  // namespace slidedp
