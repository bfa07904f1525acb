// Copies and collectives measured through the executor's own Backend interface, exactly as the rank
// drivers issue them: copy_h2d / copy_d2h on a device's h2d and d2h streams, all_gather and
// reduce_scatter on the comm streams. Used for the CPU backend, whose "links" are memcpy on stream
// threads and whose "fabric" is memcpy between emulated devices' memory. Each copy reads and writes
// a fresh part of regions larger than the last-level cache, as the executor streams a unit's chunks
// from the host state, so small copies are not flattered by the cache. Times come from host_fn
// stamps inside the streams: the span from the first copy's start to the last copy's end, divided by
// the copies in it, so the per-copy dispatch cost is part of the fitted latency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend.h"
#include "profiler/fit.h"
#include "profiler/stage.h"

namespace slidedp::profiler {

struct BackendLinkOptions {
  std::vector<int64_t> sizes;                 // bytes per copy
  int64_t region_bytes = int64_t{128} << 20;  // rotated region per buffer (>= max size)
  bool all_and_bidir = true;                  // also every device at once, and both directions at once
  std::vector<int64_t> collective_sizes;  // bytes of the whole (gathered / reduced) bf16 buffer; empty: none
};

// One curve: per-copy seconds by size, and its latency + bandwidth fit.
struct LinkCurve {
  std::string mode;       // "alone" | "all" | "bidir" (links), "all_gather" | "reduce_scatter" (fabric)
  std::string direction;  // "h2d" | "d2h" | "" (collectives)
  int devices = 1;        // devices taking part
  struct Point {
    int64_t bytes = 0;
    Spread seconds;  // per copy / per call
  };
  std::vector<Point> points;
  LatencyBandwidth fit;  // collectives: bandwidth is nccl-tests' bus bandwidth
};

struct BackendLinkResult {
  std::vector<LinkCurve> links;
  std::vector<LinkCurve> collectives;
  const LinkCurve* find(const std::string& mode, const std::string& direction) const;
};

// Allocates the regions (4 x region_bytes per device taking part: device in / out, host in / out,
// held until the stage's cases are destroyed, which must happen before the backend is) and builds
// the cases; finish() records every case in ctx.out and fits the curves.
PreparedStage<BackendLinkResult> prepare_backend_links(exec::Backend& backend,
                                                       const BackendLinkOptions& options, StageContext& ctx);
double estimate_backend_links_s(const BackendLinkOptions& options, int devices, const RepeatPolicy& repeat,
                                double copy_gbps);

}  // namespace slidedp::profiler
