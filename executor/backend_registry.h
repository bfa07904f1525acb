// Creates a backend by name. The only place that knows which backends were compiled in: the CUDA
// backend registers here when the build has it (SLIDEDP_HAVE_CUDA), and nowhere else in the executor
// does a CUDA type or #if appear (STYLE habit 2).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/backend.h"
#include "executor/node_link.h"
#include "executor/run_control.h"
#include "executor/target_pacing.h"
#include "model/model_card.h"
#include "model/unit_layout.h"

namespace slidedp::exec {

struct BackendOptions {
  int devices = 1;
  int64_t device_budget_bytes = 0;  // per rank; 0: the backend's default (device_budget.h)
  int64_t device_reserve_bytes = int64_t{512} << 20;  // what a default GPU budget leaves free (the plan's)
  bool exact_fp32 = false;
  int64_t loss_chunk_tokens = 256;
  int64_t mlp_token_tile = 0;  // decoder MLP token tile (plan key mlp_token_tile); 0 = untiled
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

// "cpu" or "cuda". Throws InputError for an unknown or unavailable backend, naming the ones built in.
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelCard& card, const ModelLayout& layout,
                                      const BackendOptions& options, RunControl& control);
std::vector<std::string> available_backends();
// Bytes per activation element of the named backend's units (fp32 on the CPU, bf16 on CUDA): what an
// offloaded layer input takes in host memory, known before the backend is made.
int64_t backend_activation_bytes(const std::string& name);
// GPUs the CUDA backend sees (0 without CUDA or without a GPU); never throws.
int cuda_device_count();

}  // namespace slidedp::exec
