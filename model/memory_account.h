// The one account of a SlideDP rank's device memory: what the planner, the model and both backends'
// up-front checks charge a plan for. It replays the rank driver's allocation order over one step
// (executor/rank_driver.cc: parameter slots in LRU order, hidden states by activation policy, saved
// state, unit scratch, gradient buffers in fp32 and in the wire dtype, the backend's own scratch), with
// every buffer rounded as the backend's allocator rounds it, and reports the largest set held at once.
// To that come the buffers the pipeline keeps in flight by design -- the previous unit's gradient
// draining to the host while the next one computes, offloaded inputs still being copied out -- and the
// runtime's own memory (CUDA context, NCCL's buffers), which only a GPU can measure and the hardware
// profile states. tests/executor/memory_account_test.cc checks the replay against the driver's
// measured allocations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "model/plan.h"
#include "model/system.h"
#include "model/unit_memory.h"

namespace slidedp {

// The device buffers a baseline's rank driver holds all run besides SlideDP's own (executor/rank_driver.h,
// decided by the trainer from the system's traits).
struct SystemDeviceBuffers {
  bool sharded_state = false;      // FSDP2: the rank's fp32 master, AdamW m and v and gradient shards
  bool fetch_fp32 = false;         // FSDP offload: one chunk's fp32 shard on its way to the parameter dtype
  // ZeRO-Offload with accumulation, ZeRO-3-Offload: the scratch target of the gradient's round trip
  bool accumulate_on_gpu = false;
  bool widen_grad = false;  // ZeRO-Offload on one rank: a chunk of the gradient cast to fp32 for its copy
};

struct MemoryItem {
  std::string name;  // "parameter slots (2 deep)", "fp32 master weights", ...
  double bytes = 0;
};

// What the account needs to know about the backend running the plan.
struct RankMemorySpec {
  UnitMemory decoder, head;          // the backend's units at the plan's (micro-batch, seq_len)
  std::vector<UnitMemory> decoder_by_layer;  // layers of different shapes (Gemma 4): one per layer;
                                             // empty: `decoder` for every layer
  const UnitMemory& layer_memory(int layer) const {
    return decoder_by_layer.empty() ? decoder : decoder_by_layer.at(static_cast<size_t>(layer));
  }
  int64_t param_bytes = 2;           // per parameter-slot element (bf16; fp32 for --exact)
  int64_t wire_bytes = 2;            // per gradient element sent to the host (bf16; fp32 for --exact)
  int64_t align_bytes = 256;         // every buffer rounded up to this (CUDA 256, CPU 64)
  bool zero_bytes_take_one = true;   // CUDA rounds an empty request up to one aligned block
  int64_t embedding_backward_scratch_bytes = 0;  // CUDA: the deterministic scatter-add's sort scratch
  int64_t router_stats_bytes = 0;  // MoE models: the micro-batch's router statistics (unit_memory.h)
  bool document_positions = false;  // packed documents: the (B, T) int32 positions travel with the tokens
  // CUDA's gpu route: the reduce-scatter receives the peers' pieces of the rank's shard of each chunk
  // ((W-1) x shard, wire dtype) before summing them; across nodes it widens a bf16 chunk to fp32.
  bool reduce_scatter_staging = false;
  int64_t runtime_bytes = 0;         // CUDA context and libraries (hardware profile)
  int64_t collective_bytes = 0;      // NCCL's buffers of the rank's communicator, when ranks > 1
  SystemDeviceBuffers system;  // a baseline's buffers, charged for rank 0 (whose shards are the largest)
};

struct RankMemoryAccount {
  std::vector<MemoryItem> items;  // by category, at the peak; they sum to peak_bytes
  double peak_bytes = 0;          // items' sum: the plan's device memory per rank
  double driver_peak_bytes = 0;   // the largest set of buffers the rank driver holds at once
                                  // (what the backend's live-bytes high-water mark measures)
  std::string peak_at;            // where in the step the peak falls, e.g. "backward of layer 31"
};

// Per-rank device memory of `plan` for the model of `layout`. `tied`: the head reads unit 0.
RankMemoryAccount rank_memory_account(const ModelLayout& layout, const Plan& plan, int64_t seq_len, bool tied,
                                      const RankMemorySpec& spec);

// FSDP2's device shard of unit `unit` for `rank`: the rank's piece of every chunk, in elements (each of
// the four state buffers holds this many fp32 values; the rank driver allocates them by it).
int64_t sharded_state_numel(const ModelLayout& layout, const Plan& plan, int unit, int rank);

// Whether `system` can hold its master split (executor/host_state.h): SlideDP's state with a bf16 mirror
// (not --exact); the baselines hold fp32 masters, as the systems they stand for do. The default where
// it can.
inline bool can_split_master(System system, bool exact_fp32) {
  return system == System::kSlideDP && !exact_fp32;
}

// What the executor allocates on the host besides the state's size, for a plan as a system runs it.
struct HostMemorySpec {
  int64_t hidden_bytes_per_token = 0;  // an offloaded layer input per token (the backend's activation dtype)
  int64_t mirror_bytes = 2;            // the delivery mirror and the wire per element (bf16; fp32 for --exact)
  bool split_master = false;           // the fp32 master held as the mirror plus a 16-bit remainder
  OptimizerStates moments = OptimizerStates::kFp32;  // how AdamW's m and v are held
  bool accumulate_all = false;         // an fp32 gradient accumulator of every unit
  bool accumulate_unit0 = false;       // of the tied embedding only (the head's part of its gradient)
  int64_t convert_staging_bytes = 0;   // per rank, two buffers (SlideFormer converts before each delivery)
  bool device_nonfinite_count = false; // FSDP2: each rank's host copy of its gradient check (4 bytes)
  int64_t accum_source_bytes = 0;  // ZeRO-Offload with accumulation, ZeRO-3: per rank, the pinned source of
                                   // the gradient sum's copy back in (one staging slot)
  int64_t staged_grad_bytes = 2;   // per element of a gradient in a cpu-route staging slot
};

// The spec of `system` running `plan` (as plan_for_system returns it, verify_updates set for clipping or
// skipping) on a backend whose activations take `hidden_bytes_per_token`: what the trainer allocates.
// SlideDP splits its master unless exact (the trainer's default; --master fp32 sets it back).
HostMemorySpec host_memory_spec(const ModelLayout& layout, const Plan& plan, System system, bool tied,
                                bool exact_fp32, int64_t hidden_bytes_per_token);

// Bytes per element of a gradient the cpu route copies into a staging slot: the wire dtype's, or the
// system's own where it copies wider (ZeRO-Offload's partition leaves as fp32: DeepSpeed casts it on
// the GPU before the copy, stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu).
int64_t staged_grad_bytes(System system, int64_t wire_bytes);

// Whether a rank casts its gradient to that width on the device before the copy: the cpu route (one
// rank, where the gpu route has nothing to reduce) of a system that copies wider than the wire.
bool widens_grad_on_device(const Plan& plan, System system, int64_t wire_bytes);

// One slot of a rank's gradient staging ring, 64-byte aligned: a chunk at `staged_bytes` per element
// (staged_grad_bytes) on the cpu route, the fp32 shard of one on the gpu route. The trainer allocates
// it; the account charges it.
int64_t grad_staging_slot_bytes(const ModelLayout& layout, const Plan& plan, int64_t staged_bytes);

// The device buffer a delivery of FSDP's CPU offload copies one chunk's fp32 shard into (rank 0's
// shard, the largest; the whole chunk with one rank), 64-byte aligned. The rank driver allocates it;
// the trainer's up-front account charges it.
int64_t fp32_fetch_bytes(const ModelLayout& layout, const Plan& plan);

// Host memory of the executor for the plan (HostState, staging rings, token and offload buffers, the
// system's own): items and their sum. The model charges SlideDP's host memory with it, and the trainer
// refuses a run whose items exceed the host's RAM before allocating any of them.
std::vector<MemoryItem> host_memory_items(const ModelLayout& layout, const Plan& plan, int64_t seq_len,
                                          const HostMemorySpec& spec);

}  // namespace slidedp
