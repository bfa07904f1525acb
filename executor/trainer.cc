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
#include "executor/run_setup.h"
#include "executor/state_checkpoint.h"
#include "executor/step_loop.h"
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

// The final weights as a Hugging Face folder, straight from the host state: sharded across nodes,
// each node writes its part (no node collects them); otherwise node 0 writes it.
void save_final_model(const TrainOptions& o, const RunShape& shape, const HostState& state,
                      RunControl& control) {
  HfSaveOptions so;
  so.overwrite = true;
  // The folder the run started from gives its tokenizer (and generation config) to the saved one, so
  // that it loads back as a whole model; saving over that folder keeps them anyway.
  std::error_code same_error;
  if (!o.init_model_dir.empty() &&
      !std::filesystem::equivalent(o.init_model_dir, o.save_model_dir, same_error))
    so.copy_extra_files_from = o.init_model_dir;
  // A second signal during the save ends the run at once (the watch records it as the run's error),
  // leaving the destination as it was: a large model's save outlasts a scheduler's grace. Across
  // nodes the node it reached stops writing its part and every node abandons the folder together.
  so.poll = [&control] { control.check(); };
  try {
    if (shape.sharded_nodes) {
      save_sharded_model(*shape.link, state, o.card, o.save_model_dir, so);
    } else if (shape.node == 0) {
      UnitSpans final_weights;
      std::vector<std::vector<float>> rebuilt(static_cast<size_t>(shape.units));  // a split master, in fp32
      for (int u = 0; u < shape.units; ++u)
        final_weights.push_back(state.master_values(u, rebuilt[static_cast<size_t>(u)]));
      save_hf_model(o.save_model_dir, o.card, final_weights, so);
    }
  } catch (const Aborted&) {
    control.rethrow_if_failed();
    throw;
  }
}

// Skipping every step is not training (the weights are as loaded): an error for every caller, the
// CLI, the planner's measured runs and the sweeps alike.
void refuse_all_skipped(const std::vector<TrainStep>& steps) {
  const auto skipped =
      std::count_if(steps.begin(), steps.end(), [](const TrainStep& s) { return s.skipped; });
  if (!steps.empty() && skipped == static_cast<std::ptrdiff_t>(steps.size()))
    throw NumericError(
        fmt::format("every one of the {} steps was skipped (--on-nonfinite skip; the last: {}): the "
                    "weights are as loaded",
                    steps.size(), steps.back().skipped_reason));
}

// What the run leaves for its caller: the devices' high-water marks, the final master weights (when
// this node holds them all), the host allocations and the pacer's counts.
void fill_final_result(TrainResult& result, const RunShape& shape, Backend& backend, const HostState& state,
                       const TargetPacing* pacing) {
  for (int r = 0; r < shape.ranks; ++r) {
    result.device_high_water_bytes.push_back(backend.device(r).high_water_bytes());
    result.device_held_high_water_bytes.push_back(backend.device(r).held_high_water_bytes());
  }
  if (!shape.sharded_nodes)
    for (int u = 0; u < shape.units; ++u) {
      std::vector<float> rebuilt;
      const std::span<const float> values = state.master_values(u, rebuilt);
      result.master.emplace_back(values.begin(), values.end());
    }
  result.host_allocated = backend.host_bytes_allocated();
  if (!pacing) return;
  result.paced_ops = pacing->pacer().flows();
  result.paced_overruns = pacing->pacer().overruns();
  result.paced_overrun_s = pacing->pacer().overrun_s();
}

}  // namespace

