// GPU and host memory of a plan: what one rank's device holds at its peak and what the host holds,
// itemized so an over-budget plan can say exactly why (DESIGN section 4, "Memory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/hardware.h"
#include "model/memory_account.h"
#include "model/plan.h"
#include "model/system.h"
#include "model/workload.h"

namespace slidedp {


struct MemoryEstimate {
  std::vector<MemoryItem> gpu_items;   // per rank, at the peak
  std::vector<MemoryItem> host_items;  // whole host
  double gpu_peak_bytes = 0;
  double gpu_budget_bytes = 0;
  double host_bytes = 0;
  double host_pinned_bytes = 0;
  double host_bytes_per_param = 0;  // host_bytes over the model's parameters (SlideDP: 12 of state + buffers)
  double host_ram_bytes = 0;
  double host_pinned_limit_bytes = 0;
  bool fits_gpu() const { return gpu_peak_bytes <= gpu_budget_bytes; }
  bool fits_host() const { return host_bytes <= host_ram_bytes && host_pinned_bytes <= host_pinned_limit_bytes; }
  // One line per violated budget, with the numbers; empty when everything fits.
  std::vector<std::string> violations() const;
};

// The GPU budget of a plan: its explicit budget, or the GPU's memory minus the reserve.
double gpu_budget_bytes(const Plan& plan, const Hardware& hw);

// The memory account's view of `hw` for a plan: the CUDA backend's units (the CPU backend's when the
// devices are emulated on the host, with its threads per device), its allocator, and the runtime's
// memory the profile states.
RankMemorySpec rank_memory_spec(const Workload& w, const Hardware& hw, const Plan& plan);

// Itemized estimate. Activation bytes follow model_costs.h; the plan is taken as the system runs it
// (plan_for_system), so baselines are charged for their own buffers.
MemoryEstimate estimate_memory(const Workload& w, const Hardware& hw, const Plan& plan, System system);

// Host-side chunk slots per rank in the gradient staging ring (cpu route): enough for D2H of one
// chunk to overlap the reduction of the previous ones.
inline constexpr int kGradStagingChunksPerRank = 8;

}  // namespace slidedp
