// What train() builds before the first step, each piece from the options and the plan: the run's
// shape (the plan as the system runs it, ranks, nodes, the baselines' buffers), the starting weights,
// the pacer, and the backend's, updater's, host state's and drivers' configurations; and the checks
// made before anything is allocated (host memory, the device memory account, the nodes' agreement).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "executor/backend.h"
#include "executor/backend_options.h"
#include "executor/host_state.h"
#include "executor/rank_driver.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "executor/updater.h"
#include "io/checkpoint.h"
#include "io/unit_tensors.h"
#include "model/system.h"

namespace slidedp::exec {

// What every later piece reads: derived once from the options.
struct RunShape {
  SystemTraits traits;
  Plan plan;  // as the system runs it, with the update after the backward when clipping or skipping
  int ranks = 1, units = 0;
  int nodes = 1, node = 0;
  NodeLink* link = nullptr;    // several nodes only
  bool sharded_nodes = false;  // the host state sharded across nodes
  bool split_master = false;
  // The baselines' device buffers of their own (rank_driver.h), for the account and the drivers.
  bool fetch_fp32 = false;         // FSDP offload
  bool accumulate_on_gpu = false;  // ZeRO-Offload with accumulation
  bool widen_grad = false;         // ZeRO-Offload on one rank: the gradient leaves as fp32
  bool partition_round_trip = false;  // ZeRO-3-Offload: the partition out and back in each micro-step
  DType wire = DType::kBF16;       // parameters and gradients on the links
  int64_t staged_grad_bytes = 2;   // per element of a gradient in a cpu-route staging slot
  bool verify = false;             // the update after the backward
};

// Refuses what the system cannot run (FSDP2's host-side features) and what the host cannot hold
// (its RAM, the pinned limit), naming the largest items.
RunShape run_shape(const TrainOptions& o, const ModelLayout& layout);

// A checkpoint to resume (its architecture checked against the run's), a Hugging Face folder, or
// random weights.
struct InitialWeights {
  std::optional<CheckpointReader> checkpoint;
  UnitBuffers weights;  // when no checkpoint
  int64_t start_step = 0;
};
InitialWeights load_initial_weights(const TrainOptions& o, const ModelLayout& layout);

// Pacing to a target machine (o.emulate): the model's work for this plan on it, one pacer for every
// stream and the updater; null without a target. `scale` receives the time scale used.
std::shared_ptr<const TargetPacing> make_pacing(const TrainOptions& o, const RunShape& shape, double& scale);

// Several nodes: the binary, model, plan, data, starting weights and optimizer the same on every node.
void check_nodes_run_the_same(NodeLink& link, const TrainOptions& o, const ModelLayout& layout,
                              const RunShape& shape, const InitialWeights& init);

BackendOptions backend_options(const TrainOptions& o, const RunShape& shape,
                               std::shared_ptr<const TargetPacing> pacing);

// Rejects a plan whose device memory cannot fit before anything runs, with the numbers: the account
// the planner uses, over this backend's units and allocator. Returns rank 0's account.
RankMemoryAccount check_device_memory(const TrainOptions& o, const ModelLayout& layout, const RunShape& shape,
                                      Backend& backend);

UpdaterConfig updater_config(const TrainOptions& o, const ModelLayout& layout, const RunShape& shape,
                             const TargetPacing* pacing, const InitialWeights& init);
// With tracing: the updater's jobs as spans on the host's "cpu update" track.
void trace_updates(UpdaterConfig& uc, Backend& backend);

HostStateOptions host_state_options(const TrainOptions& o, const RunShape& shape);
// The starting weights into the state (a checkpoint unit by unit, this node's shard only); the
// loaded buffers are released.
void load_initial_state(HostState& state, InitialWeights& init);

// Threads of the CPU update: the options', the plan's, else every core (SlideFormer's rank 0 and
// MegaTrain's main process: one process's share).
int update_thread_count(const TrainOptions& o, const RunShape& shape);

DriverConfig driver_config(const TrainOptions& o, const RunShape& shape, int rank,
                           const TargetPacing* pacing);

}  // namespace slidedp::exec
