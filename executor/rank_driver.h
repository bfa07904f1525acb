// One rank's driver: the thread that issues a step's work onto the rank's streams in program order,
// like a CUDA host thread (it never waits for the GPU except to reuse its own host buffers). Per
// micro-step: forward over units with parameter deliveries into `depth` LRU slots, activation
// policies (keep / recompute / offload with a 2-deep prefetch), the head's fused loss, backward in
// reverse, and each unit's gradient sent by the plan's route (cpu: D2H into the staging ring; gpu:
// reduce-scatter, then D2H of this rank's shard). Parameter chunks of step s are delivered only once
// the updater has applied step s-1 to them (host counters), which is the whole synchronization.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "card/shard_range.h"
#include "executor/backend.h"
#include "executor/host_state.h"
#include "executor/run_control.h"
#include "executor/target_pacing.h"
#include "executor/updater.h"
#include "io/sequence_sampler.h"
#include "model/plan.h"

namespace slidedp::exec {

class EvalTally;

struct DriverConfig {
  int rank = 0;   // this node's device
  int ranks = 1;  // devices per node
  // Multi-node: this node and the node count; the rank's data is that of global rank node*ranks+rank.
  int node = 0;
  int nodes = 1;
  Plan plan;  // routes, micro-batch, accumulation, chunk, activation policies, depth
  int64_t seq_len = 0;
  DType wire_dtype = DType::kBF16;  // per-rank gradients on their way to the host
  bool tied = false;
  // Mixture-of-experts models: the coefficient of the router's load-balancing loss (0: off; the
  // statistics are kept either way). The loss adds coefficient x the mean over the step's sequences.
  double router_aux_loss_coef = 0;
  // Test hook: after the backward of (step, unit) on this rank, overwrite the first gradient element
  // with NaN (fault injection); -1 disables.
  int64_t inject_nan_step = -1;
  int inject_nan_unit = -1;
  // Test hook: throw from this rank's compute stream at (step, unit) of backward; -1 disables.
  int64_t inject_throw_step = -1;
  int inject_throw_unit = -1;
  // SlideFormer's data movement (executor --system slideformer-dp): each delivery chunk is converted
  // from the fp32 master into this rank's own pinned staging on a host thread (the comm stream's: the
  // route uses no collectives), then copied; and the gradient of unit u leaves only after unit u+1 has
  // been updated (one shared pinned gradient buffer).
  bool convert_on_load = false;
  bool shared_grad_buffer = false;
  // ZeRO-Offload's (--system zero-offload): every unit's parameters stay on the device in their own
  // slot (the plan's depth covers all units); each step, once the updater has applied a chunk, the
  // rank uploads its partition of it into the resident buffer and the ranks all-gather the rest.
  bool resident_params = false;
  // MegaTrain's and ZeRO-Offload's: the optimizer step after the backward finishes before the next
  // step moves any parameter (their training loop calls step() and only then the next forward), so
  // every delivery of step s waits for the last chunk of step s-1's update, not only its own chunk.
  bool whole_update_gate = false;
  // FSDP2's (--system fsdp2): this rank holds its shard of every chunk's fp32 master, AdamW moments
  // and gradient on the device (loaded from the host state at the start, written back by
  // store_state); a delivery converts the shard to the parameter dtype and all-gathers the rest; a
  // gradient is reduce-scattered into the shard's accumulator; after the last micro-step the rank
  // runs AdamW on its shard on the device and reports it to the updater.
  bool device_optimizer = false;
  // DeepSpeed ZeRO-3's (--system zero3-offload): a module's parameters are gathered in its forward
  // hook and released after it, and a checkpointed layer's recompute is a forward, so such a layer's
  // parameters are fetched again for its backward (three fetches a step where a kept layer has two).
  bool refetch_for_recompute = false;
  // ZeRO-Offload's with accumulation (DeepSpeed's `async_accumulate_grad_in_cpu_via_gpu`, model/
  // step_work.h SystemTraits::accumulate_on_gpu): on the compute stream after each chunk's reduction,
  // every micro-step but the first copies the sum so far back in and every one but the last copies the
  // new sum out (the last one's leaves by the D2H stream as before). The executor keeps its exact fp32
  // accumulation on the host, so the copy back in moves DeepSpeed's bytes into a scratch buffer and the
  // GPU's add is not run: the copies hold the compute stream and the link as DeepSpeed's do.
  bool accumulate_on_gpu = false;
  // FSDP's CPU offload (--system fsdp-offload, `CPUOffload(offload_params=True)`): the parameters on
  // the host are the fp32 master, so a delivery copies this rank's fp32 shard of each chunk (the whole
  // chunk with one rank) into a device buffer, casts it to the parameter dtype on the comm stream (as
  // FSDP's unshard does) and all-gathers the rest.
  bool fetch_fp32 = false;
  // ZeRO-Offload's on one rank (nothing to reduce, the cpu route): DeepSpeed casts the partition to
  // fp32 on the GPU before its copy to the host (stage_1_and_2.py
  // async_inplace_copy_grad_to_fp32_buffer_from_gpu), so the last micro-step's gradient is widened
  // chunk by chunk into one device buffer on the D2H stream and leaves as fp32 (4 bytes an element;
  // the values are the bf16 gradient's, so the update is bitwise the same).
  bool widen_grad = false;
  // ZeRO-3's round trip of each chunk's 16-bit partition (model/step_work.h
  // SystemTraits::partition_round_trip): out and back in on every micro-step, on the D2H stream before
  // the gradient leaves, between the two scratch buffers of accumulate_on_gpu. On all but the last
  // micro-step the gradient that leaves (the executor's exact one: fp32 shards on the gpu route) is
  // tagged as the copy out.
  bool partition_round_trip = false;
  const TargetPacing* pacing = nullptr;  // paces the conversions (slidedp-run --emulate); may be null

