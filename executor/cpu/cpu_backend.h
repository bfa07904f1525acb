// The CPU backend: N emulated GPUs on this host, so the whole pipeline runs, and is tested, without a
// GPU. Each device is a set of worker threads (one per stream) executing queued work in order, with a
// memory arena whose byte budget allocation cannot exceed, events, host counters, memcpy copies and
// shared-memory collectives. Unit operations run the CPU transformer math (kernels/cpu/transformer)
// in fp32 on the bf16 values delivered (or on fp32 in the exact mode used by equivalence tests).
// Device compute and copies consume this host's cores and memory bandwidth: the hardware profile of
// the CPU backend says so (gpu.emulated_on_host), and the model predicts these runs too.
#pragma once

#include <memory>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "executor/backend.h"
#include "executor/node_link.h"
#include "executor/run_control.h"
#include "executor/target_pacing.h"

namespace slidedp::exec {

struct CpuBackendOptions {
  int devices = 1;
  int64_t device_budget_bytes = int64_t{1} << 34;  // per emulated device
  bool exact_fp32 = false;  // deliver fp32 parameters (no bf16 rounding) for exact tests
  // Cores per emulated device (BLAS and attention threads). 0: 1 -- each emulated GPU is one compute
  // core, so its speed does not depend on how many devices share the host, and the model charges
  // each device's compute to one host core (gpu.host_threads_per_device).
  int blas_threads = 0;
  int64_t loss_chunk_tokens = 256;
  int64_t mlp_token_tile = 0;  // DecoderSpec::mlp_token_tile: 0 = the MLP over all tokens at once
  // Run at a target machine's ratios (executor/target_pacing.h); null: at this host's speed.
  std::shared_ptr<const TargetPacing> pacing;
  NodeLink* cross_node = nullptr;  // BackendOptions::cross_node
};

std::unique_ptr<Backend> make_cpu_backend(const ModelCard& card, const ModelLayout& layout,
                                          const CpuBackendOptions& options, RunControl& control);

}  // namespace slidedp::exec
