// This host's physical RAM, for feasibility checks before large allocations (the planner's measured
// refinement, the profiler, slidedp-run's host state).
#pragma once

#include <cstdint>

namespace slidedp {

// sysconf's physical pages times the page size; 0 when the system does not say.
int64_t physical_ram_bytes();

}  // namespace slidedp
