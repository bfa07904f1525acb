// `slidedp-sweep fidelity`: runs the validation set and writes results/fidelity/ (CSV, SVG, summary).
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "card/model_card.h"
#include "common/cli_checks.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/units.h"
#include "executor/target_pacing.h"
#include "model/hardware.h"
#include "sweeps/cli/commands.h"
#include "sweeps/fidelity.h"
#include "sweeps/fidelity_regimes.h"
#include "sweeps/sweep_report.h"

namespace slidedp {
namespace {

int g_status = 0;

struct FidelityArgs {
  std::string profile = "cpu-dev", model = "slidedp-tiny", out = "results/fidelity";
  int64_t seq = 128;
  std::string backend = "cpu";
  int steps = 16, warmup = 4, plans = 0, rounds = 2, max_ranks = 0;
  std::vector<std::string> emulate;
  double time_scale = 0;
  int per_resource = 4;
  bool json = false, dry_run = false;
};

nlohmann::json report_json(const FidelityReport& rep, const std::string& out) {
  return {{"hardware", rep.hardware_name}, {"paced", rep.paced}, {"heldout_mape", rep.heldout_mape},
          {"heldout_raw_mape", rep.heldout_raw_mape}, {"heldout_worst", rep.heldout_worst}, {"fit_mape", rep.fit_mape},
          {"raw_mape", rep.raw_mape}, {"bottleneck_match", rep.bottleneck_match},
          {"raw_bottleneck_match", rep.raw_bottleneck_match}, {"majority_bottleneck", rep.majority_bottleneck},
          {"majority_bottleneck_match", rep.majority_bottleneck_match},
          {"measured_bottleneck_counts", rep.measured_bottleneck_counts},
          {"exposed_rel_plans", rep.exposed_rel_plans}, {"exposed_rel_mean", rep.exposed_rel_mean},
          {"exposed_rel_worst", rep.exposed_rel_worst}, {"exposed_rel_raw_mean", rep.exposed_rel_raw_mean},
          {"heldout_exposed_mae_s", rep.heldout_exposed_mae_s}, {"paced_ops", rep.paced_ops},
          {"paced_overruns", rep.paced_overruns}, {"rounds", rep.rounds}, {"mean_round_spread", rep.mean_round_spread},
          {"worst_round_spread", rep.worst_round_spread}, {"scales", rep.scales}, {"sync_base", rep.sync_base},
          {"sync_straggler", rep.sync_straggler}, {"heldout_mape_resources_only", rep.heldout_mape_resources_only},
          {"worst_plan", rep.worst_plan}, {"out", out}, {"calibrated_profile", out + "/calibrated_profile.yaml"}};
}

void print_summary(const FidelityReport& rep, const std::string& out) {
  fmt::print("{}: held-out MAPE {:.1f}% (uncalibrated {:.1f}%; worst {:.1f}%: {}), fit MAPE {:.1f}%, bottleneck match {:.0f}% "
             "(uncalibrated {:.0f}%, always-{} {:.0f}%)\n",
             rep.hardware_name, 100 * rep.heldout_mape, 100 * rep.heldout_raw_mape, 100 * rep.heldout_worst, rep.worst_plan,
             100 * rep.fit_mape, 100 * rep.bottleneck_match, 100 * rep.raw_bottleneck_match, rep.majority_bottleneck,
             100 * rep.majority_bottleneck_match);
  if (rep.exposed_rel_plans > 0)
    fmt::print("exposed time error on the {} held-out plans exposing >= 5% of their step: {:.0f}% mean, {:.0f}% worst\n",
               rep.exposed_rel_plans, 100 * rep.exposed_rel_mean, 100 * rep.exposed_rel_worst);
  if (rep.paced && rep.paced_overruns > 0)
    fmt::print("warning: {} of {} paced operations ran over their paced time (raise --time-scale)\n", rep.paced_overruns,
               rep.paced_ops);
  if (rep.rounds > 1)
    fmt::print("measurement noise: run-to-run spread {:.1f}% mean, {:.1f}% worst over {} rounds\n", 100 * rep.mean_round_spread,
               100 * rep.worst_round_spread, rep.rounds);
  fmt::print("wrote {}/README.md, fidelity.csv, fidelity.svg, calibrated_profile.yaml\n", out);
}

}  // namespace

int last_command_status() { return g_status; }
void set_command_status(int s) { g_status = s; }

void add_fidelity_command(CLI::App& app, int argc, char** argv) {
  auto args = std::make_shared<FidelityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fidelity", "Run the validation plans with the executor, predict them with the model on a hardware "
                  "profile of this machine, calibrate on half, report on the other half");
  cmd->add_option("--profile", args->profile, "Hardware profile of this machine (slidedp-profile output) or a preset");
  cmd->add_option("--model", args->model, "Model to train (small: every plan runs for real)");
  cmd->add_option("--seq", args->seq, "Sequence length")->check(CLI::PositiveNumber);
  cmd->add_option("--steps", args->steps, "Steps per plan (step time and busy times are medians over the measured ones)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", args->warmup, "Steps per plan not measured")->check(CLI::NonNegativeNumber);
  cmd->add_option("--rounds", args->rounds, "Runs of every plan, each round in a fresh shuffled order (the spread between "
                                            "rounds is reported as the measurement's noise)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--backend", args->backend, "Executor backend: cpu (emulated devices) or cuda (one rank per GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--max-ranks", args->max_ranks, "Keep only plans of at most N ranks (0: all; on GPUs: the GPU count)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--plans", args->plans, "Use only the first N validation plans (0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--emulate", args->emulate,
                  "Paced study (of the scheduling, not the costs): run every plan on the CPU backend paced at the model's costs for these machines (presets or profile YAML, "
                  "comma-separated; one study each, in OUT/<name>/) and predict for them; the plans are chosen per "
                  "target so that each resource binds in several (--per-resource)")
      ->delimiter(',');
  cmd->add_option("--time-scale", args->time_scale,
                  "With --emulate: seconds here per second of the target (default: measured per plan)")
      ->check(finite_in(exec::kMinTimeScale, exec::kMaxTimeScale));
  cmd->add_option("--per-resource", args->per_resource,
                  "With --emulate: plans per predicted bottleneck (GPU compute, H2D, D2H, fabric, CPU update)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--dry-run", args->dry_run, "With --emulate: print the chosen plans and their predictions, run nothing");
  cmd->add_option("--out", args->out,
                  "Output folder (fidelity.csv, fidelity.svg, README.md, and calibrated_profile.yaml: the profile with "
                  "the fitted scales and synchronisation term, for slidedp-predict / slidedp-plan --hardware)");
  cmd->add_flag("--json", args->json, "Print the summary as JSON");
  const std::string command = command_line(argc, argv);
  cmd->callback([args, command, cmd] {
    if (args->emulate.empty()) {
      for (const char* flag : {"--time-scale", "--per-resource", "--dry-run"})
        if (cmd->count(flag)) throw InputError(flag, "only with --emulate");
    } else {
      if (cmd->count("--profile")) throw InputError("--profile", "with --emulate the model predicts for the target; give one or the other");
      if (args->backend != "cpu") throw InputError("--emulate", "pacing to a target machine is for the CPU backend (--backend cpu)");
    }
    // Before any plan runs: the folder, and never onto what the study reads.
    check_output_folder_target({"--out", args->out});
    std::vector<NamedPath> inputs = {{"--model", path_exists(args->model) ? args->model : ""},
                                     {"--profile", path_exists(args->profile) ? args->profile : ""}};
    for (const std::string& t : args->emulate)
      if (path_exists(t)) inputs.push_back({"--emulate", t});
    refuse_output_over_inputs({"--out", args->out}, inputs);
    refuse_output_in_checkpoints({"--out", args->out});
    refuse_foreign_report_folder(args->out, "--out");
    FidelityConfig base;
    base.card = load_model_card(args->model);
    base.seq_len = args->seq;
    base.steps = args->steps;
    base.warmup = args->warmup;
    base.rounds = args->rounds;
    base.backend = args->backend;
    const Workload w = make_workload(base.card, base.seq_len);

    // One study per target (or one on this machine's profile).
    struct Study {
      FidelityConfig cfg;
      std::string out;
    };
    std::vector<Study> studies;
    if (args->emulate.empty()) {
      Study st{base, args->out};
      st.cfg.hardware = load_hardware(args->profile);
      st.cfg.plans = default_fidelity_plans();
      if (args->max_ranks > 0) st.cfg.plans = plans_within_ranks(st.cfg.plans, args->max_ranks);
      studies.push_back(st);
    } else {
      for (const std::string& target : args->emulate) {
        Study st{base, ""};
        st.cfg.hardware = load_hardware(target);
        st.cfg.paced = true;
        st.cfg.time_scale = args->time_scale;
        const int max_ranks = args->max_ranks > 0 ? args->max_ranks : st.cfg.hardware.gpu.count;
        const RegimeSelection sel = regime_fidelity_plans(w, st.cfg.hardware, args->per_resource, max_ranks);
        st.cfg.plans = sel.plans;
        st.out = args->emulate.size() == 1 ? args->out : args->out + "/" + file_name_slug(st.cfg.hardware.name);
        if (args->dry_run) {
          fmt::print("{}: {} grid plans fit; predicted bottlenecks:", st.cfg.hardware.name, sel.grid_size);
          for (const auto& [r, n] : sel.candidates_per_resource) fmt::print(" {} {}", r, n);
          fmt::print("\n");
          const int L = static_cast<int>(base.card.num_layers);
          double total_s = 0;
          fmt::print("  plan {:<78} {:>10} {:<12} {:>6} {:>6} {:>8}\n", "", "predicted", "bottleneck", "lead", "scale",
                     "est. run");
          for (const RegimeCandidate& c : sel.chosen) {
            // What the run will take here: the measured time scale x the predicted step x the steps.
            const double S = args->time_scale > 0 ? args->time_scale
                                                  : exec::TargetPacing::measured_time_scale(w, st.cfg.hardware, c.plan.plan);
            const double run_s = S * c.predicted.step * args->steps * args->rounds;
            total_s += run_s;
            fmt::print("  {}  {:<78} {:>7.2f} ms {:<12} x{:<5.2f} {:>6.0f} {:>8}\n", c.plan.name,
                       c.plan.plan.summary(L) + (c.plan.plan.update_threads > 0 ? fmt::format(" | {} threads", c.plan.plan.update_threads) : ""),
                       c.predicted.step * 1e3, c.predicted.bottleneck, c.margin, S, format_seconds(run_s));
          }
          fmt::print("  estimated: {} for {} plans x {} rounds x {} steps (start-up not counted)\n", format_seconds(total_s),
                     sel.chosen.size(), args->rounds, args->steps);
        }
        studies.push_back(st);
      }
    }
    for (Study& st : studies) {
      if (st.cfg.plans.size() < 2)
        throw InputError(args->emulate.empty() ? "--max-ranks" : "--emulate",
                         fmt::format("leaves {} validation plan(s) for {}; the calibration needs at least 2",
                                     st.cfg.plans.size(), st.cfg.hardware.name));
      if (args->plans > 0 && static_cast<size_t>(args->plans) < st.cfg.plans.size())
        st.cfg.plans.resize(static_cast<size_t>(args->plans));
    }
    if (args->dry_run) {
      set_command_status(0);
      return;
    }
    nlohmann::json all = nlohmann::json::array();
    std::vector<FidelityReport> reports;
    for (Study& st : studies) {
      Progress progress("fidelity " + st.cfg.hardware.name, static_cast<double>(st.cfg.plans.size() * static_cast<size_t>(st.cfg.rounds)),
                        "runs", !args->json);
      st.cfg.progress = [&](int done, int, const std::string& name) { progress.update(done, name); };
      FidelityReport rep = run_fidelity(st.cfg);
      progress.finish();
      write_fidelity_outputs(rep, st.out, command);
      reports.push_back(rep);
      if (args->json)
        all.push_back(report_json(rep, st.out));
      else
        print_summary(rep, st.out);
    }
    if (reports.size() > 1) {
      write_fidelity_summary(reports, args->out, command);
      if (!args->json) fmt::print("wrote {}/README.md (all targets)\n", args->out);
    }
    if (args->json) std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
    set_command_status(0);
  });
}

}  // namespace slidedp
