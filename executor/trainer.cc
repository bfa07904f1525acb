// The training loop; see trainer.h. Threads: one driver per rank issuing steps as soon as they are
// permitted, the updater thread, the backend's stream workers, and this (main) thread, which
// announces steps, waits for their updates, reports them and writes checkpoints.
#include "executor/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/host_memory.h"
#include "common/intervals.h"
#include "common/provenance.h"
#include "common/thread_pool.h"
#include "common/units.h"
#include "executor/backend_registry.h"
#include "executor/evaluation.h"
#include "executor/host_state.h"
#include "executor/init_weights.h"
#include "executor/node_state.h"
#include "executor/rank_driver.h"
#include "executor/run_control.h"
#include "executor/state_checkpoint.h"
#include "executor/weight_decay_groups.h"
#include "io/checkpoint.h"
#include "io/hf_model.h"
#include "io/sequence_sampler.h"
#include "kernels/cpu/transformer/model_step.h"
#include "model/hardware.h"
#include "model/memory_model.h"
#include "model/simulator.h"
#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp::exec {
namespace {

// Lets driver threads issue step s only after the main thread announced it to the updater.
class StepPermits {
 public:
  explicit StepPermits(const RunControl& control) : control_(control) {}
  void permit(int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    permitted_ = std::max(permitted_, step);
    cv_.notify_all();
  }
  void finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    cv_.notify_all();
  }
  // True when `step` may be issued; false when the run ends before it.
  bool wait(int64_t step) {
    std::unique_lock<std::mutex> lock(mutex_);
    control_.wait(lock, cv_, [&] { return permitted_ >= step || finished_; });
    return permitted_ >= step;
  }

 private:
  const RunControl& control_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t permitted_ = -1;
  bool finished_ = false;
};

}  // namespace

void validate_multi_node_plan(const Plan& plan) {
  if (plan.nodes > 1 && plan.grad_route == GradRoute::kGpu && plan.host_state != slidedp::HostState::kSharded)
    throw InputError(
        "plan: host_state",
        "replicated: the gpu route's reduce-scatter over every node's ranks leaves each node only its part "
        "of the sum, which host_state: sharded updates where it lands (or reduce on the hosts: grad_route: "
        "cpu)");
}

