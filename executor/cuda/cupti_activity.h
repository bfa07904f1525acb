// CUPTI's Activity API for `slidedp-run --trace-kernels`: every kernel, memcpy and memset the GPU runs,
// with its stream, correlation id and timestamps (executor/kernel_activity.h places them on the
// timeline). libcupti is opened at run time (dlopen), only when asked for, so the binaries and the
// GPU check's bundle do not depend on it. Collecting costs time: it is off unless requested.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "executor/kernel_activity.h"

namespace slidedp::exec {

class CuptiActivity {
 public:
  // Opens libcupti and enables kernel, memcpy and memset records; throws InputError naming the
  // library and CUPTI's error when it cannot.
  CuptiActivity();
  ~CuptiActivity();  // disables the records
  CuptiActivity(const CuptiActivity&) = delete;
  CuptiActivity& operator=(const CuptiActivity&) = delete;

  // CUPTI's id of `stream` (as its records give it).
  uint32_t stream_id(cudaStream_t stream) const;
  // CUPTI's clock now (pair it with the trace clock: ActivityClock).
  uint64_t timestamp_ns() const;
  // Every record completed so far (flushes CUPTI's buffers).
  std::vector<DeviceActivity> take();
};

}  // namespace slidedp::exec
