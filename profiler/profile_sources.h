// Where every value of a measured Hardware profile came from: one table, `key -> source`, beside the
// values profile_assembly.cc computes. A source names the measurement, its sizes and its spread, so
// a reader of the YAML can judge a number without the code.
#pragma once

#include <map>
#include <string>

#include "card/model_card.h"
#include "profiler/gpu.h"
#include "profiler/profile.h"
#include "profiler/stage_plan.h"

namespace slidedp::profiler {

// The sources of every value assemble_profile sets from r (the same arguments), keyed like
// Hardware::sources ("host_link.h2d_gbps", ...).
std::map<std::string, std::string> profile_sources(const ProfileResult& r, const StagePlan& plan,
                                                   const ModelCard& largest, int devices, const GpuInventory& inv);

}  // namespace slidedp::profiler