namespace {

void validate(const TrainOptions& o, const ModelLayout& layout) {
  const int L = static_cast<int>(o.card.num_layers);
  o.plan.validate(L, "plan");
  if (o.plan.nodes > 1) {
    // What the cross-node exchange covers (executor/cross_node.h): the host route of SlideDP.
    if (!o.link || o.link->nodes() != o.plan.nodes)
      throw InputError("plan: nodes", fmt::format("{} nodes need one process per node: launch with `mpirun -np {}`",
                                                  o.plan.nodes, o.plan.nodes));
    if (o.system != System::kSlideDP)
      throw InputError("--system", "multi-node runs are SlideDP's placement (the baselines are single-node)");
    validate_multi_node_plan(o.plan);
    if (o.emulate) throw InputError("--emulate", "pacing is single-node");
  }
  if (o.card.tie_word_embeddings && o.plan.gpu_buffer_depth < 2)
    throw InputError("plan: gpu_buffer_depth",
                     "tied embeddings need at least 2 parameter slots (the head reads unit 0 as lm_head)");
  if (o.seq_len < 1) throw InputError("seq_len", "must be at least 1");
  if (o.dataset.vocab_size() > o.card.vocab_size)
    throw InputError(o.dataset.name(), fmt::format("token vocabulary {} exceeds the model's vocab_size {}",
                                                   o.dataset.vocab_size(), o.card.vocab_size));
  if (o.steps < 0) throw InputError("steps", "must be non-negative");
  // The injected NaN lands in a decoder layer's backward (the head's fused pass and the embedding's
  // scatter do not take it): anything else would inject nothing and pass for a clean run.
  if (o.inject_nan_step >= 0 && (o.inject_nan_unit < 1 || o.inject_nan_unit > L))
    throw InputError("--test-inject-nan", fmt::format("UNIT {} is not a decoder unit (1 to {})", o.inject_nan_unit, L));
  if (o.inject_nan_step >= 0 && o.inject_rank >= o.plan.ranks * std::max(1, o.plan.nodes))
    throw InputError("--test-inject-nan", fmt::format("RANK {} is not below the run's {} ranks", o.inject_rank,
                                                      o.plan.ranks * std::max(1, o.plan.nodes)));
  o.lr.validate("lr schedule");
  const OptimizerConfig& opt = o.optimizer;
  for (auto [name, beta] : {std::pair{"beta1", opt.beta1}, std::pair{"beta2", opt.beta2}})
    if (!(beta >= 0 && beta < 1)) throw InputError(fmt::format("optimizer: {}", name), fmt::format("{} must be in [0, 1)", beta));
  if (!(std::isfinite(opt.eps) && opt.eps >= 0)) throw InputError("optimizer: eps", fmt::format("{} must be finite and >= 0", opt.eps));
  if (!(std::isfinite(opt.weight_decay) && opt.weight_decay >= 0))
    throw InputError("optimizer: weight_decay", fmt::format("{} must be finite and >= 0", opt.weight_decay));
  if (!(std::isfinite(o.router_aux_loss_coef) && o.router_aux_loss_coef >= 0))
    throw InputError("router_aux_loss_coef", fmt::format("{} must be finite and >= 0", o.router_aux_loss_coef));
  if (o.router_aux_loss_coef > 0 && !o.card.moe())
    throw InputError("router_aux_loss_coef",
                     fmt::format("model {} has no mixture-of-experts router; the load-balancing loss needs one", o.card.name));
  if (o.trace_kernels && o.backend != "cuda")
    throw InputError("--trace-kernels", "CUPTI records GPU kernels; the " + o.backend + " backend runs none (use --backend cuda)");
  // A file that records its documents' end token is trained with that one (io/token_dataset.h): any
  // caller of train(), not only slidedp-run, which takes it from the file.
  if (const auto recorded = o.dataset.documents().document_end;
      recorded && (!o.document_end || static_cast<int64_t>(*recorded) != *o.document_end))
    throw InputError("--document-end", fmt::format("{} differs from the document end {} that {} records",
                                                   o.document_end ? std::to_string(*o.document_end) : "none",
                                                   *recorded, o.dataset.name()));
  if (o.eval_dataset) {
    const TokenDataset& e = *o.eval_dataset;
    if (e.vocab_size() > o.card.vocab_size)
      throw InputError(e.name(), fmt::format("token vocabulary {} exceeds the model's vocab_size {}",
                                             e.vocab_size(), o.card.vocab_size));
    // The two files' recorded document ends must agree (the run's end comes from the training file or
    // --document-end and applies to both).
    const auto recorded = e.documents().document_end, trained = o.dataset.documents().document_end;
    auto say = [](std::optional<uint32_t> id) { return id ? std::to_string(*id) : std::string("none"); };
    if ((recorded && (!o.document_end || static_cast<int64_t>(*recorded) != *o.document_end)) ||
        (trained && recorded != trained))
      throw InputError(
          e.name() + ": document end",
          fmt::format("the evaluation file's documents end with token {}, the training file's with {} "
                      "(the run's: {})",
                      say(recorded), say(trained),
                      o.document_end ? std::to_string(*o.document_end) : "none"));
  }
  if (o.eval_every < 0) throw InputError("eval_every", fmt::format("{} must be >= 0", o.eval_every));
  if (o.document_end && (*o.document_end < 0 || *o.document_end >= o.card.vocab_size))
    throw InputError("document_end", fmt::format("token id {} is outside the vocabulary of {} ({} tokens)",
                                                 *o.document_end, o.card.name, o.card.vocab_size));
  (void)layout;
}

// A token file whose every target is masked out (no mask byte 1 after the first token) holds nothing
// to `purpose` (train on, evaluate).
void refuse_all_masked(const TokenDataset& d, const char* purpose) {
  if (!d.has_loss_mask()) return;
  for (int64_t i = 1; i < d.num_tokens(); ++i)
    if (d.counts_in_loss(i)) return;
  throw InputError(
      d.name() + ": loss mask",
      fmt::format("every target is masked out (no mask byte is 1 after the first token): there is "
                  "nothing to {}",
                  purpose));
}

// Multi-node: node 0's record of a step gets every node's phase totals and sampled spans, each
// tagged with its node (the run log's phases.node); the other nodes send theirs.
void gather_node_phases(NodeLink& link, TrainStep& rec) {
  nlohmann::json j = {{"t", nlohmann::json::array()}, {"s", nlohmann::json::array()}};
  for (const PhaseTotal& t : rec.totals) j["t"].push_back({t.rank.value_or(-1), t.category, t.busy_s, t.count});
  for (const PhaseSpan& p : rec.spans)
    j["s"].push_back({p.rank.value_or(-1), p.category, p.name, p.unit.value_or(-1), p.chunk.value_or(-1), p.start_s, p.end_s});
  const std::vector<std::string> all = gather_text(link, j.dump(), 0);
  if (link.node() != 0) return;
  for (PhaseTotal& t : rec.totals) t.node = 0;
  for (PhaseSpan& p : rec.spans) p.node = 0;
  auto opt = [](int64_t v) { return v < 0 ? std::nullopt : std::optional<int>(static_cast<int>(v)); };
  for (int n = 1; n < link.nodes(); ++n) {
    const nlohmann::json theirs = nlohmann::json::parse(all[static_cast<size_t>(n)]);
    for (const auto& t : theirs["t"])
      rec.totals.push_back(PhaseTotal{rec.step, opt(t[0]), t[1], t[2], t[3], n});
    for (const auto& p : theirs["s"]) {
      const int64_t chunk = p[4];
      rec.spans.push_back(PhaseSpan{rec.step, opt(p[0]), p[1], p[2], opt(p[3]),
                                    chunk < 0 ? std::nullopt : std::optional<int64_t>(chunk), p[5], p[6], n});
    }
  }
}

// Per-rank, per-category busy time of step `s` (and its spans when sampled) from the timeline.
void summarize_step(const std::vector<MeasuredSpan>& spans, int64_t s, bool keep_spans, TrainStep& rec) {
  std::map<std::pair<int, std::string>, std::vector<std::pair<double, double>>> by;
  double t0 = 1e300;
  for (const MeasuredSpan& sp : spans) {
    if (sp.tag.step != s || sp.tag.eval) continue;  // an evaluation's work is no step's
    by[{sp.rank, sp.tag.category}].push_back({sp.start_s, sp.end_s});
    t0 = std::min(t0, sp.start_s);
  }
  for (auto& [key, iv] : by) {
    PhaseTotal t;
    t.step = s + 1;
    if (key.first >= 0) t.rank = key.first;
    t.category = key.second;
    t.count = static_cast<int64_t>(iv.size());
    t.busy_s = union_length(iv);
    if (key.first <= 0) rec.busy_s[key.second] = t.busy_s;
    rec.totals.push_back(t);
  }
  if (!keep_spans) return;
  for (const MeasuredSpan& sp : spans) {
    if (sp.tag.step != s || sp.tag.eval) continue;
    PhaseSpan p;
    p.step = s + 1;
    if (sp.rank >= 0) p.rank = sp.rank;
    p.category = sp.tag.category;
    p.name = sp.tag.what;
    if (sp.tag.unit >= 0) p.unit = sp.tag.unit;
    if (sp.tag.chunk >= 0) p.chunk = sp.tag.chunk;
    p.start_s = sp.start_s - t0;
    p.end_s = sp.end_s - t0;
    rec.spans.push_back(p);
  }
}

// Whether the host holds the master split (TrainOptions::master; who can: can_split_master).
bool use_split_master(const TrainOptions& o) {
  const bool can = can_split_master(o.system, o.exact_fp32);
  if (o.master == MasterStorage::kSplit && !can)
    throw InputError("--master", o.exact_fp32
                                     ? "split: not with --exact (the mirror is fp32 there)"
                                     : fmt::format("split: not with --system {} (its master is fp32)",
                                                   system_name(o.system)));
  if (o.mirror_ties_toward_zero && o.exact_fp32)
    throw InputError("--exact", "the mirror rule needs a bf16 mirror");
  if (o.plan.optimizer_states != OptimizerStates::kFp32) {
    // Lossy: not where the run promises exact numbers, nor for a baseline, whose system holds fp32.
    const char* name = optimizer_states_name(o.plan.optimizer_states);
    if (o.exact_fp32)
      throw InputError("--optimizer-states", fmt::format("{} is lossy: not with --exact", name));
    if (o.system != System::kSlideDP)
      throw InputError("--optimizer-states", fmt::format("{}: not with --system {} (its moments are fp32)",
                                                         name, system_name(o.system)));
  }
  return o.master == MasterStorage::kSplit || (o.master == MasterStorage::kAuto && can);
}

}  // namespace

