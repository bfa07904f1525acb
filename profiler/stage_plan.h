// What a profile run measures at each scale (smoke / quick / full): every stage's sizes and
// repetitions, and the checks of the options they come from.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/profile.h"

namespace slidedp::profiler {

// The CPU backend's default device budget (executor/trainer.cc): the emulated "GPU memory".
inline constexpr int64_t kCpuBackendDeviceBudget = int64_t{16} << 30;

// Everything a scale decides: sizes and repetitions of every stage.
struct StagePlan {
  RepeatPolicy repeat;
  HostMemoryOptions host;
  CpuUpdateOptions update;
  BackendLinkOptions links;
  GpuMeasureOptions gpu;
  UnitComputeOptions units;
  int64_t sgemm_n = 1024;
};

// The plan of a run on `cores` cores with the CPU update measured at `threads`; `llc`: last-level
// cache bytes; `model_params`: flat parameters of the largest model (its host state sizes the working
// sets).
StagePlan plan_for(const ProfileOptions& o, int cores, const std::vector<int>& threads, int64_t llc,
                   int64_t model_params);

// Throws InputError naming the flag of the first option out of range.
void check_options(const ProfileOptions& o);

}  // namespace slidedp::profiler
