// The work one training step puts on each resource, per unit: GPU compute seconds, bytes over each
// host link and the GPU fabric, host-memory bytes and CPU thread-seconds, for a (workload, hardware,
// plan, system). The analytical model and the discrete-event simulator both schedule exactly this
// work, so they can disagree only about overlap and sharing, never about how much work there is.
//
// Conventions: bytes are per rank unless named `all_ranks`; CPU work is thread-seconds on the shared
// host; "delivery" is one use of a unit's parameters on a rank (forward, backward, tied head).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/hardware.h"
#include "model/plan.h"
#include "model/system.h"
#include "model/workload.h"

namespace slidedp {

// Effective capacities of every resource for this plan on this hardware (bytes/s, thread counts).
struct Capacities {
  int ranks = 1;
  double h2d_link_Bps = 0;     // one rank's link with all ranks copying (root share applied)
  double d2h_link_Bps = 0;
  double h2d_alone_Bps = 0;    // one link when it copies alone
  double d2h_alone_Bps = 0;
  double h2d_root_Bps = 0;     // all links of the host together, one direction
  double d2h_root_Bps = 0;
  double duplex_Bps = 0;       // one link, H2D + D2H together, both directions busy
  double host_mem_Bps = 0;     // shared host-memory bandwidth
  double cpu_cores = 1;        // thread-seconds per second the host has
  double update_threads = 1;   // threads reduction + AdamW may use
  double adamw_params_per_thread_s = 0;  // per thread, at update_threads
  double reduce_Bps_per_thread = 0;      // input bytes per thread-second
  double convert_Bps_per_thread = 0;     // fp32 bytes read per thread-second (SlideFormer)
  double convert_threads_per_rank = 1;   // SlideFormer: each rank's process converts with its share of cores
  double allgather_busbw_Bps = 0;        // per rank port (nccl-tests bus bandwidth)
  double reduce_scatter_busbw_Bps = 0;
  double link_latency_s = 0;
  double fabric_latency_s = 0;
  bool fabric_via_host = false;
  bool emulated = false;       // CPU backend: device compute and copies run on host cores
  double host_threads_per_device = 1;
  double gpu_hbm_Bps = 0;
  double sync_factor = 1;      // Hardware::sync at this rank count: the step's stretch (>= 1)
  int nodes = 1;               // the plan's nodes (each a host like this one)
  double nic_Bps = 0;          // one node's network, per direction
  double nic_latency_s = 0;    // per message
};

// How a system runs the pipeline (derived from System; SlideDP's values come from the plan).
struct SystemTraits {
  bool stream_params = true;         // per-unit H2D delivery from host memory
  bool params_resident = false;      // bf16 parameters live on the GPU (ZeRO-Offload)
  bool gpu_sharded_state = false;    // FSDP2: everything on GPU, sharded
  bool convert_on_load = false;      // SlideFormer: fp32 -> bf16 per rank before each delivery
  bool update_after_backward = false;  // the optimizer runs after backward, not overlapped
  // With update_after_backward: each unit's chunks are released to the next step's deliveries as they
  // are updated, unit 0 first, so the update overlaps the next step's forward in layer order
  // (SlideDP's clipping); else the next step waits for the whole update (the baselines' optimizer.step()).
  bool update_in_layer_order = false;
  bool shared_grad_buffer = false;   // SlideFormer: D2H of unit u waits for the update of unit u+1
  int barriers_per_chunk = 0;        // SlideFormer: two barriers per chunk around rank 0's work
  bool lock_serialized_accumulation = false;  // MegaTrain: ranks add grads on the host one at a time
  double update_threads_override = 0;  // >0: threads of the process that updates (one rank's share)
  bool upload_after_update = false;  // ZeRO-Offload: H2D of the new partition + all-gather after update
  bool gpu_optimizer = false;        // FSDP2: AdamW on the GPU
  // Bytes per element of the gpu route's reduced shard, what leaves the GPU and the updater reads:
  // SlideDP sums the ranks' bf16 gradients in fp32 and keeps the sum (the cpu route's exact result);
  // ZeRO-Offload's partition leaves as fp32 on the last micro-step (DeepSpeed casts it on the GPU and
  // copies it into the optimizer's fp32 gradient buffer).
  double grad_shard_bytes = 4.0;
  // Bytes per element of a rank's whole gradient leaving by the cpu route (one rank's ZeRO-Offload
  // partition is the whole model: fp32 as above).
  double grad_bytes = 2.0;
  // ZeRO-Offload (DeepSpeed stage 2 with cpu_offload, `async_accumulate_grad_in_cpu_via_gpu`):
  // gradients accumulate on the GPU in fp16 through a pinned host buffer, every micro-step but the
  // first copying the sum so far back in and every one but the last copying the new sum out, on the
  // compute stream (`overlap_comm` off, DeepSpeed's default); the host does no arithmetic on gradients
  // (the boundary's fp32 copy lands in the optimizer's gradient buffer).
  bool accumulate_on_gpu = false;
  // DeepSpeed ZeRO-3 with the optimizer offloaded (stage3.py partition_grads): every micro-step the
  // reduced bf16 partition goes to the pinned host gradient buffer and back to the GPU (from the
  // second micro-step on, the sum so far comes in first and is added on the GPU before it goes out),
  // on the reduce stream beside compute; on the last one the GPU's cast of it to fp32 goes to the
  // optimizer's gradient (grad_shard_bytes). No gradient leaves otherwise; the host adds none.
  bool partition_round_trip = false;
  // Bytes per parameter a delivery copies from host memory before the all-gather: bf16 (2), or
  // FSDP's CPU-offloaded fp32 shard (4), cast to bf16 on the GPU.
  double param_fetch_bytes = 2.0;
  CpuOptimizer cpu_optimizer = CpuOptimizer::kSlideDP;  // whose optimizer runs on the host
  bool update_on_all_cores = false;  // every rank's process updates its partition: all cores together
  // DeepSpeed ZeRO-3 gathers a module's parameters in its forward hook and releases them after; a
  // checkpointed layer's recompute is a forward, so its parameters come three times a step (forward,
  // recompute, backward) where a kept layer's come twice.
  bool refetch_for_recompute = false;
  // Host-memory bytes per parameter of one fused AdamW update with bf16 gradients, the bf16 mirror
  // written in the same pass (kernels/cpu/optim/adamw.h): an fp32 master reads p 4 + g 2 + m 4 + v 4 and
  // writes p 4 + m 4 + v 4 + mirror 2 = 28; SlideDP's split master (executor/host_state.h) reads and
  // writes the mirror and a 16-bit remainder instead of p (4) and, written, p and the mirror (6): 26.
  double adamw_host_bytes_per_param = 28.0;
};

// Whether the update follows the backward (clipping, skipping: Plan::verify_updates; or the system's
// own placement), and whether every unit's gradient is then held in the fp32 accumulator until the
// step's last micro-step (so too with accumulation); FSDP2 accumulates on its devices.
inline bool updates_after_backward(const Plan& plan, const SystemTraits& traits) {
  return plan.verify_updates || traits.update_after_backward;
}
inline bool accumulates_every_unit(const Plan& plan, const SystemTraits& traits) {
  return (plan.accum_steps > 1 || updates_after_backward(plan, traits)) && !traits.gpu_optimizer;
}

// Work of one unit. GPU seconds and link bytes are per rank per micro-step; CPU and host-memory work
// is for all ranks together.
struct UnitWork {
  UnitKind kind = UnitKind::kDecoder;
  int index = 0;
  int64_t numel = 0;            // flat elements (parameters incl. alignment padding)
  int64_t chunks = 1;           // chunks of chunk_numel (parameter deliveries)
  int64_t grad_chunks = 1;      // chunks of gradients leaving (the tied head adds the embedding's)
  ActivationPolicy policy = ActivationPolicy::kKeep;
  // GPU compute, seconds per rank per micro-step. The head's forward includes its fused backward.
  double fwd_s = 0, bwd_s = 0, recompute_s = 0;
  // One delivery of the unit's parameters to one rank.
  double deliver_h2d_bytes = 0;       // bytes over this rank's host link
  double deliver_allgather_bytes = 0; // bytes on this rank's fabric port (sharded route)
  double deliver_convert_thread_s = 0;  // CPU work of SlideFormer's per-rank conversion
  double deliver_host_mem_bytes = 0;  // host-memory traffic of one delivery to one rank
  double deliver_d2h_bytes = 0;       // via_host fabric: this rank's shard written to host memory
  // Tied head: the embedding weight delivered in addition to the head's own parameters.
  double tied_h2d_bytes = 0, tied_allgather_bytes = 0, tied_host_mem_bytes = 0;
  // Gradients of one micro-step leaving one rank.
  double grad_reduce_scatter_bytes = 0;  // fabric bytes (gpu route)
  double grad_nic_bytes = 0;  // several nodes, gpu route: the reduce-scatter's bytes on this node's network
  double grad_d2h_bytes = 0;             // bytes over this rank's link
  double tied_grad_d2h_bytes = 0;        // head: the tied embedding's gradient contribution
  // accumulate_on_gpu, per rank: the fp16 sum so far back in on micro-steps 1..A-1 and the GPU's add
  // of it, the new sum out on micro-steps 0..A-2 (then grad_d2h_bytes leaves on the last only).
  double accum_in_h2d_bytes = 0, accum_out_d2h_bytes = 0, accum_add_gpu_s = 0;
  // partition_round_trip, per rank and micro-step: the 16-bit partition out and back in (then
  // grad_d2h_bytes leaves on the last micro-step only).
  double trip_out_d2h_bytes = 0, trip_in_h2d_bytes = 0;
  // Host CPU work of the unit's gradients, all ranks together: `last` = the final micro-step
  // (reduce + AdamW, bf16 mirror written), `accum` = each earlier micro-step (reduce/accumulate).
  double cpu_last_thread_s = 0, cpu_accum_thread_s = 0;
  double cpu_last_host_mem_bytes = 0, cpu_accum_host_mem_bytes = 0;
  // Activation offload (offload policy): bytes of the unit input out in forward, back in backward.
  double act_offload_bytes = 0;
  // Several nodes, every micro-step (the executor sums each micro-step across nodes, in global rank
  // order): cpu_last_* / cpu_accum_* are then the node-local reduction of the ranks' gradients into
  // fp32 (before the exchange); the node sends and receives `nic_exchange_bytes` of it (all-reduce or
  // reduce-scatter), then runs `cpu_after_exchange_*` on the last micro-step (combining what arrived,
  // AdamW on its owned part; in verify mode the accumulation, the update follows the backward) or
  // `cpu_accum_after_exchange_*` on the others (combining, adding into the fp32 accumulator); on the
  // last, a sharded host state then all-gathers the updated bf16 mirror (`nic_gather_bytes` per node).
  // `nic_host_mem_bytes`: one exchange's host-memory traffic (with the gather on the last). The gpu
  // route exchanges nothing here (its reduce-scatter spans the nodes: grad_nic_bytes): cpu_last_* /
  // cpu_accum_* are the update of the node's part, and a sharded state's gather follows.
  double nic_exchange_bytes = 0, nic_gather_bytes = 0, nic_host_mem_bytes = 0;
  double cpu_after_exchange_thread_s = 0, cpu_after_exchange_host_mem_bytes = 0;
  double cpu_accum_after_exchange_thread_s = 0, cpu_accum_after_exchange_host_mem_bytes = 0;
  double nic_messages = 0;  // messages of one chunk's exchange and gather (their latency)
};

// Equal in all the work (everything but the index): the recurrence's per-unit maps of two such
// units are the same, which is what lets it jump over runs of identical layers (regime_jump.h).
bool same_work(const UnitWork& a, const UnitWork& b);

struct StepWork {
  Capacities cap;
  SystemTraits traits;
  std::vector<UnitWork> units;  // execution order, L + 2 entries
  int ranks = 1;
  int accum_steps = 1;
  int buffer_depth = 2;
  int64_t tokens_per_rank_micro = 0;  // micro_batch x seq_len
  int64_t tokens_per_step = 0;
  double model_flops_per_step = 0;    // SlideFormer's metric, for TFLOP/s figures
  // System-level extra work after backward (ZeRO-Offload, MegaTrain, FSDP2), all ranks together.
  double post_update_thread_s = 0, post_update_host_mem_bytes = 0;
  double post_upload_h2d_bytes = 0, post_allgather_bytes = 0;  // per rank
  double post_gather_nic_bytes = 0;  // several nodes, sharded state: the updated mirror's all-gather, per node
  double post_gpu_s = 0;  // FSDP2 GPU optimizer, per rank
};

// Resolves the update thread count (the plan's value, or one per core like the executor's pool).
int resolve_update_threads(const Plan& plan, const Hardware& hw);
SystemTraits system_traits(System system);
// Applies a baseline's fixed choices to the plan (routes, activation policy, chunk, depth).
Plan plan_for_system(const Plan& plan, System system, const ModelCard& card);

// Throws InputError if the plan cannot run on this hardware at all (ranks > GPUs, ...).
StepWork build_step_work(const Workload& w, const Hardware& hw, const Plan& plan, System system);

// Compute seconds of one unit pass from FLOPs or from measured unit times; exposed for the profiler.
struct UnitComputeTimes {
  double fwd_s = 0, bwd_s = 0, recompute_s = 0;
};
// `mlp_token_tile` > 0 (decoder): the gate/up GEMMs move from recompute into backward and a kept
// layer runs them once more (model_costs.h, UnitFlops::mlp_gate_up_matmul). `layer`: the decoder
// layer whose shape counts (ignored for the embedding and the head).
UnitComputeTimes unit_compute_times(const Workload& w, const Hardware& hw, UnitKind kind, int layer,
                                    int64_t sequences, int64_t mlp_token_tile = 0);

}  // namespace slidedp
