// The Hardware profile from a profile run's results: every value of the model/hardware.h schema,
// each with where it came from (hw.sources: the measurement, its sizes, its spread).
#pragma once

#include "model/model_card.h"
#include "profiler/gpu.h"
#include "profiler/profile.h"
#include "profiler/stage_plan.h"

namespace slidedp::profiler {

// Fills r.hw from r's results. `largest`: the model whose unit times size the FLOP-based fallback;
// `devices`: the devices profiled (emulated ranks or GPUs); `inv`: the GPUs found.
void assemble_profile(ProfileResult& r, const StagePlan& plan, const ModelCard& largest, int devices,
                      const GpuInventory& inv);

}  // namespace slidedp::profiler
