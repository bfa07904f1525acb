// Per-kernel GPU time of one unit operation, from CUPTI's activity records as the executor places them
// on its timeline (executor/kernel_activity.h: spans of category "kernel" named "<phase>: <kernel>").
// `slidedp-profile --kernels` runs each measured operation once more with them on and writes these
// totals beside the operation's time. Plain C++: tested on the CPU with recorded spans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend.h"

namespace slidedp::profiler {

struct KernelTotal {
  std::string kernel;  // the kernel's name, or "memcpy HtoD" etc. for copies and memsets
  int64_t calls = 0;
  double seconds = 0;  // summed device time of its calls
};

// The kernel spans of device `rank` summed by kernel (the "<phase>: " prefix dropped), largest total
// first (ties by name); every other span is ignored.
std::vector<KernelTotal> sum_kernels(const std::vector<exec::MeasuredSpan>& spans, int rank);

}  // namespace slidedp::profiler