TrainResult train(const TrainOptions& o, const std::function<void(const TrainStep&)>& on_step) {
  const ModelLayout layout = make_model_layout(o.card);
  validate(o, layout);
  const RunShape shape = run_shape(o, layout);
  const int N = shape.ranks;
  TrainResult result;
  InitialWeights init = load_initial_weights(o, layout);
  result.start_step = init.start_step;
  const std::shared_ptr<const TargetPacing> pacing = make_pacing(o, shape, result.time_scale);

  RunControl control;
  InterruptWatch interrupts(control, o.stop, o.interrupt, o.signal, o.stop_grace_s);
  // The link's failures (a peer timed out, MPI failed) stop this run like any other thread's error.
  struct LinkHandler {
    NodeLink* link;
    ~LinkHandler() {
      if (link) link->on_failure(nullptr);
    }
  } link_handler{shape.link};
  if (shape.link) {
    shape.link->on_failure([&control](std::exception_ptr e) { control.fail(e); });
    check_nodes_run_the_same(*shape.link, o, layout, shape, init);
  }
  std::unique_ptr<Backend> backend =
      make_backend(o.backend, o.card, layout, backend_options(o, shape, pacing), control);
  result.device_budget_bytes = backend->device(0).budget_bytes();
  result.device_account = check_device_memory(o, layout, shape, *backend);

  UpdaterConfig uc = updater_config(o, layout, shape, pacing.get(), init);
  HostState state(*backend, layout, host_state_options(o, shape));
  result.host_state_bytes = state.host_bytes();
  load_initial_state(state, init);

  const int64_t slot_bytes = grad_staging_slot_bytes(layout, shape.plan, shape.staged_grad_bytes);
  std::vector<std::unique_ptr<StagingRing>> rings;
  std::vector<StagingRing*> ring_ptrs;
  for (int r = 0; r < N; ++r) {
    rings.push_back(std::make_unique<StagingRing>(*backend, kGradStagingChunksPerRank, slot_bytes));
    ring_ptrs.push_back(rings.back().get());
  }
  ThreadPool pool(update_thread_count(o, shape));
  if (o.trace) {
    backend->set_tracing(true);
    trace_updates(uc, *backend);
  }
  Updater updater(state, ring_ptrs, pool, control, uc);

  refuse_all_masked(o.dataset, "train on");  // it would "train" at loss 0 without a gradient
  if (o.eval_dataset) refuse_all_masked(*o.eval_dataset, "evaluate");  // every evaluation would be NaN
  SequenceSampler sampler(o.dataset, o.seq_len, shape.plan.global_batch_sequences(), o.data_seed,
                          o.document_end);
  if (init.checkpoint) sampler.resume(init.checkpoint->state().data_cursor, result.start_step);
  // Evaluation: every held-out sequence in file order, shared among the ranks (evaluation.h).
  std::optional<SequenceSampler> eval_sampler;
  std::optional<EvalTally> eval_tally;
  if (o.eval_dataset) {
    eval_sampler.emplace(*o.eval_dataset, o.seq_len, 1, 0, o.document_end);
    const int64_t rows = eval_sampler->sequences_with_tail();
    eval_tally.emplace(control, N, eval_micro_batches(rows, N * shape.nodes, shape.plan.micro_batch));
  }
  std::vector<std::unique_ptr<RankDriver>> drivers;
  for (int r = 0; r < N; ++r)
    drivers.push_back(std::make_unique<RankDriver>(*backend, state, updater, *rings[static_cast<size_t>(r)],
                                                   sampler, layout,
                                                   driver_config(o, shape, r, pacing.get())));

  StepLoop({o, shape, *backend, state, updater, sampler, drivers, control, interrupts, pacing.get(),
            eval_sampler, eval_tally},
           result)
      .run(on_step);
  // FSDP2's final state comes back from the devices (a run stopped early keeps its initial host state).
  if (!result.stopped_early)
    for (auto& d : drivers) d->store_state();
  refuse_all_skipped(result.steps);
  if (!o.save_model_dir.empty()) save_final_model(o, shape, state, control);
  for (auto& d : drivers) d->release_all();
  fill_final_result(result, shape, *backend, state, pacing.get());
  return result;
}

}  // namespace slidedp::exec
