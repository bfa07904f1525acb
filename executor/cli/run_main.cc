// slidedp-run: trains a model with a plan, for real. With no model and no data it trains the small
// embedded default (slidedp-tiny, a Llama-architecture model, on the text compiled into the binary).
// Shows progress (step, loss, tokens/s, ETA), logs every run, step and phase to SQLite, writes
// checkpoints and can resume, writes the measured timeline as Chrome trace JSON, and in --bench mode
// reports each resource's busy time and the exposed (not overlapped) time per step.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/cli_checks.h"
#include "common/cli_main.h"
#include "common/file_util.h"
#include "common/error.h"
#include "common/progress.h"
#include "common/table.h"
#include "common/units.h"
#include "executor/backend_registry.h"
#include "executor/cli/run_paths.h"
#include "executor/kernel_activity.h"
#include "executor/node_link.h"
#include "executor/node_state.h"
#include "executor/run_control.h"
#include "runlog/patient_log.h"
#include "runlog/run_log.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "executor/weight_decay_groups.h"
#include "io/checkpoint.h"
#include "io/checkpoint_root.h"
#include "io/default_corpus.h"
#include "io/hf_model.h"
#include "model/chrome_trace.h"
#include "cli/plan_flags.h"
#include "model/hardware.h"
#include "model/step_model.h"
#include "model/step_work.h"
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

