// Per-kernel GPU activity (CUPTI's activity records, executor/cuda/cupti_activity.h) placed on the
// measured timeline: each kernel, copy or memset that ran on one of the executor's streams becomes a
// span on that stream's "kernels" track, tagged with the unit, step and chunk of the CUDA-event span
// of the same rank and stream that contains it, and named "<phase>: <kernel>" (category "kernel",
// so the per-resource busy times of the CUDA-event spans count nothing twice). Plain C++: the mapping
// is tested on the CPU with recorded activities (tests/executor/kernel_activity_test.cc).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "executor/backend.h"

namespace slidedp::exec {

struct DeviceActivity {
  enum class Kind { kKernel, kMemcpy, kMemset };
  Kind kind = Kind::kKernel;
  std::string name;            // the kernel's (demangled where CUPTI gives it so) or "memcpy HtoD" etc.
  uint32_t device = 0, stream = 0;  // CUPTI's device and stream ids
  uint32_t correlation = 0;    // CUPTI's correlation id (the launching API call)
  uint64_t start_ns = 0, end_ns = 0;  // CUPTI timestamps
};

// Which executor stream a CUPTI (device, stream) pair is.
struct ActivityStream {
  uint32_t device = 0, stream = 0;
  int rank = 0;
  std::string name;  // "compute", "h2d", "d2h", "comm"
};

// CUPTI's clock against the trace clock: one reading of each, taken together.
struct ActivityClock {
  uint64_t cupti_ns = 0;
  double trace_s = 0;
  double to_trace_s(uint64_t ns) const {
    return trace_s + (static_cast<double>(ns) - static_cast<double>(cupti_ns)) * 1e-9;
  }
};

struct AttributedActivities {
  std::vector<MeasuredSpan> spans;  // category "kernel", stream "<name>.kernels"
  int64_t unknown_stream = 0;       // activities on streams that are not the executor's (dropped)
  int64_t outside_spans = 0;        // on an executor stream but inside no measured span (unit -1)
};

// `names` owns the strings the spans' tags point at (SpanTag holds const char*): keep it alive as long
// as the spans. `measured` are the CUDA-event spans of the same period.
// Per-kernel totals of the kernel spans above: what `slidedp-profile --kernels` keeps per unit
// operation and `slidedp-run --bench --trace-kernels` prints for the run.
struct KernelTotal {
  std::string kernel;  // the kernel's name, or "memcpy HtoD" etc. for copies and memsets
  int64_t calls = 0;
  double seconds = 0;  // summed device time of its calls
};
// The kernel spans of device `rank` summed by kernel (the "<phase>: " prefix dropped), largest total
// first (ties by name); every other span is ignored.
std::vector<KernelTotal> sum_kernels(const std::vector<MeasuredSpan>& spans, int rank);

AttributedActivities attribute_activities(const std::vector<DeviceActivity>& activities,
                                          const std::vector<ActivityStream>& streams, const ActivityClock& clock,
                                          const std::vector<MeasuredSpan>& measured, std::set<std::string>& names);

}  // namespace slidedp::exec
