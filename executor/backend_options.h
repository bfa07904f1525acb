// How a backend is made: devices, memory budgets, numerics and tiling, and what only one backend
// reads (the CPU backend's pacing and threads, the CUDA backend's collectives and kernel activity).
// Filled by the run's set-up (executor/run_setup.h) and the profiler, read by make_backend and the
// backends.
#pragma once

#include <cstdint>
#include <memory>

#include "executor/node_link.h"
#include "executor/target_pacing.h"

namespace slidedp::exec {

struct BackendOptions {
  int devices = 1;
  int64_t device_budget_bytes = 0;                    // per rank; 0: the backend's default (device_budget.h)
  int64_t device_reserve_bytes = int64_t{512} << 20;  // what a default GPU budget leaves free (the plan's)
  bool exact_fp32 = false;
  int64_t loss_chunk_tokens = 256;
  int64_t mlp_token_tile = 0;     // decoder MLP token tile (plan key mlp_token_tile); 0 = untiled
  bool packed_documents = false;  // micro-batches carry document positions (UnitOpArgs::positions)
  // The plan runs collectives (all-gather / reduce-scatter between ranks): the CUDA backend creates
  // its NCCL communicators at construction, before any step, and checks their memory.
  bool collectives = false;
  // CUDA: every kernel, copy and memset from CUPTI on the measured timeline (slidedp-run --trace-kernels).
  bool kernel_activity = false;
  int blas_threads = 0;  // CPU backend: cores per emulated device (0 = 1)
  // CPU backend: run at a target machine's ratios (slidedp-run --emulate); null: at this host's speed.
  std::shared_ptr<const TargetPacing> pacing;
  // Several nodes with the gpu gradient route: reduce_scatter spans every node's ranks (this node's
  // rank r is rank node * devices + r of nodes * devices, shard_range over all of them); all_gather
  // stays within the node. Null: collectives are the node's.
  NodeLink* cross_node = nullptr;
};

}  // namespace slidedp::exec