int run_main(int argc, char** argv) {
  CLI::App app{
      "slidedp-run: train a Llama, Qwen2/3, Mistral, Gemma 4 or Qwen3.6 model with layer streaming from host memory,\n"
      "synchronous data parallel over the plan's ranks. Without --model and --data it trains the embedded\n"
      "default: slidedp-tiny on the text compiled into the binary."};
  PlanFlags flags;
  flags.add_to(app);
  std::string eval_data;
  int64_t eval_every = 0;
  std::string data, backend = "cpu", db = "runs/runs.db", trace, save_model, checkpoint_dir, resume, lr_file;
  std::string on_nonfinite = "abort";
  std::string master = "auto";
  std::string inject_nan;  // STEP:UNIT:RANK
  int64_t steps = 40, checkpoint_every = 0, warmup = 0, device_budget = 0;
  int keep = 3, update_threads_flag = 0;
  double lr = 3e-3, min_lr = 0, weight_decay = 0.01, clip = 0, adam_eps = 1e-8, router_aux_loss_coef = 0;
  std::optional<int32_t> document_end;
  std::vector<double> adam_betas = {0.9, 0.999};
  std::string no_decay_on = "none", emulate, system = "slidedp", host_pinned_limit;
  double time_scale = 0, node_timeout = 300, stop_grace = 120;
  int64_t total_steps = 0;
  uint64_t data_seed = 1234, init_seed = 42;
  bool json = false, bench = false, exact = false, no_db = false, quiet = false, trace_kernels = false;
  std::string schedule = "constant";
  app.add_option("--data", data, "Token file (slidedp-data build ...); default: the embedded text, byte-tokenized");
  app.add_option(
      "--eval-data", eval_data,
      "Held-out token file (e.g. slidedp-data build --eval-fraction): its mean token loss and perplexity, "
      "over every sequence of --seq tokens with the weights of that step, after every --eval-every steps "
      "and after the last; logged (run log table evals), on the progress line and in --json. No update");
  app.add_option("--eval-every", eval_every,
                 "Evaluate --eval-data after every N-th step (default 0: after the last only)")
      ->check(integer_in(0, 1'000'000'000));
  app.add_option("--steps", steps, "Optimizer steps to run (after --resume: further steps)")->check(integer_in(0, 1'000'000'000));
  app.add_option("--lr", lr, "Peak learning rate")->check(finite_in(1e-12, 1));
  app.add_option("--schedule", schedule, "Learning-rate schedule: constant | cosine (decays to --min-lr at the last step)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup", warmup, "Linear warm-up steps")->check(integer_in(0, 1'000'000'000));
  app.add_option("--min-lr", min_lr, "Cosine schedule floor")->check(finite_in(0, 1));
  app.add_option("--total-steps", total_steps,
                 "Cosine: the optimizer step at which the rate reaches --min-lr (default: the last step of this run, "
                 "resumed steps included)")
      ->check(integer_in(1, 1'000'000'000));
  app.add_option("--lr-schedule", lr_file, "Learning-rate schedule YAML (kind, lr, warmup_steps, total_steps, min_lr); overrides the flags above");
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay")->check(finite_in(0, 1e3));
  app.add_option("--no-decay-on", no_decay_on,
                 "Parameter groups without weight decay: any of norms,biases,embeddings (comma-separated) or none "
                 "(default: decay on every tensor, as torch.optim.AdamW over model.parameters())");
  app.add_option("--adam-betas", adam_betas, "AdamW beta1,beta2 (default 0.9,0.999)")
      ->expected(2)
      ->delimiter(',')
      ->check(finite_in(0, 1, "", /*hi_open=*/true));
  app.add_option("--adam-eps", adam_eps, "AdamW epsilon, added outside the square root as in torch (default 1e-8; above 0: a parameter whose "
                 "gradient is 0 divides by it)")
      ->check(finite_in(1e-30, 1));
  app.add_option("--clip-grad-norm", clip,
                 "Clip the global gradient norm to this value (0: off). The update then follows the backward "
                 "and overlaps the next step's forward layer by layer: plan for it with slidedp-plan --clip "
                 "(plan key verify_updates)")
      ->check(finite_in(0, 1e12));
  app.add_option("--router-aux-loss-coef", router_aux_loss_coef,
                 "Mixture-of-experts models: coefficient of the router's load-balancing loss (transformers' "
                 "router_aux_loss_coef, e.g. 0.001), pooled per sequence over every MoE layer and averaged over the "
                 "step's sequences; the logged loss includes it (default 0: off, as the references fine-tune)")
      ->check(finite_in(0, 1e3));
  app.add_option(
         "--document-end", document_end,
         "Packed documents: the token id that ends every document. Attention, RoPE positions and Gated "
         "DeltaNet "
         "state restart after it, and it is not trained to predict the next document's first token (default: "
         "the one the token file records, slidedp-data build --document-end/--pack; else none, each sequence "
         "one stream)")
      ->check(integer_in(0, INT32_MAX));
  app.add_option("--on-nonfinite", on_nonfinite, "NaN/Inf loss or gradient: abort (default) | skip (the step leaves the state untouched; costs the update overlap)")
      ->check(CLI::IsMember({"abort", "skip"}));
  app.add_option("--backend", backend, "cpu (emulated devices) | cuda");
  app.add_option("--system", system,
                 "Whose data movement and update placement to run: slidedp (default), or a baseline as the step "
                 "model describes it: slideformer-dp (per-rank fp32->bf16 conversion, rank-0 update, layer-boundary "
                 "offload), zero-offload (parameters resident on the devices, reduce-scatter, each rank's partition "
                 "updated on the host after the backward, uploaded and all-gathered, full recompute), megatrain "
                 "(full recompute, host accumulation one rank at a time, update after the backward), fsdp2 "
                 "(sharded state and AdamW on the devices, all-gather and reduce-scatter; no checkpoints), "
                 "zero3-offload (16-bit partitions fetched from the host and all-gathered each pass, again for the "
                 "backward of a recomputed layer, update after the backward), fsdp-offload (fp32 shards fetched and "
                 "cast on the device, all-gathered, update after the backward); overrides the plan's routes, chunk "
                 "and activation policies as slidedp-predict --system does");
  app.add_option("--emulate", emulate,
                 "CPU backend paced at the step model's costs for a target machine: a hardware preset or profile (e.g. "
                 "h100-sxm-x4). Every operation is done for real, then held as long as the model says the target takes "
                 "(its GPU time, links, root complex, fabric, host memory and CPU update, shared as the simulator shares "
                 "them), time stretched by --time-scale; the model's prediction for the target, times the scale, is what "
                 "the run should measure (a check of the scheduling, not of the model's costs)");
  app.add_option("--time-scale", time_scale,
                 "With --emulate: seconds here per second of the target (default: measured: 1.5x the largest ratio of "
                 "a decoder layer's or the head's pass timed on this host to the target's, times the share of a core "
                 "each emulated device gets)")
      ->check(finite_in(exec::kMinTimeScale, exec::kMaxTimeScale));
  app.add_option("--device-budget", device_budget, "Device memory budget per rank in bytes (default: the plan's; else on CUDA the GPU's memory minus the "
                 "plan's gpu_mem_reserve_bytes, shared by the ranks on that GPU, and 16 GiB per emulated device on the "
                 "CPU backend)")
      ->check(integer_in(1, int64_t{1} << 50, "bytes"));
  app.add_option("--host-pinned-limit", host_pinned_limit,
                 "Page-locked host memory the run may use, bytes or with a unit (e.g. 64GiB; default: no limit below "
                 "the RAM): a run whose pinned buffers (staging rings, token and offload buffers) exceed it is refused "
                 "before it allocates, naming the largest (exit 3)");
  app.add_flag("--exact", exact, "Deliver fp32 parameters and gradients (no bf16 rounding; for exact comparisons)");
  app.add_option(
         "--master", master,
         "How the host holds the fp32 master weights: split (the bf16 mirror plus a 16-bit remainder, "
         "bit for bit the fp32 value: 12 instead of 14 bytes of host state per parameter; the mirror "
         "rounds exact ties toward zero, unlike torch's cast on 1 in 2^17 values) | fp32 (a separate "
         "copy; the mirror rounds to nearest even) | auto (default: split for SlideDP without --exact, "
         "else fp32)")
      ->check(CLI::IsMember({"auto", "split", "fp32"}));
  app.add_option("--db", db, "SQLite run log (created if missing)");
  app.add_flag("--no-db", no_db, "Do not write a run log");
  app.add_option("--trace", trace, "Write the measured timeline as Chrome trace JSON (open in Perfetto)");
  app.add_flag("--trace-kernels", trace_kernels,
               "CUDA backend: add every kernel, copy and memset (CUPTI's activity records, libcupti opened at run "
               "time) to the timeline, each under the unit and phase that launched it; with --bench also a table "
               "of rank 0's largest kernels; costs time");
  app.add_flag("--bench", bench, "Benchmark mode: per step, each resource's busy time, the exposed time and tokens/s");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Write checkpoints here (step-XXXXXXXX folders)");
  app.add_option("--checkpoint-every", checkpoint_every, "Checkpoint every K steps (0: at the end only)")->check(integer_in(0, 1'000'000'000));
  app.add_option("--keep-checkpoints", keep, "Keep the last K checkpoints")->check(integer_in(1, 1'000'000));
  app.add_option("--resume", resume,
                 "Resume from a checkpoint folder, or the newest one under a checkpoint root; the recorded learning-rate "
                 "schedule continues unless a schedule flag is given");
  app.add_option("--save-model", save_model, "Save the trained weights as a Hugging Face model folder (bf16 safetensors)");
  app.add_option("--data-seed", data_seed, "Seed of the data shuffle")->check(integer_in(0, INT64_MAX));
  app.add_option("--init-seed", init_seed, "Seed of the random initialization (when no model folder is given)")
      ->check(integer_in(0, INT64_MAX));
  app.add_option("--threads", update_threads_flag, "CPU threads for reduction + AdamW (0: the plan's, else all cores)")
      ->check(integer_in(0, 1024));
  app.add_option("--node-timeout", node_timeout,
                 "Multi-node (--nodes > 1, launched by `mpirun -np NODES`): seconds any node waits for another before "
                 "the run fails naming it (a node that dies ends the job at once)")
      ->check(finite_in(0.1, 1e6, "seconds"));
  app.add_option("--stop-grace", stop_grace,
                 "Seconds a run may take, after a first SIGINT/SIGTERM, to finish its step and begin its checkpoint "
                 "before it is interrupted at once (as by a second signal; exit 128 + signal, logged interrupted); "
                 "0: no limit (default 120)")
      ->check(finite_in(0, 1e6, "seconds"));
  app.add_option("--test-inject-nan", inject_nan,
                 "Testing: after the backward of UNIT at STEP (0-based), the first gradient element of global rank "
                 "RANK becomes NaN (exercises --on-nonfinite across ranks and nodes)")
      ->type_name("STEP:UNIT:RANK")
      ->group("Testing");
  app.add_flag("--json", json, "Print one JSON summary at the end instead of the human report");
  app.add_flag("-q,--quiet", quiet, "No progress line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(ErrorKind::kInput);
  }

  // One process per node: node 0 reports, logs and writes checkpoints; the others train silently.
  // Every option must agree across the processes, all but what only node 0 prints: compared first,
  // before any option is used (an option given to one node only stalled the others until
  // --node-timeout, or mixed two configurations' weights). The list comes from the options table,
  // so a new option is included.
  if (exec::launched_by_mpi()) {
    g_link = exec::make_mpi_link(0, node_timeout);  // the count is checked against the plan below
    exec::check_nodes_agree(*g_link, exec::options_to_agree(app, {"--json", "--quiet"}));
  }
  PlanFile pf = flags.resolve();
  const bool defaults = pf.model.empty() && data.empty();
  if (g_link && pf.plan.nodes == 1)
    throw InputError("--nodes", "started by an MPI launcher but the plan has 1 node: pass --nodes N (one process per node)");
  if (g_link && pf.plan.nodes != g_link->nodes())
    throw InputError("--nodes", fmt::format("the plan has {} nodes but the launcher started {} process(es): run `mpirun "
                                            "-np {} slidedp-run ...` (one process per node)",
                                            pf.plan.nodes, g_link->nodes(), pf.plan.nodes));
  if (!g_link && pf.plan.nodes > 1) g_link = exec::make_mpi_link(pf.plan.nodes, node_timeout);  // refuses, naming mpirun
  const bool lead = !g_link || g_link->node() == 0;
  // Every node traces when node 0 does: node 0 logs every node's phases.
  const bool traced = bench || !trace.empty() || !no_db;
  if (!lead) quiet = true, no_db = true, json = false, trace.clear();
  exec::TrainOptions o;
  // The embedded default: slidedp-tiny on the built-in text with a 2-rank plan that exercises the
  // sharded route, offload and recompute.
  if (pf.model.empty()) pf.model = "slidedp-tiny";
  if (pf.seq_len <= 0) pf.seq_len = 128;
  if (defaults && flags.plan_file.empty()) {
    if (!flags.ranks) pf.plan.ranks = 2;
    if (!flags.micro_batch) pf.plan.micro_batch = 4;
    if (!flags.param_route) pf.plan.param_route = ParamRoute::kSharded;
    if (!flags.chunk_numel) pf.plan.chunk_numel = 1 << 16;
    if (!flags.activation) pf.plan.offload_layers = 1, pf.plan.recompute_layers = 2, pf.plan.keep_layers = Plan::kRest;
  }
  // A folder is a Hugging Face model: its card, and its weights to start from.
  o.card = load_model_card(pf.model);
  pf.plan.validate(static_cast<int>(o.card.num_layers), "plan");  // before anything sizes by it
  if (is_folder(pf.model)) o.init_model_dir = pf.model;
  o.seq_len = pf.seq_len;
  o.plan = pf.plan;
  o.system = parse_system(system, "--system");
  // What will run: the plan as the system overrides it (routes, chunk, activation policies).
  const Plan run_plan = plan_for_system(o.plan, o.system, o.card);
  exec::validate_multi_node_plan(
      o.plan);  // before the checkpoint root is taken (node 0 alone would write it)
  o.backend = backend;
  o.exact_fp32 = exact;
  o.master = master == "split"  ? exec::MasterStorage::kSplit
             : master == "fp32" ? exec::MasterStorage::kFp32
                                : exec::MasterStorage::kAuto;
  o.device_budget_bytes = device_budget;
  if (!host_pinned_limit.empty()) o.host_pinned_limit_bytes = budget_bytes_flag(host_pinned_limit, "--host-pinned-limit");
  o.update_threads = update_threads_flag;
  o.dataset = data.empty() ? default_corpus_dataset() : TokenDataset::open(data);
  if (app.count("--eval-data") && eval_data.empty())
    throw InputError("--eval-data", "is empty (give a token file)");
  // Read into memory: a held-out file regenerated while the run goes on must not break a mapping.
  if (!eval_data.empty()) {
    if (!path_exists(eval_data)) throw IoError(eval_data, "no such file (--eval-data)");
    o.eval_dataset = TokenDataset::read(eval_data);
    note_packing(*o.eval_dataset, pf.seq_len);
  }
  if (eval_every > 0 && eval_data.empty())
    throw InputError("--eval-every", "needs --eval-data (the held-out token file)");
  o.eval_every = eval_every;
  o.data_seed = data_seed;
  o.init_seed = init_seed;
  o.steps = steps;
  // The schedule: a YAML file, else the one a resumed checkpoint recorded (unless a schedule flag is
  // given), else the flags. Its steps count from the start of training, so a resumed cosine decays
  // to the end of this run: K steps + resume + N-K steps give the rates of N straight steps.
  std::optional<TrainerState> resumed;
  if (!resume.empty()) {
    resume = resolve_checkpoint_dir(resume);
    resumed = load_trainer_state(resume);
  }
  // What each node reads, by content: one path can hold other files on another host (a root's newest
  // checkpoint, a model folder or a token file copied differently), which would mix two runs' weights.
  if (g_link) {
    auto contents = [](const std::string& path) { return path_exists(path) ? content_fingerprint(path) : "(none)"; };
    exec::check_nodes_agree(
        *g_link, {{"--resume (the checkpoint's files)",
                   resumed ? fmt::format("step {}, {}", resumed->optimizer_step, contents(resume)) : "none"},
                  {"--model (its files)", contents(pf.model)},
                  {"--data (its contents)", data.empty() ? "(embedded)" : contents(data)},
                  {"--eval-data (its contents)", eval_data.empty() ? "(none)" : contents(eval_data)}});
  }
  // Every output is checked against every input before anything is written, and the checkpoint
  // root is taken for this run (node 0 writes its run.json and holds its lock until the run ends).
  auto if_file = [](const std::string& name_or_path) { return path_exists(name_or_path) ? name_or_path : ""; };
  check_run_paths({.model = if_file(pf.model),
                   .data = data,
                   .eval_data = eval_data,
                   .resume = resume,
                   .lr_schedule = lr_file,
                   .plan_file = flags.plan_file,
                   .hardware = if_file(pf.hardware),
                   .emulate = if_file(emulate),
                   .save_model = save_model,
                   .checkpoint_dir = checkpoint_dir,
                   .db = no_db ? "" : db,
                   .trace = trace});
  std::optional<CheckpointRootLease> root_lease;
  if (!checkpoint_dir.empty() && lead)
    root_lease.emplace(CheckpointRootLease::acquire(checkpoint_dir, "--checkpoint-dir", o.card.name, resume));
  const int64_t start_step = resumed ? resumed->optimizer_step : 0;
  bool schedule_flags = false;
  for (const char* f : {"--lr", "--schedule", "--warmup", "--min-lr", "--total-steps"}) schedule_flags |= app.count(f) > 0;
  if (!lr_file.empty()) {
    o.lr = exec::lr_schedule_from_yaml(read_text_file(lr_file), lr_file);
  } else if (resumed && !schedule_flags && !resumed->lr_schedule_json.empty()) {
    o.lr = exec::lr_schedule_from_yaml(resumed->lr_schedule_json, resume + "/trainer_state.json: lr_schedule");
  } else {
    o.lr.kind = schedule == "cosine" ? exec::LrScheduleKind::kCosine : exec::LrScheduleKind::kConstant;
    o.lr.lr = lr;
    o.lr.warmup_steps = warmup;
    if (o.lr.kind == exec::LrScheduleKind::kCosine) {
      o.lr.total_steps = total_steps > 0 ? total_steps : std::max<int64_t>(start_step + steps, warmup + 1);
      o.lr.min_lr = min_lr;
    } else if (total_steps > 0) {
      throw InputError("--total-steps", "only for --schedule cosine (a constant schedule has no end)");
    }
  }
  o.optimizer.weight_decay = weight_decay;
  o.optimizer.beta1 = adam_betas.at(0);
  o.optimizer.beta2 = adam_betas.at(1);
  o.optimizer.eps = adam_eps;
  o.optimizer.no_decay = exec::parse_no_decay_groups(no_decay_on, "--no-decay-on");
  o.optimizer.clip_grad_norm = clip;
  o.router_aux_loss_coef = router_aux_loss_coef;
  o.document_end = document_end_of(o.dataset, document_end, pf.seq_len);
  o.optimizer.on_nonfinite = on_nonfinite == "skip" ? exec::NonFinitePolicy::kSkip : exec::NonFinitePolicy::kAbort;
  if (!inject_nan.empty()) {
    long long step = -1, unit = -1, rank = -1;
    char end = 0;
    if (std::sscanf(inject_nan.c_str(), "%lld:%lld:%lld%c", &step, &unit, &rank, &end) != 3 || step < 0 || unit < 0 || rank < 0)
      throw InputError("--test-inject-nan", fmt::format("'{}' is not STEP:UNIT:RANK (three non-negative integers)", inject_nan));
    o.inject_nan_step = step;
    o.inject_nan_unit = static_cast<int>(unit);
    o.inject_rank = static_cast<int>(rank);
  }
  // The plan's own verify_updates (slidedp-plan --clip) stands; clipping or skipping sets it too.
  o.plan.verify_updates = o.plan.verify_updates || exec::needs_update_after_backward(o.optimizer);
  o.checkpoint_dir = checkpoint_dir;
  o.save_model_dir = save_model;
  o.checkpoint_every = checkpoint_every;
  o.keep_checkpoints = keep;
  o.resume_dir = resume;
  o.trace = traced || trace_kernels;
  o.trace_kernels = trace_kernels;
  o.sample_spans_every = 10;
  o.stop = &g_stop;
  o.interrupt = &g_interrupt;
  o.signal = &g_signal;
  o.stop_grace_s = stop_grace;
  o.link = g_link.get();
  o.metadata_json = nlohmann::json{{"plan", plan_to_yaml(o.plan)}, {"system", system_name(o.system)}, {"model", o.card.name},
                                   {"seq_len", o.seq_len},
                                   {"checkpoint_run_id", root_lease ? root_lease->owner().run_id : ""}}.dump();

  // Emulating a target: its prediction times the scale is what the run should measure.
  if (!emulate.empty()) {
    if (backend != "cpu") throw InputError("--emulate", "pacing to a target machine is for the CPU backend (--backend cpu)");
    o.emulate = load_hardware(emulate);
    if (time_scale <= 0)
      time_scale = exec::TargetPacing::measured_time_scale(make_workload(o.card, o.seq_len), *o.emulate, o.plan, o.system);
    o.time_scale = time_scale;
  } else if (app.count("--time-scale")) {
    throw InputError("--time-scale", "only with --emulate");
  }
  const double scale = emulate.empty() ? 1.0 : time_scale;

  // What the model predicts for this plan on this machine's profile (a run is also a model check).
  const std::string hw_name = !emulate.empty()       ? emulate
                              : !pf.hardware.empty() ? pf.hardware
                                                     : (backend == "cpu" ? "cpu-dev" : "");
  std::optional<Prediction> predicted;
  std::string hw_yaml;
  if (!hw_name.empty()) {
    Hardware hw = load_hardware(hw_name);
    hw_yaml = hardware_to_yaml(hw);
    try {
      predicted = predict_analytical(make_workload(o.card, o.seq_len), hw, o.plan, o.system);
    } catch (const InputError&) {
      // A plan the preset cannot describe (e.g. more ranks than its GPUs): no prediction.
    }
  }

  std::optional<runlog::RunLog> log;
  // The steps' writes: a log another process holds past the busy timeout must not stop training.
  std::optional<runlog::PatientLog> step_log;
  int64_t run_id = -1;
  if (!no_db) {
    log.emplace(runlog::RunLog::open(db));
    runlog::RunInfo info;
    info.kind = runlog::RunKind::kTrain;
    info.command_line = command_line(argc, argv);
    info.backend = backend;
    info.plan_yaml = plan_to_yaml(run_plan);
    info.plan_summary = run_plan.summary(static_cast<int>(o.card.num_layers));
    info.hardware_name = hw_name;
    info.hardware_yaml = hw_yaml;
    info.model_name = o.card.name;
    info.seq_len = o.seq_len;
    info.system = system_name(o.system);
    run_id = log->begin_run(info);
    if (predicted) log->log_prediction(run_id, runlog::prediction_record(*predicted));
    step_log.emplace(*log);
  }
  // Before the run's last rows: every queued step row committed, or counted in an error row. On a
  // failed run (`failing`) a queued row's own error is dropped: the error being reported comes first.
  const auto settle_step_log = [&](bool failing) {
    if (!step_log) return;
    runlog::PatientLog::Outcome left;
    try {
      left = step_log->flush(std::chrono::seconds(60));
    } catch (const Error&) {
      step_log.reset();
      if (!failing) throw;
      return;
    }
    step_log.reset();
    if (left.uncommitted + left.dropped == 0) return;
    const std::string what = fmt::format("{} step rows were not logged: the run log was locked by another process "
                                         "for more than a minute after training ({} still queued, {} beyond the queue)",
                                         left.uncommitted + left.dropped, left.uncommitted, left.dropped);
    fmt::print(stderr, "warning: {}: {}\n", log->path(), what);
    runlog::ErrorRecord er;
    er.kind = "log";
    er.message = what;
    try {
      log->log_error(run_id, er);
    } catch (const runlog::LogLocked&) {
    }
  };

  const std::string header = fmt::format("{} ({} params) | seq {} | {}{} | {} backend | {} | {} tokens/step",
                                         o.card.name, format_count(static_cast<double>(o.card.total_params())), o.seq_len,
                                         o.system == System::kSlideDP ? "" : std::string(system_name(o.system)) + ": ",
                                         run_plan.summary(static_cast<int>(o.card.num_layers)), backend, o.lr.summary(),
                                         o.plan.global_batch_sequences() * o.seq_len);
  if (!json && lead) fmt::print("{}{}\n", header, g_link ? fmt::format(" | {} nodes, host state {}", g_link->nodes(),
                                                                           host_state_name(o.plan.host_state)) : "");
  if (root_lease && !json)
    fmt::print("checkpoints: {} ({} run {}{})\n", checkpoint_dir, root_lease->continues() ? "continuing" : "new",
               root_lease->owner().run_id,
               resumed ? fmt::format(", from step {} of {}", resumed->optimizer_step, resume) : "");
  if (predicted && !json && lead)
    fmt::print("model prediction on {}: {} per step, bottleneck {}{}\n", hw_name, format_seconds(predicted->step_time_s),
               predicted->bottleneck,
               emulate.empty() ? "" : fmt::format(" (paced at time scale {:.4g}: {} per step here)", scale,
                                                  format_seconds(predicted->step_time_s * scale)));

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  Progress progress("train", static_cast<double>(steps), "steps", !quiet && !json);
  double tokens_total = 0, time_total = 0;
  Table bench_table({"step", "loss", "step time", "compute", "h2d", "d2h", "fabric", "cpu update", "exposed", "tokens/s"},
                    {"", "", "s", "s", "s", "s", "s", "s", "s", ""});
  std::string last_eval;  // the latest evaluation, kept on the progress line until the next
  // An evaluation: kept on the progress line until the next, and logged.
  o.on_eval = [&](const exec::EvalPoint& e) {
    last_eval = fmt::format(" | eval {:.4f} (ppl {:.4g}) after step {}", e.loss, std::exp(e.loss), e.step);
    if (lead && !quiet && !json && o.steps == 0) fmt::print("evaluation{}\n", last_eval.substr(7));
    if (!log) return;
    runlog::EvalRecord r;
    r.step = e.step;
    r.loss = e.loss;
    r.tokens = e.tokens;
    r.wait_s = e.wait_s;
    r.data = fs_absolute(eval_data);
    step_log->submit([run_id, r](runlog::RunLog& l) { l.log_eval(run_id, r); });
  };
  auto on_step = [&](const exec::TrainStep& s) {
    tokens_total += static_cast<double>(s.tokens);
    time_total += s.wall_s;
    progress.update(static_cast<double>(s.step - start_step),
                    fmt::format("step {} loss {:.4f}{} | {:.0f} tokens/s{}", s.step, s.loss, last_eval,
                                static_cast<double>(s.tokens) / s.wall_s,
                                s.skipped ? " | SKIPPED: " + s.skipped_reason : ""));
    if (log) {
      runlog::StepRecord r;
      r.step = s.step;
      r.loss = s.loss;
      r.tokens = s.tokens;
      r.wall_s = s.wall_s;
      if (predicted) r.predicted_step_s = predicted->step_time_s * scale;
      r.lr = s.lr;
      if (s.grad_norm >= 0) r.grad_norm = s.grad_norm;
      r.skipped = s.skipped;
      r.skip_reason = s.skipped_reason;
      step_log->submit([run_id, r, totals = s.totals, spans = s.spans](runlog::RunLog& l) { l.log_step(run_id, r, totals, spans); });
    }
    if (bench) {
      auto busy = [&](const char* k) { return s.busy_s.count(k) ? s.busy_s.at(k) : 0.0; };
      bench_table.add_row({std::to_string(s.step), fmt::format("{:.4f}", s.loss), fmt::format("{:.4f}", s.wall_s),
                           fmt::format("{:.4f}", busy("compute")), fmt::format("{:.4f}", busy("h2d")),
                           fmt::format("{:.4f}", busy("d2h")), fmt::format("{:.4f}", busy("fabric")),
                           fmt::format("{:.4f}", busy("cpu_update")),
                           fmt::format("{:.4f}", std::max(0.0, s.wall_s - busy("compute"))),
                           fmt::format("{:.0f}", static_cast<double>(s.tokens) / s.wall_s)});
    }
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
    std::string final =
        result.steps.empty() ? "" : fmt::format("final loss {:.4f}", result.steps.back().loss);
    if (!result.evals.empty() && !result.steps.empty())
      final +=
          fmt::format(", held-out loss {:.4f} (perplexity {:.4g}) after step {}", result.evals.back().loss,
                      std::exp(result.evals.back().loss), result.evals.back().step);
    progress.finish(final);
    if (!trace.empty())
      write_chrome_trace(trace, exec::timeline_spans(result.spans),
                         fmt::format("measured: slidedp-run {} ({} backend)", o.card.name, backend));
  } catch (const Error& e) {
    const auto* interrupted = dynamic_cast<const exec::Interrupted*>(&e);
    if (log) {
      settle_step_log(true);
      runlog::ErrorRecord er;
      er.kind = interrupted                          ? "interrupted"
                : e.kind() == ErrorKind::kNumeric    ? "numeric"
                : e.kind() == ErrorKind::kInfeasible ? "infeasible"
                                                     : "error";
      er.message = e.what();
      log->log_error(run_id, er);
      log->end_run(run_id, interrupted ? runlog::RunStatus::kInterrupted : runlog::RunStatus::kFailed);
    }
    if (interrupted) {
      progress.finish("");
      fmt::print(stderr, "slidedp-run: {}{}\n", e.what(),
                 checkpoint_dir.empty() ? "" : "; the checkpoints published so far are intact");
      return 128 + (interrupted->signal() > 0 ? interrupted->signal() : SIGTERM);
    }
    throw;
  } catch (...) {
    if (log) {
      settle_step_log(true);
      log->end_run(run_id, runlog::RunStatus::kFailed);
    }
    throw;
  }
  settle_step_log(false);
  if (log) log->end_run(run_id, result.stopped_early ? runlog::RunStatus::kInterrupted : runlog::RunStatus::kFinished);

  // Steady state: every step but the first (it pays start-up).
  double steady_t = 0, steady_tok = 0;
  for (size_t i = result.steps.size() > 1 ? 1 : 0; i < result.steps.size(); ++i) {
    steady_t += result.steps[i].wall_s;
    steady_tok += static_cast<double>(result.steps[i].tokens);
  }
  const double tps = steady_t > 0 ? steady_tok / steady_t : 0;
  if (json) {
    nlohmann::json j;
    j["model"] = o.card.name;
    j["plan"] = run_plan.summary(static_cast<int>(o.card.num_layers));
    j["system"] = system_name(o.system);
    j["backend"] = backend;
    j["steps"] = nlohmann::json::array();
    j["evals"] = nlohmann::json::array();
    for (const auto& s : result.steps) {
      nlohmann::json step = {{"step", s.step},     {"loss", s.loss}, {"tokens", s.tokens},
                             {"wall_s", s.wall_s}, {"lr", s.lr},     {"skipped", s.skipped},
                             {"busy_s", s.busy_s}};
      if (s.grad_norm >= 0) step["grad_norm"] = s.grad_norm;  // measured when clipping or skipping
      j["steps"].push_back(step);
    }
    for (const auto& e : result.evals)
      j["evals"].push_back({{"step", e.step},
                            {"loss", e.loss},
                            {"perplexity", std::exp(e.loss)},
                            {"tokens", e.tokens},
                            {"wait_s", e.wait_s}});
    j["tokens_per_s"] = tps;
    j["final_loss"] = result.steps.empty() ? 0.0 : result.steps.back().loss;
    j["device_high_water_bytes"] = result.device_high_water_bytes;
    j["device_held_high_water_bytes"] = result.device_held_high_water_bytes;
    j["device_budget_bytes"] = result.device_budget_bytes;
    j["host_state_bytes"] = result.host_state_bytes;  // this node's (node 0's in a multi-node run)
    j["parameters"] = o.card.total_params();
    nlohmann::json account = {{"peak_bytes", result.device_account.peak_bytes},
                              {"driver_peak_bytes", result.device_account.driver_peak_bytes},
                              {"peak_at", result.device_account.peak_at},
                              {"items", nlohmann::json::array()}};
    for (const MemoryItem& i : result.device_account.items) account["items"].push_back({{"name", i.name}, {"bytes", i.bytes}});
    j["device_memory_account"] = account;
    if (predicted) j["predicted_step_time_s"] = predicted->step_time_s * scale;
    if (!emulate.empty()) {
      j["emulate"] = emulate;
      j["time_scale"] = scale;
      j["paced_ops"] = result.paced_ops;
      j["paced_overruns"] = result.paced_overruns;
    }
    if (run_id >= 0) j["run_id"] = run_id, j["db"] = db;
    if (!result.last_checkpoint.empty()) j["checkpoint"] = result.last_checkpoint;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (bench) std::cout << "\n" << bench_table.render();
  if (bench && trace_kernels) {  // the run's largest kernels on rank 0 (CUPTI), all steps together
    const std::vector<exec::KernelTotal> kernels = exec::sum_kernels(result.spans, 0);
    double all = 0;
    for (const exec::KernelTotal& k : kernels) all += k.seconds;
    Table kt({"kernel", "calls", "time", "per call", "of kernel time"}, {"", "", "ms", "us", "%"});
    for (std::size_t i = 0; i < std::min<std::size_t>(12, kernels.size()); ++i)
      kt.add_row({kernels[i].kernel, std::to_string(kernels[i].calls), fmt::format("{:.3f}", kernels[i].seconds * 1e3),
                  fmt::format("{:.1f}", kernels[i].seconds * 1e6 / static_cast<double>(kernels[i].calls)),
                  fmt::format("{:.1f}", all > 0 ? 100 * kernels[i].seconds / all : 0.0)});
    std::cout << "\nlargest kernels, rank 0 (" << kernels.size() << " kinds, " << format_seconds(all) << " in all)\n"
              << kt.render();
  }
  fmt::print("\n{} steps, steady state {:.0f} tokens/s, {} per step", result.steps.size(), tps,
             format_seconds(result.steps.size() > 1 ? steady_t / static_cast<double>(result.steps.size() - 1) : steady_t));
  if (predicted) fmt::print(" (model predicted {})", format_seconds(predicted->step_time_s * scale));
  fmt::print("\nloss {:.4f} -> {:.4f}\n", result.steps.empty() ? 0.0 : result.steps.front().loss,
             result.steps.empty() ? 0.0 : result.steps.back().loss);
  if (!result.steps.empty() && result.steps.back().grad_norm >= 0)
    fmt::print("gradient norm {:.4g} -> {:.4g} (the update after the backward: verify_updates)\n",
               result.steps.front().grad_norm, result.steps.back().grad_norm);
  int64_t hw = 0;
  for (auto h : result.device_high_water_bytes) hw = std::max(hw, h);
  fmt::print("device memory high water {} of {} budget per rank (account: {}, peak at {}); host state {}\n",
             format_bytes(static_cast<double>(hw)), format_bytes(static_cast<double>(result.device_budget_bytes)),
             format_bytes(result.device_account.peak_bytes), result.device_account.peak_at,
             format_bytes(static_cast<double>(result.host_state_bytes)));
  if (run_id >= 0) fmt::print("run {} logged to {}\n", run_id, db);
  if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
  if (!trace.empty()) fmt::print("timeline: {} (open in Perfetto)\n", trace);
  if (result.stopped_early) fmt::print("stopped early on request\n");
  if (result.paced_overruns > 0)
    fmt::print(stderr,
               "warning: {} of {} paced operations took longer here than the target would at time scale {:.4g} (by {} "
               "together): the run is slower here than the pacing allows; raise --time-scale\n",
               result.paced_overruns, result.paced_ops, scale, format_seconds(result.paced_overrun_s));
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
