// The training loop of slidedp-run: builds the backend, the host state, the updater and one driver
// thread per rank, runs optimizer steps, and reports each step (loss, tokens, time, per-resource busy
// time) to a callback; saves and resumes checkpoints. Everything runs in one process with one host
// state; an error anywhere stops every thread and is rethrown here with its original message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "executor/backend.h"
#include "executor/lr_schedule.h"
#include "executor/node_link.h"
#include "executor/updater.h"
#include "io/token_dataset.h"
#include "model/memory_account.h"
#include "model/plan.h"
#include "model/simulator.h"
#include "model/system.h"
#include "runlog/run_log.h"

namespace slidedp::exec {

// A step's phase totals and spans are the run log's rows (slidedp-run logs them as they are).
using runlog::PhaseSpan;
using runlog::PhaseTotal;

// One evaluation on held-out data (TrainOptions::eval_dataset).
struct EvalPoint {
  int64_t step = 0;  // after this many optimizer steps (0: the starting weights)
  double loss = 0;   // mean token loss over `tokens` targets (NaN when none counted)
  int64_t tokens = 0;
  double wait_s = 0;  // how long the trainer waited for it after the step was checkpointed
};

// How the host holds the fp32 master weights (executor/host_state.h).
enum class MasterStorage {
  kAuto,   // split where it can be (SlideDP with a bf16 mirror), else fp32
  kSplit,  // the bf16 mirror plus a 16-bit remainder, exact (common/split_master.h): 2 bytes fewer
  kFp32,   // a separate fp32 copy; the mirror rounds to nearest even, as torch's cast
};

struct TrainOptions {
  ModelCard card;
  int64_t seq_len = 128;
  Plan plan;                           // routes, batch shape, chunking, activation policies, depth
  // Whose data movement and update placement to run: SlideDP's, or a baseline's as the step model
  // describes it (model/system.h; plan_for_system overrides the plan's routes, chunk and policies).
  // The executor runs SlideDP, SlideFormer-DP and MegaTrain; ZeRO-Offload and FSDP2 are refused.
  System system = System::kSlideDP;
  std::string backend = "cpu";         // "cpu" | "cuda"
  bool exact_fp32 = false;             // fp32 delivery and gradients (exact tests)
  MasterStorage master = MasterStorage::kAuto;
  // An fp32 master whose mirror rounds exact ties toward zero as a split master's does, so that the
  // two storages can be compared bit for bit (tests).
  bool mirror_ties_toward_zero = false;
  // Clipping or skipping: sum the gradient norm by a pass after the backward instead of as the chunks
  // are reduced (the same bits; the reference tests/executor/clip_schedule_test.cc holds the fused
  // sum to).
  bool norm_pass_after_backward = false;
  int64_t device_budget_bytes = 0;     // 0: the plan's budget, else the backend's default (device_budget.h)
  int update_threads = 0;              // 0: plan.update_threads, else all cores
  // Data.
  TokenDataset dataset = TokenDataset::from_tokens("empty", {0, 0}, {}, 1);
  uint64_t data_seed = 1234;
  // Packed documents: the token id that ends every document (e.g. the tokenizer's EOS). Attention,
  // RoPE positions and recurrent state restart after it, and it does not predict the next document's
  // first token (io/sequence_sampler.h). None: each sequence is one stream.
  std::optional<int32_t> document_end;
  // Evaluation (executor/evaluation.h): the mean token loss of every sequence of `eval_dataset` (cut
  // at seq_len as the training data, the last part-filled; the same document end) after every
  // `eval_every`-th step and after the last one (with steps = 0: of the starting weights); no
  // evaluation without a dataset. The weights are not updated by it. Each is reported to `on_eval`
  // once the step it follows is reported and checkpointed.
  std::optional<TokenDataset> eval_dataset;
  int64_t eval_every = 0;  // 0: after the last step only
  std::function<void(const EvalPoint&)> on_eval;
  // Optimization.
  int64_t steps = 10;                  // optimizer steps to run (after a resume: further steps)
  LrScheduleConfig lr;
  OptimizerConfig optimizer;
  // Mixture-of-experts models: the router's load-balancing loss joins the objective with this
  // coefficient (kernels/cpu/transformer/router_aux_loss.h; 0: off, as the references fine-tune).
  double router_aux_loss_coef = 0;
  // Initial weights: a Hugging Face model folder, else random with this seed.
  std::string init_model_dir;
  uint64_t init_seed = 42;
  // Checkpoints.
  std::string checkpoint_dir;          // "" : none
  std::string save_model_dir;          // the final weights as a Hugging Face folder (bf16); a
                                       // state sharded across nodes: each node writes its part;
                                       // "" : none
  int64_t checkpoint_every = 0;        // 0: only at the end (when checkpoint_dir is set)
  int keep_checkpoints = 3;
  std::string resume_dir;              // a checkpoint folder, or a root whose newest one is used
  std::string metadata_json = "{}";    // stored in checkpoints
  // Timeline.
  bool trace = false;                  // record spans (for --trace, --bench and per-step busy times)
  bool trace_kernels = false;          // CUDA: also every kernel, copy and memset (CUPTI), category "kernel"
  int64_t sample_spans_every = 0;      // > 0: keep the detailed spans of every k-th step in TrainStep
  // Set from another thread (a signal handler) to stop after the current step, cleanly.
  const std::atomic<bool>* stop = nullptr;
  // Set from another thread (a second SIGINT/SIGTERM) to end the run at once, throwing Interrupted
  // (run_control.h); `signal` holds the signal's number for the exit status. A stop the step loop has
  // not reached within stop_grace_s (> 0) interrupts the run the same way.
  const std::atomic<bool>* interrupt = nullptr;
  const std::atomic<int>* signal = nullptr;
  double stop_grace_s = 0;
  // The RAM the run may use (0: this host's physical RAM); tests set it to check the refusal.
  int64_t host_ram_bytes = 0;
  // The page-locked (pinned) host memory the run may use (0: no limit below the RAM): the staging
  // rings, token and offload buffers and the systems' own pinned buffers must fit it as well.
  int64_t host_pinned_limit_bytes = 0;
  // Run at a target machine's ratios (CPU backend): every operation is held until the target would be
  // done, with time stretched by time_scale (<= 0: measured, TargetPacing::measured_time_scale).
  std::optional<Hardware> emulate;
  double time_scale = 0;
  // Multi-node (plan.nodes > 1): the link to the other nodes, one process per node (mpirun). Every
  // node runs train() with the same options; node 0 writes the checkpoints.
  NodeLink* link = nullptr;
  // Fault injection for tests (see DriverConfig), on global rank inject_rank (node * ranks + rank).
  int inject_rank = -1;
  int64_t inject_nan_step = -1;
  int inject_nan_unit = -1;
  int64_t inject_throw_step = -1;
  int inject_throw_unit = -1;
};

// What one step did. With tracing: busy_s per category for rank 0 ("compute", "h2d", "d2h", "fabric")
// and the host ("cpu_update"), as the union of that resource's spans, and copied_bytes per copy
// category for rank 0 (MeasuredSpan::bytes); totals per rank and category for the run log; the
// step's detailed spans when sampled.
struct TrainStep {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0;
  int64_t tokens = 0;
  double wall_s = 0;
  double lr = 0;
  double grad_norm = -1;
  bool skipped = false;
  std::string skipped_reason;
  std::map<std::string, double> busy_s;
  std::map<std::string, double> copied_bytes;
  std::vector<PhaseTotal> totals;
  std::vector<PhaseSpan> spans;
};

struct TrainResult {
  std::vector<TrainStep> steps;
  std::vector<EvalPoint> evals;            // in step order
  std::vector<std::vector<float>> master;  // final fp32 master weights per unit (empty when sharded across nodes)
  std::vector<int64_t> device_high_water_bytes;       // per rank, deferred frees counted until done
  std::vector<int64_t> device_held_high_water_bytes;  // per rank, as the allocation order holds them
  RankMemoryAccount device_account;                   // what the up-front check charged rank 0
  int64_t device_budget_bytes = 0;
  int64_t host_state_bytes = 0;
  Backend::HostBytes host_allocated;  // what the backend's alloc_host gave out (the host account's test)
  std::vector<MeasuredSpan> spans;         // the whole run's timeline when tracing
  std::string last_checkpoint;
  int64_t start_step = 0;                  // optimizer step the run started from (resume)
  // Pacing (emulate): the scale used, the operations paced, and those whose real work outlasted the
  // target's time (the scale was too small for this host), with the wall seconds they ran over.
  double time_scale = 0;
  int64_t paced_ops = 0, paced_overruns = 0;
  double paced_overrun_s = 0;
  bool stopped_early = false;              // options.stop was raised
};

// The measured timeline as Chrome-trace spans (one track per rank and stream, plus the host's CPU).
std::vector<TimelineSpan> timeline_spans(const std::vector<MeasuredSpan>& spans);

// Runs training. on_step is called on the calling thread after every step (progress, logging).
TrainResult train(const TrainOptions& options, const std::function<void(const TrainStep&)>& on_step = {});

// The plan rules of a run across nodes that need no process to check (train() checks them too):
// slidedp-run refuses such a plan before it writes anything, on every node alike.
void validate_multi_node_plan(const Plan& plan);

}  // namespace slidedp::exec