std::vector<TimelineSpan> timeline_spans(const std::vector<MeasuredSpan>& spans) {
  std::vector<TimelineSpan> out;
  out.reserve(spans.size());
  for (const MeasuredSpan& s : spans) {
    TimelineSpan t;
    t.track = s.rank >= 0 ? fmt::format("rank {} / {}", s.rank, s.stream) : "host / " + s.stream;
    std::string what = s.tag.what;
    if (s.tag.unit >= 0) what += fmt::format(" u{}", s.tag.unit);
    if (s.tag.chunk >= 0) what += fmt::format(" c{}", s.tag.chunk);
    if (s.tag.eval)
      what += fmt::format(" (evaluation after step {})", s.tag.step);
    else if (s.tag.step >= 0)
      what += fmt::format(" (step {})", s.tag.step + 1);
    t.name = what;
    t.category = s.tag.category;
    t.start_s = s.start_s;
    t.end_s = s.end_s;
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// The host memory of the run against this host's RAM (o.host_ram_bytes when a test sets it): refused
// with the largest items named. `plan` as the system runs it, verify_updates set.
void check_host_memory(const TrainOptions& o, const ModelLayout& layout, const Plan& plan,
                       bool split_master) {
  HostMemorySpec spec = host_memory_spec(layout, plan, o.system, o.card.tie_word_embeddings, o.exact_fp32,
                                         o.card.hidden_size * backend_activation_bytes(o.backend));
  spec.split_master = split_master;
  std::vector<MemoryItem> items = host_memory_items(layout, plan, o.seq_len, spec);
  // A folder's or a random initialization's whole fp32 weights live until the state has taken them; a
  // split master is rebuilt in fp32 while a checkpoint or the model is written (later, never both).
  const double whole_fp32 = 4.0 * static_cast<double>(layout.total_flat_numel);
  if (o.resume_dir.empty())
    items.push_back({"initial weights while they load (fp32)", whole_fp32});
  else if (split_master && (!o.checkpoint_dir.empty() || !o.save_model_dir.empty()))
    items.push_back({"master rebuilt in fp32 while a checkpoint or the model is written", whole_fp32});
  std::sort(items.begin(), items.end(), [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
  auto largest = [](const std::vector<MemoryItem>& of) {
    std::string text;
    for (std::size_t i = 0; i < std::min<std::size_t>(3, of.size()); ++i)
      text += fmt::format("{}{} {}", i ? ", " : "", of[i].name, format_bytes(of[i].bytes));
    return text;
  };
  double total = 0;
  for (const MemoryItem& i : items) total += i.bytes;
  const int64_t ram = o.host_ram_bytes > 0 ? o.host_ram_bytes : physical_ram_bytes();
  if (ram > 0 && total > static_cast<double>(ram))
    throw InfeasibleError(fmt::format("{}: the run needs {} of host memory but this host has {} of RAM (largest: {}); "
                                      "shard the host state across nodes, offload fewer layers or use a smaller model",
                                      o.card.name, format_bytes(total), format_bytes(static_cast<double>(ram)), largest(items)));
  if (o.host_pinned_limit_bytes <= 0) return;
  std::vector<MemoryItem> pinned;
  double pinned_total = 0;
  for (const MemoryItem& i : items)
    if (i.name.find("(pinned") != std::string::npos) pinned.push_back(i), pinned_total += i.bytes;
  if (pinned_total > static_cast<double>(o.host_pinned_limit_bytes))
    throw InfeasibleError(fmt::format("{}: the run page-locks {} of host memory but may pin {} (--host-pinned-limit; "
                                      "largest: {}); offload fewer layers, use smaller chunks or raise the limit",
                                      o.card.name, format_bytes(pinned_total),
                                      format_bytes(static_cast<double>(o.host_pinned_limit_bytes)), largest(pinned)));
}

}  // namespace

TrainResult train(const TrainOptions& o, const std::function<void(const TrainStep&)>& on_step) {
  const ModelLayout layout = make_model_layout(o.card);
  validate(o, layout);
  const SystemTraits traits = system_traits(o.system);
  if (traits.gpu_optimizer) {
    // FSDP2's optimizer state lives on the devices: the host-side features that read it mid-run
    // (checkpoints, the global-norm clip, skipping a step) are not part of this baseline's run.
    if (!o.checkpoint_dir.empty())
      throw InputError("--checkpoint-dir", "--system fsdp2 keeps the optimizer state on the devices; the executor "
                                           "checkpoints host state: run it without checkpoints");
    if (o.optimizer.clip_grad_norm > 0) throw InputError("--clip-grad-norm", "not with --system fsdp2");
    if (o.optimizer.on_nonfinite == NonFinitePolicy::kSkip) throw InputError("--on-nonfinite", "skip: not with --system fsdp2");
  }
  Plan plan = plan_for_system(o.plan, o.system, o.card);
  // ZeRO-Offload keeps every unit's parameters on the device: one slot per unit, charged as such.
  if (traits.params_resident) plan.gpu_buffer_depth = layout.num_units();
  // Clipping and skipping need the update after the backward; a plan may ask for that schedule too
  // (slidedp-plan --clip, a study measuring it) without either.
  plan.verify_updates = plan.verify_updates || needs_update_after_backward(o.optimizer);
  // The baselines' device buffers of their own (rank_driver.h): decided once, for the account and the drivers.
  const bool fetch_fp32 = traits.param_fetch_bytes == 4.0;                      // FSDP offload
  const bool accumulate_on_gpu = traits.accumulate_on_gpu && plan.accum_steps > 1;  // ZeRO-Offload
  // Refused before any allocation, not by the OOM killer: the host memory the run allocates (the
  // account the model charges, model/memory_account.h) and the initial weights while they load.
  const bool split_master = use_split_master(o);
  check_host_memory(o, layout, plan, split_master);
  const int N = plan.ranks;
  const int U = layout.num_units();
  const int M = plan.nodes, node = o.link && M > 1 ? o.link->node() : 0;
  NodeLink* link = M > 1 ? o.link : nullptr;
  const bool sharded_nodes = link && plan.host_state == slidedp::HostState::kSharded;
  TrainResult result;

  // Initial state: a checkpoint, a Hugging Face folder, or random weights.
  std::optional<CheckpointReader> ckpt;
  UnitBuffers weights;
  if (!o.resume_dir.empty()) {
    ckpt.emplace(resolve_checkpoint_dir(o.resume_dir));
    // The whole architecture, not a size: another model with the same unit sizes would load and train
    // with the wrong math (other heads, eps, RoPE).
    const std::vector<std::string> differ = architecture_differences(o.card, ckpt->card());
    if (!differ.empty())
      throw InputError(ckpt->dir() + "/config.json",
                       fmt::format("the checkpoint is of another model than the run's ({}): {}{}", o.card.name,
                                   differ.front(), differ.size() > 1 ? fmt::format(" (and {} more)", differ.size() - 1) : ""));
    if (ckpt->layout().total_flat_numel != layout.total_flat_numel)
      throw InputError(ckpt->dir(), "the checkpoint's model does not match the run's model");
    result.start_step = ckpt->state().optimizer_step;
  } else if (!o.init_model_dir.empty()) {
    HfModel m = load_hf_model(o.init_model_dir);
    if (m.layout.total_flat_numel != layout.total_flat_numel)
      throw InputError(o.init_model_dir, "the model folder does not match the run's model card");
    weights = std::move(m.units);
  } else {
    weights = init_random_weights(layout, o.init_seed);
  }

  // Pacing to a target machine: the model's work for this plan on it, one pacer for every stream and
  // the updater.
  std::shared_ptr<const TargetPacing> pacing;
  if (o.emulate) {
    const Workload w = make_workload(o.card, o.seq_len);
    const Hardware& target = *o.emulate;
    const double scale = o.time_scale > 0 ? o.time_scale : TargetPacing::measured_time_scale(w, target, plan, o.system);
    pacing = std::make_shared<TargetPacing>(w, target, plan, scale, o.system);
    result.time_scale = scale;
  }

  RunControl control;
  InterruptWatch interrupts(control, o.stop, o.interrupt, o.signal, o.stop_grace_s);
  // The link's failures (a peer timed out, MPI failed) stop this run like any other thread's error.
  struct LinkHandler {
    NodeLink* link;
    ~LinkHandler() {
      if (link) link->on_failure(nullptr);
    }
  } link_handler{link};
  if (link) {
    link->on_failure([&control](std::exception_ptr e) { control.fail(e); });
    const Provenance& pv = provenance();
    check_nodes_agree(
        *link,
        {{"binary", fmt::format("{} {} {}", pv.version, pv.git_revision, pv.compiler)},
         {"model", fmt::format("{} {} {}", o.card.name, o.card.total_params(), layout.total_flat_numel)},
         {"plan", plan_to_yaml(plan)},
         {"seq_len", std::to_string(o.seq_len)},
         {"data", fmt::format("{} {} seed {} document end {}", o.dataset.name(), o.dataset.num_tokens(),
                              o.data_seed, o.document_end ? std::to_string(*o.document_end) : "none")},
         {"initial weights", ckpt ? fmt::format("checkpoint at step {}", result.start_step)
                             : !o.init_model_dir.empty() ? o.init_model_dir
                                                         : fmt::format("random, seed {}", o.init_seed)},
         {"steps", std::to_string(o.steps)},
         {"evaluation", o.eval_dataset ? fmt::format("{} {} every {}", o.eval_dataset->name(),
                                                     o.eval_dataset->num_tokens(), o.eval_every)
                                       : "none"},
         {"optimizer", fmt::format("{} wd {} betas {} {} eps {} clip {} exact {}", o.lr.summary(),
                                   o.optimizer.weight_decay, o.optimizer.beta1, o.optimizer.beta2,
                                   o.optimizer.eps, o.optimizer.clip_grad_norm, o.exact_fp32)}});
  }
  BackendOptions bo;
  bo.pacing = pacing;
  bo.devices = N;
  bo.exact_fp32 = o.exact_fp32;
  bo.loss_chunk_tokens = plan.loss_chunk_tokens;
  bo.mlp_token_tile = plan.mlp_token_tile;
  bo.packed_documents = o.document_end.has_value();
  bo.kernel_activity = o.trace_kernels;
  bo.collectives = plan.grad_shards() > 1 || (N > 1 && (plan.param_route == ParamRoute::kSharded ||
                                                        traits.params_resident || traits.gpu_optimizer));
  if (M > 1 && plan.grad_route == GradRoute::kGpu) bo.cross_node = link;
  // 0 leaves the default to the backend: a GPU's memory minus the plan's reserve, or 16 GiB emulated.
  bo.device_budget_bytes = o.device_budget_bytes > 0 ? o.device_budget_bytes : plan.gpu_mem_budget_bytes;
  bo.device_reserve_bytes = plan.gpu_mem_reserve_bytes;
  std::unique_ptr<Backend> backend = make_backend(o.backend, o.card, layout, bo, control);
  result.device_budget_bytes = backend->device(0).budget_bytes();
  {
    // Reject a plan that cannot fit before anything runs, with the numbers: the same account the
    // planner uses, over this backend's units and allocator (model/memory_account.h).
    RankMemorySpec spec = backend->device(0).memory_spec(plan.micro_batch, o.seq_len);
    spec.document_positions = o.document_end.has_value();
    spec.system = {traits.gpu_optimizer, fetch_fp32,
                   accumulate_on_gpu};  // as the drivers allocate (below)  // as the drivers allocate (below)
    RankMemoryAccount account =
        rank_memory_account(layout, plan, o.seq_len, o.card.tie_word_embeddings, spec);
    result.device_account = account;
    MemoryEstimate m;
    m.gpu_items = account.items;
    m.gpu_peak_bytes = account.peak_bytes;
    m.gpu_budget_bytes = static_cast<double>(result.device_budget_bytes);
    m.host_ram_bytes = m.host_pinned_limit_bytes = 1e30;
    auto v = m.violations();
    if (!v.empty()) throw InfeasibleError(fmt::format("{} backend, {}: {}", o.backend, plan.summary(static_cast<int>(o.card.num_layers)), v.front()));
  }
  const DType wire = o.exact_fp32 ? DType::kF32 : DType::kBF16;

  UpdaterConfig uc;
  uc.ranks = N;
  uc.accum_steps = plan.accum_steps;
  uc.route = plan.grad_shards() > 1 ? GradRoute::kGpu : GradRoute::kCpu;
  uc.wire_dtype = wire;
  uc.tied = o.card.tie_word_embeddings;
  uc.optimizer = o.optimizer;
  uc.pacing = pacing.get();
  uc.update_after_backward = traits.update_after_backward;
  uc.serial_accumulation = traits.lock_serialized_accumulation && uc.route == GradRoute::kCpu;
  uc.device_optimizer = traits.gpu_optimizer;
  uc.link = link;
  uc.sharded_state = sharded_nodes;
  uc.norm_pass_after_backward = o.norm_pass_after_backward;
  uc.verify_updates = plan.verify_updates;
  // Frozen buffers (Gemma 4's layer_scalar) are never decayed, whatever the groups say.
  if (o.optimizer.no_decay.any() || has_frozen_buffers(layout))
    uc.no_decay_ranges = no_decay_ranges(layout, o.optimizer.no_decay);
  if (ckpt && ckpt->state().adamw_step >= 0)
    uc.skipped_steps_before = ckpt->state().optimizer_step - ckpt->state().adamw_step;
  const bool verify = updates_after_backward(plan, traits);

  HostStateOptions hso;
  hso.chunk_numel = plan.chunk_numel;
  hso.mirror_dtype = o.exact_fp32 ? DType::kF32 : DType::kBF16;
  hso.accumulate_all = accumulates_every_unit(plan, traits);
  hso.accumulate_unit0 = o.card.tie_word_embeddings;
  if (sharded_nodes) hso.shard = node, hso.shards = M, hso.shard_ranks = N;
  hso.split_master = split_master;
  hso.moments = plan.optimizer_states;
  hso.update_pieces = M * N;
  hso.mirror_ties_toward_zero = o.mirror_ties_toward_zero;
  HostState state(*backend, layout, hso);
  result.host_state_bytes = state.host_bytes();
  if (ckpt) {
    load_host_state(*ckpt, state);  // unit by unit, this node's shard only
    state.set_updated(static_cast<uint64_t>(result.start_step));
  } else {
    std::vector<std::span<const float>> s;
    for (const auto& w : weights) s.emplace_back(w);
    state.load_master(s);
  }
  weights.clear();

  const int64_t slot_bytes = grad_staging_slot_bytes(layout, plan, dtype_bytes(wire));
  std::vector<std::unique_ptr<StagingRing>> rings;
  std::vector<StagingRing*> ring_ptrs;
  for (int r = 0; r < N; ++r) {
    rings.push_back(std::make_unique<StagingRing>(*backend, kGradStagingChunksPerRank, slot_bytes));
    ring_ptrs.push_back(rings.back().get());
  }

  // SlideFormer's rank 0 and MegaTrain's main process update with one process's share of the cores.
  const bool one_process = o.system == System::kSlideFormerDP || o.system == System::kMegaTrain;
  const int threads = o.update_threads > 0     ? o.update_threads
                      : plan.update_threads > 0 ? plan.update_threads
                      : one_process             ? std::max(1, ThreadPool::available_cpus() / N)
                                                : ThreadPool::available_cpus();
  ThreadPool pool(threads);

  std::mutex span_mutex;
  std::vector<MeasuredSpan> host_spans;
  if (o.trace) {
    backend->set_tracing(true);
    Backend* b = backend.get();
    uc.clock = [b] { return b->trace_clock_s(); };
    uc.on_job = [b](const char* what, int unit, int64_t chunk, int64_t step, double s, double e) {
      MeasuredSpan span;
      span.stream = "cpu update";
      span.tag.category = "cpu_update";
      span.tag.what = what;
      span.tag.unit = unit;
      span.tag.chunk = static_cast<int>(chunk);
      span.tag.step = static_cast<int>(step);
      span.start_s = s;
      span.end_s = e;
      b->add_span(span);
    };
  }
  Updater updater(state, ring_ptrs, pool, control, uc);

  const int64_t global_batch = plan.global_batch_sequences();
  refuse_all_masked(o.dataset, "train on");  // it would "train" at loss 0 without a gradient
  if (o.eval_dataset) refuse_all_masked(*o.eval_dataset, "evaluate");  // every evaluation would be NaN
  SequenceSampler sampler(o.dataset, o.seq_len, global_batch, o.data_seed, o.document_end);
  if (ckpt) sampler.resume(ckpt->state().data_cursor, result.start_step);
  // Evaluation: every held-out sequence in file order, shared among the ranks (evaluation.h).
  std::optional<SequenceSampler> eval_sampler;
  std::optional<EvalTally> eval_tally;
  if (o.eval_dataset) {
    eval_sampler.emplace(*o.eval_dataset, o.seq_len, 1, 0, o.document_end);
    const int64_t rows = eval_sampler->sequences_with_tail();
    eval_tally.emplace(control, N, eval_micro_batches(rows, N * M, plan.micro_batch));
  }

  std::vector<std::unique_ptr<RankDriver>> drivers;
  for (int r = 0; r < N; ++r) {
    DriverConfig dc;
    dc.rank = r;
    dc.ranks = N;
    dc.node = node;
    dc.nodes = M;
    dc.plan = plan;
    dc.seq_len = o.seq_len;
    dc.wire_dtype = wire;
    dc.tied = o.card.tie_word_embeddings;
    dc.router_aux_loss_coef = o.router_aux_loss_coef;
    dc.convert_on_load = traits.convert_on_load;
    dc.refetch_for_recompute = traits.refetch_for_recompute;
    dc.resident_params = traits.params_resident;
    dc.accumulate_on_gpu = accumulate_on_gpu;
    dc.fetch_fp32 = fetch_fp32;
    dc.whole_update_gate = traits.update_after_backward && !traits.gpu_optimizer;
    dc.device_optimizer = traits.gpu_optimizer;
    // (With the update after the backward, waiting for an update inside the backward would deadlock.)
    dc.shared_grad_buffer = traits.shared_grad_buffer && !verify;
    dc.pacing = pacing.get();
    if (node * N + r == o.inject_rank) {
      dc.inject_nan_step = o.inject_nan_step;
      dc.inject_nan_unit = o.inject_nan_unit;
      dc.inject_throw_step = o.inject_throw_step;
      dc.inject_throw_unit = o.inject_throw_unit;
    }
    drivers.push_back(std::make_unique<RankDriver>(*backend, state, updater, *rings[static_cast<size_t>(r)], sampler,
                                                   layout, dc));
  }

  const int64_t first = result.start_step, last = result.start_step + o.steps;  // [first, last)
  // After which steps the held-out data is evaluated: every eval_every-th and the last.
  auto eval_after = [&](int64_t s) {
    return eval_sampler && (s + 1 == last || (o.eval_every > 0 && (s + 1) % o.eval_every == 0));
  };
  // Waits for the evaluation the ranks report as `id`, adds every node's and reports it.
  auto collect_eval = [&](int64_t after_step, int64_t id) {
    const auto t0 = std::chrono::steady_clock::now();
    EvalLoss e = eval_tally->wait(id);
    if (link) e = sum_over_nodes(*link, e, &control);
    EvalPoint p;
    p.step = after_step;
    p.loss = e.loss();
    p.tokens = static_cast<int64_t>(e.tokens);
    p.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.evals.push_back(p);
    if (o.on_eval) o.on_eval(p);
  };
  StepPermits permits(control);
  std::vector<std::thread> threads_v;
  for (int r = 0; r < N; ++r) {
    threads_v.emplace_back([&, r] {
      try {
        for (int64_t s = first; s < last; ++s) {
          if (!permits.wait(s)) return;
          drivers[static_cast<size_t>(r)]->issue_step(s);
          if (eval_after(s)) {
            drivers[static_cast<size_t>(r)]->issue_eval(s + 1, s, *eval_sampler, *eval_tally);
            eval_tally->wait_rank(s, r);  // the next step's work starts after the evaluation's
          }
        }
        // No step to run: the evaluation of the starting weights (a model or a checkpoint).
        if (first == last && eval_sampler) {
          drivers[static_cast<size_t>(r)]->issue_eval(first, first - 1, *eval_sampler, *eval_tally);
          eval_tally->wait_rank(first - 1, r);
        }
      } catch (const Aborted&) {
      } catch (...) {
        control.fail(std::current_exception());
      }
    });
  }

  auto announce = [&](int64_t s) {
    updater.begin_step(s, lr_at(o.lr, s + 1));
    permits.permit(s);
  };
  auto shutdown = [&] {
    if (pacing) pacing->pacer().cancel();  // a paced wait would hold the streams for its whole length
    permits.finish();
    for (auto& t : threads_v) t.join();
    threads_v.clear();
    backend->quiesce();
  };

  std::vector<MeasuredSpan> spans;
  try {
    if (first < last) {
      updater.allow_updates_through(first);
      announce(first);
    } else if (eval_sampler) {
      collect_eval(first, first - 1);
    }
    auto t_prev = std::chrono::steady_clock::now();
    for (int64_t s = first; s < last; ++s) {
      if (s + 1 < last) announce(s + 1);  // drivers may start the next step's forward right away
      StepOutcome out = updater.wait_step(s);
      const auto t_now = std::chrono::steady_clock::now();
      TrainStep rec;
      rec.step = s + 1;
      rec.loss = out.loss();
      rec.tokens = static_cast<int64_t>(out.target_count);
      rec.wall_s = std::chrono::duration<double>(t_now - t_prev).count();
      rec.lr = lr_at(o.lr, s + 1);
      rec.grad_norm = out.grad_norm;
      rec.skipped = out.skipped;
      rec.skipped_reason = out.skipped_reason;
      t_prev = t_now;
      if (o.trace) {
        std::vector<MeasuredSpan> more = backend->take_spans();
        spans.insert(spans.end(), more.begin(), more.end());
        summarize_step(spans, s, o.sample_spans_every > 0 && (s + 1) % o.sample_spans_every == 0, rec);
      }
      if (link) gather_node_phases(*link, rec);
      // The step is reported (and logged by the caller) before its checkpoint is published: a kill
      // between the two then leaves a logged step whose checkpoint is missing (the resume repeats it
      // under a new run), never a checkpoint whose step the log has lost.
      result.steps.push_back(rec);
      if (on_step) on_step(rec);
      // A stop request ends the run after this step (with a checkpoint when checkpointing).
      bool stop_now = o.stop && o.stop->load() && s + 1 < last;
      if (link) stop_now = any_node(*link, stop_now);  // every node stops after the same step
      // The run stops cleanly from here (the checkpoint below is written whatever the grace); only an
      // interrupt ends it sooner, once the file being written is complete.
      if (stop_now || s + 1 == last) interrupts.stop_taken();
      // Checkpoint while the gate holds back step s+1's updates: the state is exactly step s's.
      const bool save = !o.checkpoint_dir.empty() &&
                        ((o.checkpoint_every > 0 && (s + 1) % o.checkpoint_every == 0) || s + 1 == last || stop_now);
      if (save) {
        TrainerState ts;
        ts.optimizer_step = s + 1;
        ts.adamw_step = s + 1 - updater.skipped_steps();
        ts.lr_schedule_step = s + 1;
        ts.lr_schedule_json = lr_schedule_to_json(o.lr);
        ts.learning_rate = rec.lr;
        ts.data_cursor = sampler.cursor_at_step(s + 1);
        ts.metadata_json = o.metadata_json;
        ts.optimizer_states = plan.optimizer_states;
        if (sharded_nodes) {
          // Every node writes its part of one folder; none holds the whole state.
          result.last_checkpoint = save_sharded_checkpoint(*link, state, o.card, ts, o.checkpoint_dir, o.keep_checkpoints);
        } else if (node == 0) {
          CheckpointData cd;
          cd.card = o.card;
          // A split master and lossy moments, widened to fp32 while they are written.
          std::vector<std::array<std::vector<float>, 3>> widened(static_cast<size_t>(U));
          for (int u = 0; u < U; ++u) {
            auto& w = widened[static_cast<size_t>(u)];
            cd.master.push_back(state.master_values(u, w[0]));
            cd.adam_m.push_back(state.moment_values(u, 0, w[1]));
            cd.adam_v.push_back(state.moment_values(u, 1, w[2]));
          }
          cd.state = ts;
          result.last_checkpoint = save_checkpoint(o.checkpoint_dir, cd, o.keep_checkpoints);
        }
      }
      // The evaluation after this step, once the step is logged and checkpointed (a stop during it
      // loses nothing). The ranks start step s+1 only after it: its time does not include it.
      if (eval_after(s)) {
        collect_eval(s + 1, s);
        t_prev = std::chrono::steady_clock::now();
      }
      if (stop_now) {
        result.stopped_early = true;  // step s+1 may be in flight; its updates stay behind the gate
        break;
      }
      updater.allow_updates_through(s + 1);
    }
    if (result.stopped_early) {
      // Step `last` may already be in flight: its updates are held by the gate. Abort it quietly.
      control.fail(std::make_exception_ptr(Aborted{}));
      shutdown();
    } else {
      permits.finish();
      for (auto& t : threads_v) t.join();
      threads_v.clear();
      backend->synchronize();
    }
  } catch (const Aborted&) {
    shutdown();
    control.rethrow_if_failed();
    throw RuntimeError("training aborted without a recorded error");
  } catch (...) {
    control.fail(std::current_exception());
    shutdown();
    throw;
  }
  if (!result.stopped_early) control.rethrow_if_failed();

  if (o.trace) {
    if (!result.stopped_early) updater.wait_idle();  // the last update's span is recorded after its step is done
    std::vector<MeasuredSpan> more = backend->take_spans();
    spans.insert(spans.end(), more.begin(), more.end());
    result.spans = std::move(spans);
  }
  // FSDP2's final state comes back from the devices (a run stopped early keeps its initial host state).
  if (!result.stopped_early)
    for (auto& d : drivers) d->store_state();
  // Skipping every step is not training (the weights are as loaded): an error for every caller, the
  // CLI, the planner's measured runs and the sweeps alike.
  const auto skipped = std::count_if(result.steps.begin(), result.steps.end(), [](const TrainStep& s) { return s.skipped; });
  if (!result.steps.empty() && skipped == static_cast<std::ptrdiff_t>(result.steps.size()))
    throw NumericError(fmt::format("every one of the {} steps was skipped (--on-nonfinite skip; the last: {}): the "
                                   "weights are as loaded",
                                   result.steps.size(), result.steps.back().skipped_reason));
  // The final weights as a Hugging Face folder, straight from the host state: sharded across nodes,
  // each node writes its part (no node collects them); otherwise node 0 writes it.
  if (!o.save_model_dir.empty()) {
    HfSaveOptions so;
    so.overwrite = true;
    // The folder the run started from gives its tokenizer (and generation config) to the saved one, so
    // that it loads back as a whole model; saving over that folder keeps them anyway.
    std::error_code same_error;
    if (!o.init_model_dir.empty() && !std::filesystem::equivalent(o.init_model_dir, o.save_model_dir, same_error))
      so.copy_extra_files_from = o.init_model_dir;
    // A second signal during the save ends the run at once (the watch records it as the run's error),
    // leaving the destination as it was: a large model's save outlasts a scheduler's grace. Across
    // nodes the node it reached stops writing its part and every node abandons the folder together.
    so.poll = [&control] { control.check(); };
    try {
      if (sharded_nodes) {
        save_sharded_model(*link, state, o.card, o.save_model_dir, so);
      } else if (node == 0) {
        UnitSpans final_weights;
        std::vector<std::vector<float>> rebuilt(static_cast<size_t>(U));  // a split master, in fp32
        for (int u = 0; u < U; ++u)
          final_weights.push_back(state.master_values(u, rebuilt[static_cast<size_t>(u)]));
        save_hf_model(o.save_model_dir, o.card, final_weights, so);
      }
    } catch (const Aborted&) {
      control.rethrow_if_failed();
      throw;
    }
  }
  for (auto& d : drivers) d->release_all();
  for (int r = 0; r < N; ++r) {
    result.device_high_water_bytes.push_back(backend->device(r).high_water_bytes());
    result.device_held_high_water_bytes.push_back(backend->device(r).held_high_water_bytes());
  }
  if (!sharded_nodes)
    for (int u = 0; u < U; ++u) {
      std::vector<float> rebuilt;
      const std::span<const float> values = state.master_values(u, rebuilt);
      result.master.emplace_back(values.begin(), values.end());
    }
  result.host_allocated = backend->host_bytes_allocated();
  if (pacing) {
    result.paced_ops = pacing->pacer().flows();
    result.paced_overruns = pacing->pacer().overruns();
    result.paced_overrun_s = pacing->pacer().overrun_s();
    for (int r = 0; r < N; ++r) {
      result.paced_h2d_bytes.push_back(pacing->copied_bytes(r, true));
      result.paced_d2h_bytes.push_back(pacing->copied_bytes(r, false));
    }
  }
  return result;
}

}  // namespace slidedp::exec
