// slidedp-run: trains a model with a plan, for real. With no model and no data it trains the small
// embedded default (slidedp-tiny, a Llama-architecture model, on the text compiled into the binary).
// Shows progress (step, loss, tokens/s, ETA), logs every run, step and phase to SQLite, writes
// checkpoints and can resume, writes the measured timeline as Chrome trace JSON, and in --bench mode
// reports each resource's busy time and the exposed (not overlapped) time per step.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/plan_flags.h"
#include "common/cli_checks.h"
#include "common/cli_main.h"
#include "common/cli_parse.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/units.h"
#include "executor/cli/run_flags.h"
#include "executor/cli/run_log_session.h"
#include "executor/cli/run_paths.h"
#include "executor/cli/run_report.h"
#include "executor/node_link.h"
#include "executor/node_state.h"
#include "executor/run_control.h"
#include "executor/step_record.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "io/checkpoint.h"
#include "io/checkpoint_root.h"
#include "io/default_corpus.h"
#include "io/hf_model.h"
#include "model/chrome_trace.h"
#include "model/hardware.h"
#include "model/step_model.h"
#include "model/system.h"

namespace slidedp {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_interrupt{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_training{false};  // the trainer watches g_interrupt (else a second signal kills)
// Multi-node: the link to the other nodes' processes. Outlives run_main, so that an error anywhere
// can end every node's process (main) instead of leaving them waiting.
std::unique_ptr<exec::NodeLink> g_link;
// SIGINT (a user's Ctrl-C) and SIGTERM (what docker, systemd and Slurm send before SIGKILL): the first
// finishes the step, checkpoints and logs the run as interrupted; a second (or a step that does not end
// within --stop-grace of the first) ends the run at once, logged interrupted, exit 128 + signal; one
// more, or a second outside training, is the signal's default action. Only lock-free atomics, signal()
// and raise() here: what a handler may call.
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  if (!g_stop.exchange(true)) return;
  if (g_training.load() && !g_interrupt.exchange(true)) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// The run's document end: --document-end, else what the token file records. A file packed for another
// sequence length still trains, its documents then cut at sequence boundaries: said on stderr.
void note_packing(const TokenDataset& data, int64_t seq_len) {
  const TokenFileDocuments& docs = data.documents();
  if (docs.packed_seq_len > 0 && docs.packed_seq_len != seq_len)
    std::fprintf(
        stderr,
        "slidedp-run: note: %s was packed for sequences of %lld tokens; at --seq %lld documents are cut at "
        "sequence boundaries\n",
        data.name().c_str(), static_cast<long long>(docs.packed_seq_len), static_cast<long long>(seq_len));
}

std::optional<int32_t> document_end_of(const TokenDataset& data, std::optional<int32_t> flag,
                                       int64_t seq_len) {
  note_packing(data, seq_len);
  const TokenFileDocuments& docs = data.documents();
  // A flag that differs is refused by the trainer, which checks every caller's options against the file.
  if (flag || !docs.document_end) return flag;
  return static_cast<int32_t>(*docs.document_end);
}

std::string fs_absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.string();
}

// Several nodes (one process each, started by mpirun): the link, and every option the same on every
// node, compared before any option is used (an option given to one node only stalled the others
// until --node-timeout, or mixed two configurations' weights); all but what only node 0 prints.
// The list comes from the options table, so a new option is included.
void link_nodes(const CLI::App& app, const RunFlags& f) {
  if (!exec::launched_by_mpi()) return;
  g_link = exec::make_mpi_link(0, f.node_timeout);  // the count is checked against the plan below
  exec::check_nodes_agree(*g_link, exec::options_to_agree(app, {"--json", "--quiet"}));
}

// The plan's node count against the launch; returns whether this process leads (node 0: reports,
// logs and writes checkpoints; the others train silently).
bool check_launch(const PlanFile& pf, RunFlags& f) {
  if (g_link && pf.plan.nodes == 1)
    throw InputError("--nodes", "started by an MPI launcher but the plan has 1 node: pass --nodes N (one process per node)");
  if (g_link && pf.plan.nodes != g_link->nodes())
    throw InputError("--nodes", fmt::format("the plan has {} nodes but the launcher started {} process(es): run `mpirun "
                                            "-np {} slidedp-run ...` (one process per node)",
                                            pf.plan.nodes, g_link->nodes(), pf.plan.nodes));
  if (!g_link && pf.plan.nodes > 1)
    g_link = exec::make_mpi_link(pf.plan.nodes, f.node_timeout);  // refuses, naming mpirun
  const bool lead = !g_link || g_link->node() == 0;
  if (!lead) f.quiet = true, f.no_db = true, f.json = false, f.trace.clear();
  return lead;
}

// The embedded default: slidedp-tiny on the built-in text with a 2-rank plan that exercises the
// sharded route, offload and recompute.
void apply_embedded_default(PlanFile& pf, const PlanFlags& flags, bool defaults) {
  if (pf.model.empty()) pf.model = "slidedp-tiny";
  if (pf.seq_len <= 0) pf.seq_len = 128;
  if (!defaults || !flags.plan_file.empty()) return;
  if (!flags.ranks) pf.plan.ranks = 2;
  if (!flags.micro_batch) pf.plan.micro_batch = 4;
  if (!flags.param_route) pf.plan.param_route = ParamRoute::kSharded;
  if (!flags.chunk_numel) pf.plan.chunk_numel = 1 << 16;
  if (!flags.activation)
    pf.plan.offload_layers = 1, pf.plan.recompute_layers = 2, pf.plan.keep_layers = Plan::kRest;
}

// The model, the plan, what runs where, the data and the optimizer: the trainer's options that follow
// from the flags and the plan file (a folder is a Hugging Face model: its card, and its weights to
// start from).
exec::TrainOptions model_data_and_optimizer(const CLI::App& app, const RunFlags& f, const PlanFile& pf) {
  exec::TrainOptions o;
  o.card = load_model_card(pf.model);
  pf.plan.validate(static_cast<int>(o.card.num_layers), "plan");  // before anything sizes by it
  if (is_folder(pf.model)) o.init_model_dir = pf.model;
  o.seq_len = pf.seq_len;
  o.plan = pf.plan;
  o.system = parse_system(f.system, "--system");
  exec::validate_multi_node_plan(
      o.plan);  // before the checkpoint root is taken (node 0 alone would write it)
  o.backend = f.backend;
  o.exact_fp32 = f.exact;
  o.master = f.master == "split"  ? exec::MasterStorage::kSplit
             : f.master == "fp32" ? exec::MasterStorage::kFp32
                                  : exec::MasterStorage::kAuto;
  o.device_budget_bytes = f.device_budget;
  if (!f.host_pinned_limit.empty())
    o.host_pinned_limit_bytes = budget_bytes_flag(f.host_pinned_limit, "--host-pinned-limit");
  o.update_threads = f.update_threads;
  o.dataset = f.data.empty() ? default_corpus_dataset() : TokenDataset::open(f.data);
  if (app.count("--eval-data") && f.eval_data.empty())
    throw InputError("--eval-data", "is empty (give a token file)");
  // Read into memory: a held-out file regenerated while the run goes on must not break a mapping.
  if (!f.eval_data.empty()) {
    if (!path_exists(f.eval_data)) throw IoError(f.eval_data, "no such file (--eval-data)");
    o.eval_dataset = TokenDataset::read(f.eval_data);
    note_packing(*o.eval_dataset, pf.seq_len);
  }
  if (f.eval_every > 0 && f.eval_data.empty())
    throw InputError("--eval-every", "needs --eval-data (the held-out token file)");
  o.eval_every = f.eval_every;
  o.data_seed = f.data_seed;
  o.init_seed = f.init_seed;
  o.steps = f.steps;
  o.optimizer = optimizer_from(f);
  o.router_aux_loss_coef = f.router_aux_loss_coef;
  o.document_end = document_end_of(o.dataset, f.document_end, pf.seq_len);
  if (!f.inject_nan.empty()) apply_inject_nan(f.inject_nan, o);
  return o;
}

// What each node reads, by content: one path can hold other files on another host (a root's newest
// checkpoint, a model folder or a token file copied differently), which would mix two runs' weights.
void check_nodes_read_the_same(const RunFlags& f, const PlanFile& pf,
                               const std::optional<TrainerState>& resumed) {
  if (!g_link) return;
  auto contents = [](const std::string& path) {
    return path_exists(path) ? content_fingerprint(path) : "(none)";
  };
  exec::check_nodes_agree(
      *g_link, {{"--resume (the checkpoint's files)",
                 resumed ? fmt::format("step {}, {}", resumed->optimizer_step, contents(f.resume)) : "none"},
                {"--model (its files)", contents(pf.model)},
                {"--data (its contents)", f.data.empty() ? "(embedded)" : contents(f.data)},
                {"--eval-data (its contents)", f.eval_data.empty() ? "(none)" : contents(f.eval_data)}});
}

// Every output against every input, before anything is written.
void check_outputs(const RunFlags& f, const PlanFile& pf) {
  auto if_file = [](const std::string& name_or_path) { return path_exists(name_or_path) ? name_or_path : ""; };
  check_run_paths({.model = if_file(pf.model),
                   .data = f.data,
                   .eval_data = f.eval_data,
                   .resume = f.resume,
                   .lr_schedule = f.lr_file,
                   .plan_file = f.plan.plan_file,
                   .hardware = if_file(pf.hardware),
                   .emulate = if_file(f.emulate),
                   .save_model = f.save_model,
                   .checkpoint_dir = f.checkpoint_dir,
                   .db = f.no_db ? "" : f.db,
                   .trace = f.trace});
}

// Checkpoints, the saved model, the timeline, signals and the link to the other nodes.
void set_outputs_and_control(exec::TrainOptions& o, const RunFlags& f, bool traced) {
  o.checkpoint_dir = f.checkpoint_dir;
  o.save_model_dir = f.save_model;
  o.checkpoint_every = f.checkpoint_every;
  o.keep_checkpoints = f.keep;
  o.resume_dir = f.resume;
  o.trace = traced || f.trace_kernels;
  o.trace_kernels = f.trace_kernels;
  o.sample_spans_every = 10;
  o.stop = &g_stop;
  o.interrupt = &g_interrupt;
  o.signal = &g_signal;
  o.stop_grace_s = f.stop_grace;
  o.link = g_link.get();
}

// Emulating a target: its prediction times the scale is what the run should measure. Returns the
// scale (1 without --emulate).
double set_emulation(exec::TrainOptions& o, const CLI::App& app, const RunFlags& f) {
  if (f.emulate.empty()) {
    if (app.count("--time-scale")) throw InputError("--time-scale", "only with --emulate");
    return 1.0;
  }
  if (f.backend != "cpu")
    throw InputError("--emulate", "pacing to a target machine is for the CPU backend (--backend cpu)");
  o.emulate = load_hardware(f.emulate);
  o.time_scale = f.time_scale > 0 ? f.time_scale
                                  : exec::TargetPacing::measured_time_scale(make_workload(o.card, o.seq_len),
                                                                            *o.emulate, o.plan, o.system);
  return o.time_scale;
}

// What the model predicts for this plan on this machine's profile (a run is also a model check).
struct ModelView {
  std::string hardware_name, hardware_yaml;
  std::optional<Prediction> predicted;
};

ModelView predict_run(const exec::TrainOptions& o, const RunFlags& f, const PlanFile& pf) {
  ModelView v;
  v.hardware_name = !f.emulate.empty()     ? f.emulate
                    : !pf.hardware.empty() ? pf.hardware
                                           : (f.backend == "cpu" ? "cpu-dev" : "");
  if (v.hardware_name.empty()) return v;
  const Hardware hw = load_hardware(v.hardware_name);
  v.hardware_yaml = hardware_to_yaml(hw);
  try {
    v.predicted = predict_analytical(make_workload(o.card, o.seq_len), hw, o.plan, o.system);
  } catch (const InputError&) {
    // A plan the preset cannot describe (e.g. more ranks than its GPUs): no prediction.
  }
  return v;
}

runlog::RunInfo run_info(const exec::TrainOptions& o, const Plan& run_plan, const ModelView& model, int argc,
                         char** argv) {
  runlog::RunInfo info;
  info.kind = runlog::RunKind::kTrain;
  info.command_line = command_line(argc, argv);
  info.backend = o.backend;
  info.plan_yaml = plan_to_yaml(run_plan);
  info.plan_summary = run_plan.summary(static_cast<int>(o.card.num_layers));
  info.hardware_name = model.hardware_name;
  info.hardware_yaml = model.hardware_yaml;
  info.model_name = o.card.name;
  info.seq_len = o.seq_len;
  info.system = system_name(o.system);
  return info;
}

// The lines before the first step: the run, the checkpoints, the model's prediction.
void print_header(const exec::TrainOptions& o, const Plan& run_plan, const ModelView& model, double scale,
                  const std::optional<CheckpointRootLease>& root_lease,
                  const std::optional<TrainerState>& resumed, const RunFlags& f) {
  if (f.json) return;
  fmt::print(
      "{} ({} params) | seq {} | {}{} | {} backend | {} | {} tokens/step{}\n", o.card.name,
      format_count(static_cast<double>(o.card.total_params())), o.seq_len,
      o.system == System::kSlideDP ? "" : std::string(system_name(o.system)) + ": ",
      run_plan.summary(static_cast<int>(o.card.num_layers)), o.backend, o.lr.summary(),
      o.plan.global_batch_sequences() * o.seq_len,
      g_link ? fmt::format(" | {} nodes, host state {}", g_link->nodes(), host_state_name(o.plan.host_state))
             : "");
  if (root_lease)
    fmt::print("checkpoints: {} ({} run {}{})\n", f.checkpoint_dir,
               root_lease->continues() ? "continuing" : "new", root_lease->owner().run_id,
               resumed ? fmt::format(", from step {} of {}", resumed->optimizer_step, f.resume) : "");
  if (model.predicted)
    fmt::print("model prediction on {}: {} per step, bottleneck {}{}\n", model.hardware_name,
               format_seconds(model.predicted->step_time_s), model.predicted->bottleneck,
               f.emulate.empty() ? ""
                                 : fmt::format(" (paced at time scale {:.4g}: {} per step here)", scale,
                                               format_seconds(model.predicted->step_time_s * scale)));
}

// The progress line's end: the final loss and the latest held-out loss.
std::string final_line(const exec::TrainResult& result) {
  if (result.steps.empty()) return "";
  std::string line = fmt::format("final loss {:.4f}", result.steps.back().loss);
  if (!result.evals.empty())
    line += fmt::format(", held-out loss {:.4f} (perplexity {:.4g}) after step {}", result.evals.back().loss,
                        std::exp(result.evals.back().loss), result.evals.back().step);
  return line;
}

int run_main(int argc, char** argv) {
  CLI::App app{
      "slidedp-run: train a Llama, Qwen2/3, Mistral, Gemma 4 or Qwen3.6 model with layer streaming from host "
      "memory,\n"
      "synchronous data parallel over the plan's ranks. Without --model and --data it trains the embedded\n"
      "default: slidedp-tiny on the text compiled into the binary."};
  RunFlags f;
  f.add_to(app);
  if (const std::optional<int> done = parse_command_line(app, argc, argv)) return *done;
  link_nodes(app, f);
  PlanFile pf = f.plan.resolve();
  const bool defaults = pf.model.empty() && f.data.empty();
  // Every node traces when node 0 does: node 0 logs every node's phases.
  const bool traced = f.bench || !f.trace.empty() || !f.no_db;
  const bool lead = check_launch(pf, f);
  apply_embedded_default(pf, f.plan, defaults);
  exec::TrainOptions o = model_data_and_optimizer(app, f, pf);
  // What will run: the plan as the system overrides it (routes, chunk, activation policies).
  const Plan run_plan = plan_for_system(o.plan, o.system, o.card);
  // The plan's own verify_updates (slidedp-plan --clip) stands; clipping or skipping sets it too.
  o.plan.verify_updates = o.plan.verify_updates || exec::needs_update_after_backward(o.optimizer);
  std::optional<TrainerState> resumed;
  if (!f.resume.empty()) {
    f.resume = resolve_checkpoint_dir(f.resume);
    resumed = load_trainer_state(f.resume);
  }
  check_nodes_read_the_same(f, pf, resumed);
  check_outputs(f, pf);
  // The checkpoint root is taken for this run: node 0 writes its run.json and holds its lock until
  // the run ends.
  std::optional<CheckpointRootLease> root_lease;
  if (!f.checkpoint_dir.empty() && lead)
    root_lease.emplace(
        CheckpointRootLease::acquire(f.checkpoint_dir, "--checkpoint-dir", o.card.name, f.resume));
  const int64_t start_step = resumed ? resumed->optimizer_step : 0;
  o.lr = lr_schedule_from(f, app, start_step, resumed ? resumed->lr_schedule_json : "", f.resume);
  set_outputs_and_control(o, f, traced);
  o.metadata_json = nlohmann::json{{"plan", plan_to_yaml(o.plan)},
                                   {"system", system_name(o.system)},
                                   {"model", o.card.name},
                                   {"seq_len", o.seq_len},
                                   {"checkpoint_run_id", root_lease ? root_lease->owner().run_id : ""}}
                        .dump();
  const double scale = set_emulation(o, app, f);
  const ModelView model = predict_run(o, f, pf);
  std::optional<double> predicted_step_s;
  if (model.predicted) predicted_step_s = model.predicted->step_time_s * scale;
  std::optional<RunLogSession> log;
  if (!f.no_db) log.emplace(f.db, run_info(o, run_plan, model, argc, argv), model.predicted);
  if (lead) print_header(o, run_plan, model, scale, root_lease, resumed, f);

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  Progress progress("train", static_cast<double>(f.steps), "steps", !f.quiet && !f.json);
  Table bench = bench_table();
  std::string last_eval;  // the latest evaluation, kept on the progress line until the next
  o.on_eval = [&](const exec::EvalPoint& e) {
    last_eval = fmt::format(" | eval {:.4f} (ppl {:.4g}) after step {}", e.loss, std::exp(e.loss), e.step);
    if (lead && !f.quiet && !f.json && o.steps == 0) fmt::print("evaluation{}\n", last_eval.substr(7));
    if (log)
      log->log_eval({.step = e.step,
                     .loss = e.loss,
                     .tokens = e.tokens,
                     .wait_s = e.wait_s,
                     .data = fs_absolute(f.eval_data)});
  };
  auto on_step = [&](const exec::TrainStep& s) {
    progress.update(static_cast<double>(s.step - start_step),
                    fmt::format("step {} loss {:.4f}{} | {:.0f} tokens/s{}", s.step, s.loss, last_eval,
                                static_cast<double>(s.tokens) / s.wall_s,
                                s.skipped ? " | SKIPPED: " + s.skipped_reason : ""));
    if (log) log->log_step(exec::step_record(s, predicted_step_s), s);
    if (f.bench) add_bench_row(bench, s);
  };

  exec::TrainResult result;
  // Everything that can fail after the first step is inside: the run is logged failed, with an error
  // row, whenever the process exits non-zero (a save or trace that fails after training included);
  // interrupted when a signal ended it.
  try {
    g_training.store(true);
    struct TrainingOver {
      ~TrainingOver() { g_training.store(false); }
    } training_over;
    result = exec::train(o, on_step);  // throws when every step was skipped, too
    if (!lead) return 0;
    progress.finish(final_line(result));
    if (!f.trace.empty())
      write_chrome_trace(f.trace, exec::timeline_spans(result.spans),
                         fmt::format("measured: slidedp-run {} ({} backend)", o.card.name, o.backend));
  } catch (const Error& e) {
    const auto* interrupted = dynamic_cast<const exec::Interrupted*>(&e);
    if (log) log->fail(e, interrupted != nullptr);
    if (!interrupted) throw;
    progress.finish("");
    fmt::print(stderr, "slidedp-run: {}{}\n", e.what(),
               f.checkpoint_dir.empty() ? "" : "; the checkpoints published so far are intact");
    return 128 + (interrupted->signal() > 0 ? interrupted->signal() : SIGTERM);
  } catch (...) {
    if (log) log->fail();
    throw;
  }
  if (log) log->end(result.stopped_early);
  const RunOutcome outcome{.flags = f,
                           .options = o,
                           .run_plan = run_plan,
                           .result = result,
                           .predicted_step_s = predicted_step_s,
                           .time_scale = scale,
                           .run_id = log ? log->run_id() : -1};
  if (f.json)
    print_json_report(outcome);
  else
    print_human_report(outcome, bench);
  return 0;
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  const int rc = slidedp::run_cli("slidedp-run", [&] { return slidedp::run_main(argc, argv); });
  // A failed node ends every node's process (mpirun reports which one): none waits for it.
  if (slidedp::g_link && rc != 0) slidedp::g_link->abort_all(rc);
  slidedp::g_link.reset();
  return rc;
}
