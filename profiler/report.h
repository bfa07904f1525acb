// How a profile run is shown: fixed-width tables with a units row (nccl-tests style) for the console
// and the same tables in markdown for results/, and one JSON object for --json. All three come from
// the same ProfileResult, so they never disagree.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "profiler/profile.h"

namespace slidedp::profiler {

// Every table: the profile's values with their spread, then host memory, CPU update, links, fabric,
// units and their fits.
std::string profile_tables(const ProfileResult& r, bool markdown);

// Provenance, options, the expected and actual duration, the hardware profile (as in the YAML),
// every measurement (median, min, max, spread, repetitions) and every fit with its residuals.
nlohmann::json profile_json(const ProfileResult& r);

}  // namespace slidedp::profiler
