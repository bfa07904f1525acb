// What every measuring stage shares: where results go, how often to repeat, how to report progress,
// plus a page-aligned host allocation that is touched on creation (first-touch page faults must not
// land inside a timed repetition).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "profiler/measurement.h"
#include "profiler/stats.h"

namespace slidedp::profiler {

struct StageContext {
  Measurements& out;
  RepeatPolicy repeat;
  // fraction of this stage done (0..1) and a note ("triad, 2 threads"); may be empty.
  std::function<void(double fraction, const std::string& note)> progress;

  void report(double fraction, const std::string& note) const {
    if (progress) progress(fraction, note);
  }
};

// `bytes` of host memory, 4 KiB aligned, filled with `fill` bytes (so every page is resident).
// Throws RuntimeError naming the size when the allocation fails.
class HostArray {
 public:
  HostArray() = default;
  HostArray(int64_t bytes, unsigned char fill);
  std::byte* data() const { return ptr_.get(); }
  int64_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(ptr_.get());
  }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> ptr_;
  int64_t bytes_ = 0;
};

// Bytes of the last-level cache (sysfs), or 32 MiB when unknown. Buffers of the bandwidth stages
// are sized as a multiple of it so their data streams from DRAM.
int64_t last_level_cache_bytes();

}  // namespace slidedp::profiler