  // The gpu gradient route: a reduce-scatter over every node's ranks (BackendOptions::cross_node
  // across nodes), then this rank's shard of a chunk of `count` elements to the host.
  bool gpu_route() const { return plan.grad_route == GradRoute::kGpu && nodes * ranks > 1; }
  ShardRange grad_shard(int64_t count) const { return shard_range(count, nodes * ranks, node * ranks + rank); }
};

class RankDriver {
 public:
  RankDriver(Backend& backend, HostState& state, Updater& updater, StagingRing& ring, const SequenceSampler& sampler,
             const ModelLayout& layout, const DriverConfig& config);
  ~RankDriver();

  // Enqueues every micro-step of optimizer step `step` (0-based). Returns once enqueued.
  void issue_step(int64_t step);
  // Enqueues this rank's share of an evaluation of `data` (executor/evaluation.h) with the weights
  // step `params_step` reads (those after step params_step - 1), reported to `tally` as `eval_id`.
  // Every rank of every node calls it at the same point of its program.
  void issue_eval(int64_t params_step, int64_t eval_id, const SequenceSampler& data, EvalTally& tally);
  // Frees the device buffers still held (parameter slots) once the streams are idle.
  void release_all();
  // device_optimizer: copies this rank's shards of the master weights and moments back into the host
  // state and waits for them (after the last step, streams idle).
  void store_state();

 private:
  struct Slot {
    int unit = -1;
    DeviceBuffer buffer;
    EventPtr last_use;
    int64_t last_use_seq = -1;
    bool stale = false;  // resident_params: holds the previous step's values until re-delivered
  };
  struct Delivered {
    DeviceBuffer buffer;
    EventPtr ready;  // null: already resident
  };

