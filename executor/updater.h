// The host side of every step: gradient chunks land in the ranks' staging rings, and this updater
// reduces them across ranks in fixed rank order and runs AdamW on each chunk as soon as its reduced
// gradient is complete -- while the GPUs are still computing the backward of earlier units. The work
// of one chunk is spread over the thread pool by tiles (never serialized on one rank's thread). When
// a chunk is updated its counter advances, which releases the next step's delivery of that chunk.
//
// Two modes:
//  * overlapped (default): the last micro-step's chunks are reduced and updated in one fused pass;
//    earlier micro-steps accumulate into fp32. The loss of every rank is checked before the first
//    update; with check_grads, each chunk's reduced gradient is checked before it is applied.
//  * verify (gradient clipping, or skipping non-finite steps; and the baselines that update after the
//    backward): every chunk is first reduced into the fp32 accumulator, and the global gradient norm
//    is summed as its blocks complete (grad_norm_blocks.h); once the last chunk is in, every chunk is
//    updated, unit 0 first, each released to the next step's deliveries as it is done, so the update
//    overlaps the next step's forward in layer order. The accumulator holds the step's gradient until
//    the norm is known: exact clipping needs the whole gradient before any element is applied.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "card/shard_range.h"
#include "common/thread_pool.h"
#include "executor/cross_node.h"
#include "executor/grad_norm_blocks.h"
#include "executor/host_state.h"
#include "executor/run_control.h"
#include "executor/target_pacing.h"
#include "executor/weight_decay_groups.h"
#include "kernels/cpu/optim/adamw.h"
#include "model/plan.h"

namespace slidedp::exec {

enum class NonFinitePolicy { kAbort, kSkip };
enum class GradPart { kOwn, kTiedHead };  // kTiedHead: the head's contribution to unit 0's gradient

struct OptimizerConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  NoDecayGroups no_decay;       // tensors exempt from weight decay (default: none, as torch's AdamW)
  double clip_grad_norm = 0.0;  // > 0: clip the global gradient norm (verify mode)
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kAbort;
  bool check_grads = true;      // overlapped mode: check each chunk's gradient for NaN/Inf
};

// Clipping and skipping non-finite steps need the global norm before any chunk is updated: the
// update after the backward (Plan::verify_updates).
inline bool needs_update_after_backward(const OptimizerConfig& o) {
  return o.clip_grad_norm > 0 || o.on_nonfinite == NonFinitePolicy::kSkip;
}

struct UpdaterConfig {
  int ranks = 1;
  int accum_steps = 1;
  // What lands in the staging slots: kGpu when the plan's reduce-scatter shards the gradients
  // (Plan::grad_shards() > 1: fp32 shards, one rank each), else every rank's whole chunk.
  GradRoute route = GradRoute::kCpu;
  bool tied = false;
  OptimizerConfig optimizer;
  // Per unit, the element ranges that take no weight decay (no_decay_ranges of optimizer.no_decay).
  std::vector<std::vector<ElementRange>> no_decay_ranges;
  // Steps skipped before this run (a resumed run): AdamW's bias correction counts applied updates
  // only, as torch's optimizer.step() does when a step is skipped.
  int64_t skipped_steps_before = 0;
  // Called after every job with what it was and when it ran (for the measured timeline and the
  // CPU's busy time); may be empty.
  std::function<void(const char* what, int unit, int64_t chunk, int64_t step, double start_s, double end_s)> on_job;
  std::function<double()> clock;  // time base of on_job (the backend's trace clock)
  // Run at a target machine's CPU and host-memory rates (slidedp-run --emulate); null: this host's.
  const TargetPacing* pacing = nullptr;
  // Baselines' update placement (executor --system): MegaTrain accumulates every micro-step's
  // gradients and runs one optimizer step after the backward (the verify mode's schedule), and adds
  // each rank's gradient on its own, one at a time (its global lock), in rank order.
  bool update_after_backward = false;
  bool serial_accumulation = false;
  // FSDP2 (--system fsdp2): the ranks run AdamW on their devices over sharded state; no gradient
  // reaches the host. The updater only collects the losses and each rank's report that its update
  // of the step is enqueued behind the step's work (device_step_done), and hands out the step's
  // hyper-parameters.
  bool device_optimizer = false;
  // Multi-node (plan.nodes > 1, SlideDP's placement): the link to the other nodes, and whether this
  // node updates only its part of each chunk (sharded) or the whole chunk (replicated). The cpu route
  // sums the nodes' gradients here (executor/cross_node.h describes the exchange); the gpu route's
  // reduce-scatter spans every node's ranks already (sharded only: each shard lands on the node that
  // holds it). `ranks` stays this node's rank count; losses and gradients are summed over every
  // node's ranks in global rank order.
  NodeLink* link = nullptr;
  bool sharded_state = false;
  // Verify mode: sum the norm by a pass over every accumulator after the last chunk is in, instead of
  // as the chunks are reduced. The same bits, later: the reference the fused sum is tested against.
  bool norm_pass_after_backward = false;
  // Verify mode without clipping or skipping (a plan that asks for the schedule: Plan::verify_updates).
  bool verify_updates = false;
};

