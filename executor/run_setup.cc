#include "executor/run_setup.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/host_memory.h"
#include "common/provenance.h"
#include "common/thread_pool.h"
#include "common/units.h"
#include "executor/backend_registry.h"
#include "executor/init_weights.h"
#include "executor/node_state.h"
#include "executor/state_checkpoint.h"
#include "executor/weight_decay_groups.h"
#include "io/hf_model.h"
#include "model/memory_model.h"
#include "model/step_work.h"
#include "model/workload.h"

namespace slidedp::exec {
namespace {

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
  std::sort(items.begin(), items.end(),
            [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
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
    throw InfeasibleError(fmt::format(
        "{}: the run needs {} of host memory but this host has {} of RAM (largest: {}); "
        "shard the host state across nodes, offload fewer layers or use a smaller model",
        o.card.name, format_bytes(total), format_bytes(static_cast<double>(ram)), largest(items)));
  if (o.host_pinned_limit_bytes <= 0) return;
  std::vector<MemoryItem> pinned;
  double pinned_total = 0;
  for (const MemoryItem& i : items)
    if (i.name.find("(pinned") != std::string::npos) pinned.push_back(i), pinned_total += i.bytes;
  if (pinned_total > static_cast<double>(o.host_pinned_limit_bytes))
    throw InfeasibleError(
        fmt::format("{}: the run page-locks {} of host memory but may pin {} (--host-pinned-limit; "
                    "largest: {}); offload fewer layers, use smaller chunks or raise the limit",
                    o.card.name, format_bytes(pinned_total),
                    format_bytes(static_cast<double>(o.host_pinned_limit_bytes)), largest(pinned)));
}

// FSDP2's optimizer state lives on the devices: the host-side features that read it mid-run
// (checkpoints, the global-norm clip, skipping a step) are not part of this baseline's run.
void refuse_host_features_of_device_optimizer(const TrainOptions& o) {
  if (!o.checkpoint_dir.empty())
    throw InputError("--checkpoint-dir",
                     "--system fsdp2 keeps the optimizer state on the devices; the executor "
                     "checkpoints host state: run it without checkpoints");
  if (o.optimizer.clip_grad_norm > 0) throw InputError("--clip-grad-norm", "not with --system fsdp2");
  if (o.optimizer.on_nonfinite == NonFinitePolicy::kSkip)
    throw InputError("--on-nonfinite", "skip: not with --system fsdp2");
}

}  // namespace

RunShape run_shape(const TrainOptions& o, const ModelLayout& layout) {
  RunShape s;
  s.traits = system_traits(o.system);
  if (s.traits.gpu_optimizer) refuse_host_features_of_device_optimizer(o);
  s.plan = plan_for_system(o.plan, o.system, o.card);
  // ZeRO-Offload keeps every unit's parameters on the device: one slot per unit, charged as such.
  if (s.traits.params_resident) s.plan.gpu_buffer_depth = layout.num_units();
  // Clipping and skipping need the update after the backward; a plan may ask for that schedule too
  // (slidedp-plan --clip, a study measuring it) without either.
  s.plan.verify_updates = s.plan.verify_updates || needs_update_after_backward(o.optimizer);
  s.fetch_fp32 = s.traits.param_fetch_bytes == 4.0;
  s.accumulate_on_gpu = s.traits.accumulate_on_gpu && s.plan.accum_steps > 1;
  s.partition_round_trip = s.traits.partition_round_trip;
  // Refused before any allocation, not by the OOM killer: the host memory the run allocates (the
  // account the model charges, model/memory_account.h) and the initial weights while they load.
  s.split_master = use_split_master(o);
  check_host_memory(o, layout, s.plan, s.split_master);
  s.ranks = s.plan.ranks;
  s.units = layout.num_units();
  s.nodes = s.plan.nodes;
  s.node = o.link && s.nodes > 1 ? o.link->node() : 0;
  s.link = s.nodes > 1 ? o.link : nullptr;
  s.sharded_nodes = s.link && s.plan.host_state == slidedp::HostState::kSharded;
  s.wire = o.exact_fp32 ? DType::kF32 : DType::kBF16;
  s.staged_grad_bytes = staged_grad_bytes(o.system, dtype_bytes(s.wire));
  s.widen_grad = widens_grad_on_device(s.plan, o.system, dtype_bytes(s.wire));
  s.verify = updates_after_backward(s.plan, s.traits);
  return s;
}

InitialWeights load_initial_weights(const TrainOptions& o, const ModelLayout& layout) {
  InitialWeights init;
  if (!o.resume_dir.empty()) {
    CheckpointReader& ckpt = init.checkpoint.emplace(resolve_checkpoint_dir(o.resume_dir));
    // The whole architecture, not a size: another model with the same unit sizes would load and train
    // with the wrong math (other heads, eps, RoPE).
    const std::vector<std::string> differ = architecture_differences(o.card, ckpt.card());
    if (!differ.empty())
      throw InputError(
          ckpt.dir() + "/config.json",
          fmt::format("the checkpoint is of another model than the run's ({}): {}{}", o.card.name,
                      differ.front(),
                      differ.size() > 1 ? fmt::format(" (and {} more)", differ.size() - 1) : ""));
    if (ckpt.layout().total_flat_numel != layout.total_flat_numel)
      throw InputError(ckpt.dir(), "the checkpoint's model does not match the run's model");
    init.start_step = ckpt.state().optimizer_step;
  } else if (!o.init_model_dir.empty()) {
    HfModel m = load_hf_model(o.init_model_dir);
    if (m.layout.total_flat_numel != layout.total_flat_numel)
      throw InputError(o.init_model_dir, "the model folder does not match the run's model card");
    init.weights = std::move(m.units);
  } else {
    init.weights = init_random_weights(layout, o.init_seed);
  }
  return init;
}

std::shared_ptr<const TargetPacing> make_pacing(const TrainOptions& o, const RunShape& shape, double& scale) {
  if (!o.emulate) return nullptr;
  const Workload w = make_workload(o.card, o.seq_len);
  const Hardware& target = *o.emulate;
  scale =
      o.time_scale > 0 ? o.time_scale : TargetPacing::measured_time_scale(w, target, shape.plan, o.system);
  return std::make_shared<TargetPacing>(w, target, shape.plan, scale, o.system);
}

void check_nodes_run_the_same(NodeLink& link, const TrainOptions& o, const ModelLayout& layout,
                              const RunShape& shape, const InitialWeights& init) {
  const Provenance& pv = provenance();
  check_nodes_agree(
      link, {{"binary", fmt::format("{} {} {}", pv.version, pv.git_revision, pv.compiler)},
             {"model", fmt::format("{} {} {}", o.card.name, o.card.total_params(), layout.total_flat_numel)},
             {"plan", plan_to_yaml(shape.plan)},
             {"seq_len", std::to_string(o.seq_len)},
             {"data", fmt::format("{} {} seed {} document end {}", o.dataset.name(), o.dataset.num_tokens(),
                                  o.data_seed, o.document_end ? std::to_string(*o.document_end) : "none")},
             {"initial weights", init.checkpoint ? fmt::format("checkpoint at step {}", init.start_step)
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

BackendOptions backend_options(const TrainOptions& o, const RunShape& shape,
                               std::shared_ptr<const TargetPacing> pacing) {
  const Plan& plan = shape.plan;
  const int N = shape.ranks;
  BackendOptions bo;
  bo.pacing = std::move(pacing);
  bo.devices = N;
  bo.exact_fp32 = o.exact_fp32;
  bo.loss_chunk_tokens = plan.loss_chunk_tokens;
  bo.mlp_token_tile = plan.mlp_token_tile;
  bo.packed_documents = o.document_end.has_value();
  bo.kernel_activity = o.trace_kernels;
  bo.collectives =
      plan.grad_shards() > 1 || (N > 1 && (plan.param_route == ParamRoute::kSharded ||
                                           shape.traits.params_resident || shape.traits.gpu_optimizer));
  if (shape.nodes > 1 && plan.grad_route == GradRoute::kGpu) bo.cross_node = shape.link;
  // 0 leaves the default to the backend: a GPU's memory minus the plan's reserve, or 16 GiB emulated.
  bo.device_budget_bytes = o.device_budget_bytes > 0 ? o.device_budget_bytes : plan.gpu_mem_budget_bytes;
  bo.device_reserve_bytes = plan.gpu_mem_reserve_bytes;
  return bo;
}

RankMemoryAccount check_device_memory(const TrainOptions& o, const ModelLayout& layout, const RunShape& shape,
                                      Backend& backend) {
  RankMemorySpec spec = backend.device(0).memory_spec(shape.plan.micro_batch, o.seq_len);
  spec.document_positions = o.document_end.has_value();
  spec.system = {shape.traits.gpu_optimizer, shape.fetch_fp32,
                 shape.accumulate_on_gpu || shape.partition_round_trip,
                 shape.widen_grad};  // as the drivers allocate
  RankMemoryAccount account =
      rank_memory_account(layout, shape.plan, o.seq_len, o.card.tie_word_embeddings, spec);
  MemoryEstimate m;
  m.gpu_items = account.items;
  m.gpu_peak_bytes = account.peak_bytes;
  m.gpu_budget_bytes = static_cast<double>(backend.device(0).budget_bytes());
  m.host_ram_bytes = m.host_pinned_limit_bytes = 1e30;
  const auto v = m.violations();
  if (!v.empty())
    throw InfeasibleError(fmt::format("{} backend, {}: {}", o.backend,
                                      shape.plan.summary(static_cast<int>(o.card.num_layers)), v.front()));
  return account;
}

UpdaterConfig updater_config(const TrainOptions& o, const ModelLayout& layout, const RunShape& shape,
                             const TargetPacing* pacing, const InitialWeights& init) {
  const Plan& plan = shape.plan;
  UpdaterConfig uc;
  uc.ranks = shape.ranks;
  uc.accum_steps = plan.accum_steps;
  uc.route = plan.grad_shards() > 1 ? GradRoute::kGpu : GradRoute::kCpu;
  uc.tied = o.card.tie_word_embeddings;
  uc.optimizer = o.optimizer;
  uc.pacing = pacing;
  uc.update_after_backward = shape.traits.update_after_backward;
  uc.serial_accumulation = shape.traits.lock_serialized_accumulation && uc.route == GradRoute::kCpu;
  uc.device_optimizer = shape.traits.gpu_optimizer;
  uc.link = shape.link;
  uc.sharded_state = shape.sharded_nodes;
  uc.norm_pass_after_backward = o.norm_pass_after_backward;
  uc.verify_updates = plan.verify_updates;
  // Frozen buffers (Gemma 4's layer_scalar) are never decayed, whatever the groups say.
  if (o.optimizer.no_decay.any() || has_frozen_buffers(layout))
    uc.no_decay_ranges = no_decay_ranges(layout, o.optimizer.no_decay);
  if (init.checkpoint && init.checkpoint->state().adamw_step >= 0)
    uc.skipped_steps_before = init.checkpoint->state().optimizer_step - init.checkpoint->state().adamw_step;
  return uc;
}

void trace_updates(UpdaterConfig& uc, Backend& backend) {
  Backend* b = &backend;
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

HostStateOptions host_state_options(const TrainOptions& o, const RunShape& shape) {
  HostStateOptions hso;
  hso.chunk_numel = shape.plan.chunk_numel;
  hso.mirror_dtype = o.exact_fp32 ? DType::kF32 : DType::kBF16;
  hso.accumulate_all = accumulates_every_unit(shape.plan, shape.traits);
  hso.accumulate_unit0 = o.card.tie_word_embeddings;
  if (shape.sharded_nodes) hso.shard = shape.node, hso.shards = shape.nodes, hso.shard_ranks = shape.ranks;
  hso.split_master = shape.split_master;
  hso.moments = shape.plan.optimizer_states;
  hso.update_pieces = shape.nodes * shape.ranks;
  hso.mirror_ties_toward_zero = o.mirror_ties_toward_zero;
  return hso;
}

void load_initial_state(HostState& state, InitialWeights& init) {
  if (init.checkpoint) {
    load_host_state(*init.checkpoint, state);  // unit by unit, this node's shard only
    state.set_updated(static_cast<uint64_t>(init.start_step));
  } else {
    std::vector<std::span<const float>> s;
    for (const auto& w : init.weights) s.emplace_back(w);
    state.load_master(s);
  }
  init.weights.clear();
}

int update_thread_count(const TrainOptions& o, const RunShape& shape) {
  const bool one_process = o.system == System::kSlideFormerDP || o.system == System::kMegaTrain;
  return o.update_threads > 0            ? o.update_threads
         : shape.plan.update_threads > 0 ? shape.plan.update_threads
         : one_process                   ? std::max(1, ThreadPool::available_cpus() / shape.ranks)
                                         : ThreadPool::available_cpus();
}

DriverConfig driver_config(const TrainOptions& o, const RunShape& shape, int rank,
                           const TargetPacing* pacing) {
  const SystemTraits& traits = shape.traits;
  DriverConfig dc;
  dc.rank = rank;
  dc.ranks = shape.ranks;
  dc.node = shape.node;
  dc.nodes = shape.nodes;
  dc.plan = shape.plan;
  dc.seq_len = o.seq_len;
  dc.wire_dtype = shape.wire;
  dc.tied = o.card.tie_word_embeddings;
  dc.router_aux_loss_coef = o.router_aux_loss_coef;
  dc.convert_on_load = traits.convert_on_load;
  dc.refetch_for_recompute = traits.refetch_for_recompute;
  dc.resident_params = traits.params_resident;
  dc.accumulate_on_gpu = shape.accumulate_on_gpu;
  dc.fetch_fp32 = shape.fetch_fp32;
  dc.widen_grad = shape.widen_grad;
  dc.partition_round_trip = shape.partition_round_trip;
  dc.whole_update_gate = traits.update_after_backward && !traits.gpu_optimizer;
  dc.device_optimizer = traits.gpu_optimizer;
  // (With the update after the backward, waiting for an update inside the backward would deadlock.)
  dc.shared_grad_buffer = traits.shared_grad_buffer && !shape.verify;
  dc.pacing = pacing;
  if (shape.node * shape.ranks + rank == o.inject_rank) {
    dc.inject_nan_step = o.inject_nan_step;
    dc.inject_nan_unit = o.inject_nan_unit;
    dc.inject_throw_step = o.inject_throw_step;
    dc.inject_throw_unit = o.inject_throw_unit;
  }
  return dc;
}

}  // namespace slidedp::exec
