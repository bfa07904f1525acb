// The Hardware profile from a profile run's results: every value of the model/hardware.h schema
// (where each came from: profile_sources.h).
#pragma once

#include <string>

#include "card/model_card.h"
#include "profiler/gpu.h"
#include "profiler/profile.h"
#include "profiler/stage_plan.h"

namespace slidedp::profiler {

// Fills r.hw (values and sources) from r's results. `largest`: the model whose unit times size the
// FLOP-based fallback; `devices`: the devices profiled (emulated ranks or GPUs); `inv`: the GPUs found.
void assemble_profile(ProfileResult& r, const StagePlan& plan, const ModelCard& largest, int devices,
                      const GpuInventory& inv);

// What the values and their sources share.
// "measured by slidedp-profile DATE (SCALE run, median of N repetitions)".
std::string measured_by(const ProfileResult& r, const StagePlan& plan);
// This host's name with every character other than letters, digits and '-' replaced by '-'.
std::string host_label();
// The curve of `mode` in direction `dir`, or the one-device curve where the run had no such mode.
LinkCurve curve_or_alone(const BackendLinkResult& l, const std::string& mode, const std::string& dir);
// The FLOP-based fallback's case (CPU backend): the largest decoder forward of the largest model.
struct FallbackCase {
  const UnitComputeResult* unit = nullptr;
  const UnitCase* forward = nullptr;
};
FallbackCase fallback_case(const ProfileResult& r, const ModelCard& largest);

}  // namespace slidedp::profiler
