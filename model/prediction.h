// What the model says about one step of a plan: the time, a breakdown whose parts sum to it, the busy
// time of every resource, the bottleneck, throughput and memory. The analytical model and the
// simulator both fill this struct, so they can be compared field by field.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/memory_model.h"

namespace slidedp {

// Parts of the step time (seconds); they sum to step_time_s (STYLE habit 7).
struct Breakdown {
  double compute_s = 0;        // GPU busy computing (forward, recompute, backward, GPU optimizer)
  double stall_s = 0;          // GPU waiting inside the step: deliveries, links, host bandwidth, CPU
  double exposed_tail_s = 0;   // after the last backward: reduction + update of the last chunks
  double exposed_head_s = 0;   // before the first forward: delivery of the first unit's chunks
  double post_update_s = 0;    // baselines that update after backward: the serial update phase
  double sync_s = 0;           // latencies on the critical path and the hardware's synchronisation term
  double total() const {
    return compute_s + stall_s + exposed_tail_s + exposed_head_s + post_update_s + sync_s;
  }
};

// Resource names used by the model, the simulator, the executor's measurements and reports.
namespace resource {
inline constexpr const char* kGpuCompute = "gpu_compute";
inline constexpr const char* kH2D = "h2d_link";
inline constexpr const char* kD2H = "d2h_link";
inline constexpr const char* kDuplex = "link_duplex";
inline constexpr const char* kH2DRoot = "pcie_root_h2d";
inline constexpr const char* kD2HRoot = "pcie_root_d2h";
inline constexpr const char* kHostMem = "host_mem";
inline constexpr const char* kCpuUpdate = "cpu_update";
inline constexpr const char* kCpuCores = "cpu_cores";
inline constexpr const char* kFabric = "gpu_fabric";
inline constexpr const char* kNetwork = "network";  // between nodes
}  // namespace resource

struct Prediction {
  std::string method;  // "analytical" | "simulator"
  std::string system;
  bool feasible = true;
  std::vector<std::string> infeasible_reasons;
  double step_time_s = 0;
  Breakdown breakdown;
  std::map<std::string, double> busy_s;  // per resource (per-rank resources: rank 0): work / capacity
  // Simulator only: per resource, how long it had work in flight (the union of its tasks' spans on
  // rank 0), which is what an executor's measured timeline shows for the same resource.
  std::map<std::string, double> span_busy_s;
  double lower_bound_s = 0;              // max over resources of demand / capacity
  double critical_path_s = 0;            // the pipeline with no sharing slowdowns (analytical only)
  std::string bottleneck;                // busiest resource
  double bottleneck_utilization = 0;     // its busy / step time
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;             // model FLOPs (SlideFormer's formula) per GPU per second
  double exposed_s = 0;                  // step time not covered by GPU compute
  MemoryEstimate memory;
};

// Stretches a predicted step by the hardware's synchronisation factor (Hardware::sync at the plan's
// rank count, >= 1), the difference counted as synchronisation; the critical path stretches with it
// (it is a pipeline time too), the resource bound does not (it is work over capacity).
void add_sync_term(Prediction& p, double factor);

// The figures both methods derive from a finished step time and busy times: the bottleneck (the
// resource busiest relative to the step) and the throughput of `gpus` GPUs in all.
void add_bottleneck_and_throughput(Prediction& p, double tokens_per_step, double model_flops_per_step, int gpus);

}  // namespace slidedp