// One rank's gradient payload in a staging slot: elements [begin, end) of `unit`.
struct ChunkArrival {
  int64_t step = 0;
  int micro = 0;
  int unit = 0;
  int64_t chunk = 0;
  GradPart part = GradPart::kOwn;
  int rank = 0;
  int slot = 0;
  const std::byte* data = nullptr;
  int64_t begin = 0, end = 0;
  DType dtype = DType::kBF16;  // of `data`: the wire's on the cpu route (or a wider copy's), fp32 shards
};

struct StepOutcome {
  int64_t step = 0;
  double loss_sum = 0, target_count = 0;
  double loss() const { return target_count > 0 ? loss_sum / target_count : 0.0; }
  double grad_norm = -1;  // measured in verify mode, else -1
  bool skipped = false;
  std::string skipped_reason;
};

class Updater {
 public:
  Updater(HostState& state, std::vector<StagingRing*> rings, ThreadPool& pool, RunControl& control,
          const UpdaterConfig& config);
  ~Updater();

  // Announces step `step` (0-based) with its learning rate; must precede its arrivals.
  void begin_step(int64_t step, double lr);
  // A rank's gradient payload landed (called on the rank's D2H stream thread).
  void arrive(const ChunkArrival& a);
  // A rank's loss of one micro-step (called on its D2H stream thread).
  void report_loss(int64_t step, int micro, int rank, double loss_sum, double count);
  // Blocks until every chunk of `step` is updated (or the step is skipped). Throws Aborted on abort.
  StepOutcome wait_step(int64_t step);
  // device_optimizer: `rank` has finished step `step`'s update on its device (called on a stream
  // thread once it has).
  void device_step_done(int64_t step, int rank);
  // device_optimizer: `rank` found `count` non-finite elements in its gradient of step `step` (before
  // its update; called on a stream thread ahead of device_step_done): the step fails as the host
  // update's check fails it.
  void device_grads_nonfinite(int64_t step, int rank, uint32_t count);
  // The AdamW hyper-parameters of step `step` (after begin_step) and how weight decay splits
  // elements [b, e) of `unit`: fn(b', e', hyper) per piece, in order.
  kernels::AdamwHyper step_hyper(int64_t step);
  void for_decay_ranges(int unit, int64_t b, int64_t e, const kernels::AdamwHyper& h,
                        const std::function<void(int64_t, int64_t, const kernels::AdamwHyper&)>& fn) const;
  // Updates of steps > `step` wait until this is raised (checkpoint gate).
  // Waits until no job is running: a job's span is recorded after the step it completes is seen
  // done (wait_step), so the run's last spans are complete only after this.
  void wait_idle();
  void allow_updates_through(int64_t step);
  bool verify_mode() const { return verify_; }
  // Steps skipped so far, those before this run included. Exact once wait_step(s) returned for the
  // last step s of interest (a skip is decided before any chunk of the step is released).
  int64_t skipped_steps() const { return skipped_steps_.load(); }

 private:
  struct Job {
    enum Kind { kAccumulate, kUpdate, kVerifyPass } kind = kAccumulate;
    // Multi-node jobs pass three stages: the chain (add this node's ranks to the partial sum), the
    // apply (accumulate or update with the sum), and for a sharded update the wait for the other
    // nodes' mirror shards.
    enum Stage { kChain, kApply, kAwaitMirror } stage = kChain;
    int64_t step = 0;
    int micro = 0;
    GradPart part = GradPart::kOwn;
    int unit = 0;
    int64_t chunk = 0;
    int64_t begin = 0, end = 0;  // the chunk's elements in the unit
    bool first_write = false;  // accumulate: overwrite instead of adding
    int order = 0;             // multi-node: contributions to this accumulator before this one
    std::shared_ptr<CrossNodeSum> cross;  // multi-node: this key's transfers
    double lr = 0;
    std::vector<ChunkArrival> parts;  // cpu route: one per rank (rank order); gpu route: one shard
    // When its work was done, stamped before its gradient slots are released (so anything a release
    // lets start, such as SlideFormer's next gradient copy, starts after it on the timeline); < 0:
    // stamp when the job returns.
    double done_s = -1;
  };
  struct StepInfo {
    double lr = 0;
    std::map<std::tuple<int, int, int64_t, int>, std::vector<ChunkArrival>> pending;  // (micro, unit, chunk, part)
    std::map<std::tuple<int, int, int64_t, int>, int> serial_next;  // serial accumulation: next rank to queue
    std::map<std::pair<int, int64_t>, int> written;       // (unit, chunk) -> accumulations applied
    std::map<std::pair<int, int64_t>, int> shards_done;   // gpu route: shards updated per chunk
    // gpu route across nodes: per chunk, the other nodes' updated mirror parts received.
    std::map<std::pair<int, int64_t>, std::shared_ptr<CrossNodeSum>> mirror_in;
    int64_t chunks_left = 0;        // own-part chunks of the last micro-step not yet updated
    int64_t accumulations_left = 0; // verify mode: accumulations left before the verify pass
    int losses = 0;        // every node's (after their exchange)
    int local_losses = 0;  // this node's ranks'
    bool losses_posted = false;  // multi-node: sent to the other nodes
    std::map<std::pair<int, int64_t>, int> applied;  // multi-node: contributions applied, keyed as `written`
    int devices_done = 0;  // device_optimizer: ranks whose update of the step has run
    std::vector<double> loss_sums, counts;  // [micro * ranks + rank]: summed in this order, not arrival order
    bool loss_finite = true;
    bool done = false;
    StepOutcome outcome;
  };