  // One micro-step: its batch uploaded, the forward unit by unit (the head's backward with it), the
  // decoder layers' backward in reverse, the embedding's, each unit's gradient sent by the route.
  void micro_step(int64_t step, int micro);
  struct MicroStep;
  void forward_embedding(MicroStep& m, int u, const Delivered& p);
  void forward_layer(MicroStep& m, int u, const Delivered& p);
  void forward_head(MicroStep& m, int u, const Delivered& p);
  // An offloaded layer's input back from the host ahead of its backward (no-op for other layers).
  void prefetch_input(MicroStep& m, int l);
  // Unit u's backward (recomputing its activations first unless kept); `p` its parameters. Returns
  // its gradient, for the caller to send.
  DeviceBuffer backward_layer(MicroStep& m, int u, Delivered p);
  void backward_embedding(MicroStep& m, const Delivered& p);
  // Drops (or, with resident parameters, marks stale) every parameter slot: the weights changed.
  void invalidate_parameters();
  // This rank's global data rank (node * ranks + rank).
  int global_rank() const { return config_.node * config_.ranks + config_.rank; }
  // A micro-batch's token ids, targets and (packed documents) positions, filled into the host staging
  // by `fill` and copied to the device; the compute stream waits for them.
  struct DeviceBatch {
    DeviceBuffer ids, targets, positions;
    int parity = 0;  // which host staging (and loss buffer) it used
  };
  using FillBatch = std::function<void(std::span<int32_t> inputs, std::span<int32_t> targets,
                                       std::span<int32_t> positions)>;
  DeviceBatch upload_batch(int64_t step, const FillBatch& fill);
  // One micro-step's buffers and events, from its batch's upload to its embedding's backward.
  struct MicroStep {
    int64_t step = 0;
    int micro = 0;
    DeviceBatch batch;
    DeviceBuffer router_stats;  // MoE: every layer's forward adds to them, the backward reads them
    double router_aux_weight = 0;
    std::vector<DeviceBuffer> out;    // out[u]: output of unit u (input of u+1)
    std::vector<DeviceBuffer> saved;  // per layer: saved activations of a kept layer
    std::vector<EventPtr> offloaded;  // per layer: an offloaded input's copy to the host
    std::map<int, std::pair<DeviceBuffer, EventPtr>> prefetched;  // layer -> (input, ready)
    DeviceBuffer dy;                                              // the gradient flowing back
  };
  // The head's fused forward + loss + backward on `x` (released after it); the caller sends or drops
  // the gradients (args.grads, tied_grads) and owns args.dx and args.loss.
  struct HeadCall {
    UnitOpArgs args;
    DeviceBuffer tied_grads;  // tied embeddings: the lm_head part of unit 0's gradient
    EventPtr done;
  };
  HeadCall run_head(int64_t step, const Delivered& p, const DeviceBuffer& x, const DeviceBuffer& targets,
                    double grad_scale, const DeviceBuffer& router_stats, double router_aux_weight);
  // Copies the head's (loss sum, counted targets) to the host after `done` and calls `report` with
  // them on the d2h stream.
  void loss_to_host(int parity, int64_t step, const DeviceBuffer& loss, const EventPtr& done,
                    std::function<void(double sum, double count)> report);
  Delivered acquire(int64_t step, int unit);
  // Copies `unit`'s parameters of step `step` into `buf` by the route; returns the event after which
  // they are there.
  EventPtr deliver(int64_t step, int unit, const DeviceBuffer& buf);
  void mark_use(int unit, const EventPtr& e);
  // Drops `unit` from its parameter slot (its buffer freed after `last_use`): the next use delivers it again.
  void forget(int unit, const EventPtr& last_use);
  // Converts `grads` (fp32, device) to the wire dtype and sends it by the route; returns the event
  // after which the rank's gradient buffers for this unit are free again.
  EventPtr send_grads(int64_t step, int micro, int unit, GradPart part, const DeviceBuffer& grads, int64_t numel);
  void sum_back_in(int64_t step, int micro, int unit, int64_t k, int64_t bytes, const char* what, Stream& out);
  void partition_trip(int64_t step, bool last_micro, int unit, int64_t k, int64_t bytes, const char* out_what,
                      const char* in_what, Stream& out);
  DeviceBuffer alloc(int64_t bytes, const char* what) { return device_.alloc(bytes, what); }
  void release(const DeviceBuffer& b, const EventPtr& e) { device_.release(b, e); }
  // `element_bytes`: a copy's bytes per element, for the copies the model charges (copy_kind_of).
  SpanTag tag(const char* category, const char* what, int64_t step, int unit, int64_t chunk = -1,
              int64_t element_bytes = 0) const;
  // device_optimizer: this rank's sharded state, the gradient accumulation and the update.
  void load_state();
  EventPtr send_grads_to_shard(int64_t step, int unit, const DeviceBuffer& wirebuf, const EventPtr& converted,
                               int64_t numel);
  void device_update(int64_t step);

