// slidedp-run's flags: values, --help texts, and what the trainer's options take from them alone.
#include "executor/cli/run_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/file_util.h"
#include "executor/target_pacing.h"
#include "executor/weight_decay_groups.h"

namespace slidedp {

void RunFlags::add_to(CLI::App& app) {
  plan.add_to(app);
  add_training_flags(app);
  add_execution_flags(app);
  add_output_flags(app);
}

// Data, evaluation, the schedule and the optimizer.
void RunFlags::add_training_flags(CLI::App& app) {
  app.add_option("--data", data,
                 "Token file (slidedp-data build ...); default: the embedded text, byte-tokenized");
  app.add_option(
      "--eval-data", eval_data,
      "Held-out token file (e.g. slidedp-data build --eval-fraction): its mean token loss and perplexity, "
      "over every sequence of --seq tokens with the weights of that step, after every --eval-every steps "
      "and after the last; logged (run log table evals), on the progress line and in --json. No update");
  app.add_option("--eval-every", eval_every,
                 "Evaluate --eval-data after every N-th step (default 0: after the last only)")
      ->check(integer_in(0, 1'000'000'000));
  app.add_option("--steps", steps, "Optimizer steps to run (after --resume: further steps)")
      ->check(integer_in(0, 1'000'000'000));
  app.add_option("--lr", lr, "Peak learning rate")->check(finite_in(1e-12, 1));
  app.add_option("--schedule", schedule,
                 "Learning-rate schedule: constant | cosine (decays to --min-lr at the last step)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup", warmup, "Linear warm-up steps")->check(integer_in(0, 1'000'000'000));
  app.add_option("--min-lr", min_lr, "Cosine schedule floor")->check(finite_in(0, 1));
  app.add_option(
         "--total-steps", total_steps,
         "Cosine: the optimizer step at which the rate reaches --min-lr (default: the last step of this run, "
         "resumed steps included)")
      ->check(integer_in(1, 1'000'000'000));
  app.add_option(
      "--lr-schedule", lr_file,
      "Learning-rate schedule YAML (kind, lr, warmup_steps, total_steps, min_lr); overrides the flags above");
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay")->check(finite_in(0, 1e3));
  app.add_option(
      "--no-decay-on", no_decay_on,
      "Parameter groups without weight decay: any of norms,biases,embeddings (comma-separated) or none "
      "(default: decay on every tensor, as torch.optim.AdamW over model.parameters())");
  app.add_option("--adam-betas", adam_betas, "AdamW beta1,beta2 (default 0.9,0.999)")
      ->expected(2)
      ->delimiter(',')
      ->check(finite_in(0, 1, "", /*hi_open=*/true));
  app.add_option(
         "--adam-eps", adam_eps,
         "AdamW epsilon, added outside the square root as in torch (default 1e-8; above 0: a parameter whose "
         "gradient is 0 divides by it)")
      ->check(finite_in(1e-30, 1));
  app.add_option("--clip-grad-norm", clip,
                 "Clip the global gradient norm to this value (0: off). The update then follows the backward "
                 "and overlaps the next step's forward layer by layer: plan for it with slidedp-plan --clip "
                 "(plan key verify_updates)")
      ->check(finite_in(0, 1e12));
  app.add_option(
         "--router-aux-loss-coef", router_aux_loss_coef,
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
  app.add_option("--on-nonfinite", on_nonfinite,
                 "NaN/Inf loss or gradient: abort (default) | skip (the step leaves the state untouched; "
                 "costs the update overlap)")
      ->check(CLI::IsMember({"abort", "skip"}));
}

// What runs where: backend, system, target pacing, memory, precision.
void RunFlags::add_execution_flags(CLI::App& app) {
  app.add_option("--backend", backend, "cpu (emulated devices) | cuda");
  app.add_option(
      "--system", system,
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
  app.add_option(
      "--emulate", emulate,
      "CPU backend paced at the step model's costs for a target machine: a hardware preset or profile (e.g. "
      "h100-sxm-x4). Every operation is done for real, then held as long as the model says the target takes "
      "(its GPU time, links, root complex, fabric, host memory and CPU update, shared as the simulator "
      "shares "
      "them), time stretched by --time-scale; the model's prediction for the target, times the scale, is "
      "what "
      "the run should measure (a check of the scheduling, not of the model's costs)");
  app.add_option(
         "--time-scale", time_scale,
         "With --emulate: seconds here per second of the target (default: measured: 1.5x the largest ratio "
         "of "
         "a decoder layer's or the head's pass timed on this host to the target's, times the share of a core "
         "each emulated device gets)")
      ->check(finite_in(exec::kMinTimeScale, exec::kMaxTimeScale));
  app.add_option("--device-budget", device_budget,
                 "Device memory budget per rank in bytes (default: the plan's; else on CUDA the GPU's memory "
                 "minus the "
                 "plan's gpu_mem_reserve_bytes, shared by the ranks on that GPU, and 16 GiB per emulated "
                 "device on the "
                 "CPU backend)")
      ->check(integer_in(1, int64_t{1} << 50, "bytes"));
  app.add_option(
      "--host-pinned-limit", host_pinned_limit,
      "Page-locked host memory the run may use, bytes or with a unit (e.g. 64GiB; default: no limit below "
      "the RAM): a run whose pinned buffers (staging rings, token and offload buffers) exceed it is refused "
      "before it allocates, naming the largest (exit 3)");
  app.add_flag("--exact", exact,
               "Deliver fp32 parameters and gradients (no bf16 rounding; for exact comparisons)");
  app.add_option(
         "--master", master,
         "How the host holds the fp32 master weights: split (the bf16 mirror plus a 16-bit remainder, "
         "bit for bit the fp32 value: 12 instead of 14 bytes of host state per parameter; the mirror "
         "rounds exact ties toward zero, unlike torch's cast on 1 in 2^17 values) | fp32 (a separate "
         "copy; the mirror rounds to nearest even) | auto (default: split for SlideDP without --exact, "
         "else fp32)")
      ->check(CLI::IsMember({"auto", "split", "fp32"}));
}

// Outputs (run log, trace, checkpoints, the model), seeds, threads, several nodes, signals, testing.
void RunFlags::add_output_flags(CLI::App& app) {
  app.add_option("--db", db, "SQLite run log (created if missing)");
  app.add_flag("--no-db", no_db, "Do not write a run log");
  app.add_option("--trace", trace, "Write the measured timeline as Chrome trace JSON (open in Perfetto)");
  app.add_flag(
      "--trace-kernels", trace_kernels,
      "CUDA backend: add every kernel, copy and memset (CUPTI's activity records, libcupti opened at run "
      "time) to the timeline, each under the unit and phase that launched it; with --bench also a table "
      "of rank 0's largest kernels; costs time");
  app.add_flag("--bench", bench,
               "Benchmark mode: per step, each resource's busy time, the exposed time and tokens/s");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Write checkpoints here (step-XXXXXXXX folders)");
  app.add_option("--checkpoint-every", checkpoint_every, "Checkpoint every K steps (0: at the end only)")
      ->check(integer_in(0, 1'000'000'000));
  app.add_option("--keep-checkpoints", keep, "Keep the last K checkpoints")->check(integer_in(1, 1'000'000));
  app.add_option("--resume", resume,
                 "Resume from a checkpoint folder, or the newest one under a checkpoint root; the recorded "
                 "learning-rate "
                 "schedule continues unless a schedule flag is given");
  app.add_option("--save-model", save_model,
                 "Save the trained weights as a Hugging Face model folder (bf16 safetensors)");
  app.add_option("--data-seed", data_seed, "Seed of the data shuffle")->check(integer_in(0, INT64_MAX));
  app.add_option("--init-seed", init_seed,
                 "Seed of the random initialization (when no model folder is given)")
      ->check(integer_in(0, INT64_MAX));
  app.add_option("--threads", update_threads,
                 "CPU threads for reduction + AdamW (0: the plan's, else all cores)")
      ->check(integer_in(0, 1024));
  app.add_option("--node-timeout", node_timeout,
                 "Multi-node (--nodes > 1, launched by `mpirun -np NODES`): seconds any node waits for "
                 "another before "
                 "the run fails naming it (a node that dies ends the job at once)")
      ->check(finite_in(0.1, 1e6, "seconds"));
  app.add_option(
         "--stop-grace", stop_grace,
         "Seconds a run may take, after a first SIGINT/SIGTERM, to finish its step and begin its checkpoint "
         "before it is interrupted at once (as by a second signal; exit 128 + signal, logged interrupted); "
         "0: no limit (default 120)")
      ->check(finite_in(0, 1e6, "seconds"));
  app.add_option(
         "--test-inject-nan", inject_nan,
         "Testing: after the backward of UNIT at STEP (0-based), the first gradient element of global rank "
         "RANK becomes NaN (exercises --on-nonfinite across ranks and nodes)")
      ->type_name("STEP:UNIT:RANK")
      ->group("Testing");
  app.add_flag("--json", json, "Print one JSON summary at the end instead of the human report");
  app.add_flag("-q,--quiet", quiet, "No progress line");
}

exec::LrScheduleConfig lr_schedule_from(const RunFlags& f, const CLI::App& app, int64_t start_step,
                                        const std::string& resumed_json, const std::string& resume_dir) {
  if (!f.lr_file.empty()) return exec::lr_schedule_from_yaml(read_text_file(f.lr_file), f.lr_file);
  bool schedule_flags = false;
  for (const char* flag : {"--lr", "--schedule", "--warmup", "--min-lr", "--total-steps"})
    schedule_flags |= app.count(flag) > 0;
  if (!schedule_flags && !resumed_json.empty())
    return exec::lr_schedule_from_yaml(resumed_json, resume_dir + "/trainer_state.json: lr_schedule");
  exec::LrScheduleConfig lr;
  lr.kind = f.schedule == "cosine" ? exec::LrScheduleKind::kCosine : exec::LrScheduleKind::kConstant;
  lr.lr = f.lr;
  lr.warmup_steps = f.warmup;
  if (lr.kind == exec::LrScheduleKind::kCosine) {
    lr.total_steps =
        f.total_steps > 0 ? f.total_steps : std::max<int64_t>(start_step + f.steps, f.warmup + 1);
    lr.min_lr = f.min_lr;
  } else if (f.total_steps > 0) {
    throw InputError("--total-steps", "only for --schedule cosine (a constant schedule has no end)");
  }
  return lr;
}

exec::OptimizerConfig optimizer_from(const RunFlags& f) {
  exec::OptimizerConfig o;
  o.weight_decay = f.weight_decay;
  o.beta1 = f.adam_betas.at(0);
  o.beta2 = f.adam_betas.at(1);
  o.eps = f.adam_eps;
  o.no_decay = exec::parse_no_decay_groups(f.no_decay_on, "--no-decay-on");
  o.clip_grad_norm = f.clip;
  o.on_nonfinite = f.on_nonfinite == "skip" ? exec::NonFinitePolicy::kSkip : exec::NonFinitePolicy::kAbort;
  return o;
}

void apply_inject_nan(const std::string& spec, exec::TrainOptions& o) {
  long long step = -1, unit = -1, rank = -1;
  char end = 0;
  if (std::sscanf(spec.c_str(), "%lld:%lld:%lld%c", &step, &unit, &rank, &end) != 3 || step < 0 || unit < 0 ||
      rank < 0)
    throw InputError("--test-inject-nan",
                     fmt::format("'{}' is not STEP:UNIT:RANK (three non-negative integers)", spec));
  o.inject_nan_step = step;
  o.inject_nan_unit = static_cast<int>(unit);
  o.inject_rank = static_cast<int>(rank);
}

}  // namespace slidedp