  // The gradient a job applies: fp32 or wire-dtype slots summed in order, over the unit's elements
  // [begin, end) (slot pointers start at begin).
  struct GradInput {
    DType dtype = DType::kF32;
    std::vector<const std::byte*> slots;
    int64_t begin = 0, end = 0;
  };

  void loop();
  bool job_ready(const Job& job) const;  // under mutex_
  void run_job(Job& job);
  void accumulate(Job& job);
  void update(Job& job);
  GradInput ring_input(const Job& job) const;  // the ranks' staging slots of the job
  void accumulate_input(Job& job, const GradInput& in);
  void accumulated(int64_t step);  // verify mode: queues the verify pass after the last accumulation
  void update_input(Job& job, const GradInput& in);
  void release_slots(const Job& job);
  // Multi-node stages (cross_node.h).
  void expect_cross(Job& job);  // posts the job's receives; under mutex_
  void expect_mirror(const Job& job, const std::shared_ptr<CrossNodeSum>& x);  // the other nodes' parts of its chunk's mirror
  void send_mirror(const Job& job);  // this node's part of its chunk's mirror, to every other node
  void send_mirror_and_await(int64_t step, int micro, GradPart part, int unit, int64_t chunk,
                             std::shared_ptr<CrossNodeSum> x);
  void chain(Job& job);
  bool apply_cross(Job& job);  // true: the job goes on to wait for the mirror shards
  void post_losses(int64_t step);  // this node's losses of `step` to every other node; under mutex_
  // Node `node`'s (loss sum, count) per micro-step and rank, received.
  void take_remote_losses(int64_t step, int node, const std::vector<double>& losses);
  ShardRange own_range(int64_t n) const;  // this node's part of a chunk of n elements
  void verify_pass(int64_t step);
  // Sharded across nodes: every node's sum of squares of its part, added in node order.
  double sum_over_nodes(int64_t step, double mine);
  void finish_chunk(StepInfo& info, int unit, int64_t chunk, int64_t step);
  void finish_device_step(StepInfo& info, int64_t step);  // device_optimizer; under mutex_
  kernels::AdamwHyper hyper(int64_t step, double lr, double clip_coef) const;
  int begin_paced(const Job& job) const;  // the job's flow on the target's CPU and host memory
  void hold_paced(int flow) const;         // waits until the target would be done with it
  // AdamW over elements [b, e) of `unit` (offsets into the unit), cut where weight decay changes.
  template <class Fn>
  void by_decay(int unit, int64_t b, int64_t e, const kernels::AdamwHyper& h, Fn&& fn) const;

  HostState& state_;
  std::vector<StagingRing*> rings_;
  ThreadPool& pool_;
  RunControl& control_;
  UpdaterConfig config_;
  bool verify_;
  std::optional<GradNormBlocks> norm_;  // verify mode, unless norm_pass_after_backward
  int64_t expected_chunks_ = 0;       // own-part chunks per step
  int64_t expected_accumulations_ = 0;// verify mode: accumulation jobs per step

  std::mutex mutex_;
  int running_ = 0;  // jobs taken from jobs_ and not yet finished (wait_idle); under mutex_
  std::condition_variable cv_;        // jobs, losses, gate, completion
  std::deque<Job> jobs_;
  std::map<int64_t, StepInfo> steps_;
  int64_t allowed_step_ = -1;
  std::atomic<int64_t> skipped_steps_{0};
  bool stop_ = false;
  // Multi-node.
  int nodes_ = 1, node_ = 0;
  std::optional<CrossNodeTags> tags_;
  std::shared_ptr<UpdaterWaker> waker_;
  std::thread thread_;
};

}  // namespace slidedp::exec