  Backend& backend_;
  Device& device_;
  HostState& state_;
  Updater& updater_;
  StagingRing& ring_;
  const SequenceSampler& sampler_;
  const ModelLayout& layout_;
  DriverConfig config_;
  int L_ = 0, U_ = 0;
  int64_t B_ = 0;
  RankMemorySpec mem_;  // every unit's device memory at (B_, seq_len), once per run (layers may differ)
  std::vector<Slot> slots_;
  int64_t use_seq_ = 0;
  // Host staging of token ids, targets and losses, two micro-steps deep.
  HostBuffer data_host_[2];
  HostBuffer loss_host_[2];
  EventPtr data_copied_[2], loss_copied_[2];
  int64_t micro_counter_ = 0;
  // Offloaded layer inputs, one pinned host buffer per offloaded layer.
  std::map<int, HostBuffer> offload_host_;
  std::map<int, EventPtr> offload_read_;  // layer -> the last prefetch that read its host buffer
  std::map<int, EventPtr> drain_;  // unit -> event after which its gradient buffers drained
  // device_optimizer: per unit, this rank's shard of each chunk, concatenated in chunk order.
  struct Shard {
    DeviceBuffer master, exp_avg, exp_avg_sq, grad;  // fp32
    std::vector<int64_t> offset;                     // per chunk: where its shard starts
    int64_t numel = 0;
  };
  std::vector<Shard> shards_;
  DeviceBuffer nonfinite_count_;  // (1,) uint32, device: this step's non-finite gradient elements
  HostBuffer nonfinite_seen_;     // (1,) uint32, pinned host: its copy, read by the updater's check
  // fn(chunk begin b, this rank's range r within it, the shard's offset of it) for each chunk of `unit`.
  template <class Fn>
  void for_each_chunk_shard(int unit, Fn&& fn) const {
    const Shard& sh = shards_[static_cast<size_t>(unit)];
    for (int64_t k = 0; k < static_cast<int64_t>(sh.offset.size()); ++k) {
      auto [b, e] = state_.chunk_range(unit, k);
      fn(k, b, shard_range(e - b, config_.ranks, config_.rank), sh.offset[static_cast<size_t>(k)]);
    }
  }
  std::vector<int> grad_contributions_;  // per unit, this step: 0 -> the next one overwrites
  EventPtr device_updated_;              // the last AdamW of the shards (or their loading)
  // convert_on_load: two staging buffers of one chunk, and the copy that last read each.
  HostBuffer convert_staging_[2];
  // accumulate_on_gpu, partition_round_trip: the copy back in's source (pinned) and target, one
  // staging slot each (ZeRO-3's copy out goes the other way between them).
  HostBuffer accum_source_;
  DeviceBuffer accum_target_;
  DeviceBuffer fetch_fp32_;  // fetch_fp32: one chunk's fp32 shard on its way to the parameter dtype
  DeviceBuffer widened_;     // widen_grad: one chunk of the gradient cast to fp32 for its copy
  EventPtr staging_copied_[2];
  bool evaluating_ = false;  // issue_eval is issuing: its spans are tagged as an evaluation's
  int64_t convert_counter_ = 0;
};

}  // namespace slidedp::exec
