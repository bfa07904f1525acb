// The GPU interface in a build without CUDA (SLIDEDP_ENABLE_CUDA=OFF): no device, and the reason.
#include "common/error.h"
#include "profiler/gpu.h"

namespace slidedp::profiler {

GpuInventory probe_gpus() {
  GpuInventory g;
  g.why_none = "this build has no CUDA support (configured with SLIDEDP_ENABLE_CUDA=OFF)";
  return g;
}

PreparedStage<GpuMeasurements> prepare_gpus(const GpuMeasureOptions&, StageContext&) {
  SLIDEDP_CHECK(false, "prepare_gpus called in a build without CUDA; probe_gpus() reported no device");
  return {};
}

}  // namespace slidedp::profiler
