// The profiler's GPU measurements behind a CUDA-free interface (STYLE habit 2): pinned H2D / D2H per
// GPU alone, all GPUs at once and both directions at once over transfer sizes, pageable vs pinned
// once, NCCL all-gather and reduce-scatter bus bandwidth and latency, a bf16 GEMM peak and device
// memory bandwidth. profiler/cuda/gpu_measure.cc implements it in builds with SLIDEDP_ENABLE_CUDA;
// the CPU-only build links gpu_none.cc, whose probe says why there is no GPU. CMake picks the file,
// so no #if is needed here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/backend_links.h"
#include "profiler/stage.h"

namespace slidedp::profiler {

struct GpuInventory {
  int count = 0;
  std::string model;      // device 0's name
  int64_t mem_bytes = 0;  // device 0's memory
  // Device 0's memory in use once its context exists and before we allocate anything: the CUDA
  // context and libraries (and anything other processes hold, which the profile cannot tell apart).
  int64_t runtime_bytes = 0;
  std::string why_none;   // when count == 0: "built without CUDA", "no CUDA device: ..."
};

// Never throws: any failure is a reason for count == 0.
GpuInventory probe_gpus();

struct GpuMeasureOptions {
  std::vector<int64_t> sizes;             // bytes per copy: 64 KiB .. 1 GiB
  std::vector<int64_t> collective_sizes;  // bytes of the whole bf16 buffer
  int64_t pageable_bytes = int64_t{256} << 20;
  int64_t gemm_n = 8192;                 // bf16 GEMM n x n x n on GPU 0
  int64_t hbm_bytes = int64_t{1} << 30;  // device-to-device copy
};

struct GpuMeasurements {
  std::vector<LinkCurve> links;        // alone / all / bidir x h2d / d2h, per GPU (mean over GPUs)
  std::vector<LinkCurve> collectives;  // all_gather / reduce_scatter: busbw fit (NCCL)
  Spread pinned_h2d_gbps, pageable_h2d_gbps;
  Spread bf16_gemm_tflops;  // cuBLAS, bf16 in, fp32 accumulate
  Spread hbm_gbps;          // device-to-device copy, read + write bytes
  std::string fabric_kind;  // "nvlink" when every pair has peer access over NVLink, "pcie_p2p", "via_host"
  int count = 0;
  // GPU 0's memory taken by its NCCL communicator: free memory before ncclCommInitAll minus after it
  // (-1: not measured, one GPU). NCCL sizes its buffers by channels, peers and protocols at init.
  int64_t collective_bytes = -1;
};

// The GPU stage for the run's rounds (stats.h run_rounds): allocates and probes now (throws
// RuntimeError naming the failing CUDA / NCCL / cuBLAS call), measures in the cases; finish() turns
// the samples into the curves, fits and rates and records them. Only called when probe_gpus() found
// a device.
PreparedStage<GpuMeasurements> prepare_gpus(const GpuMeasureOptions& options, StageContext& ctx);

}  // namespace slidedp::profiler
