// `slidedp-sweep fidelity`: runs the validation set and writes results/fidelity/ (CSV, SVG, summary).
#include <fmt/format.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/progress.h"
#include "model/hardware.h"
#include "model/model_card.h"
#include "sweeps/cli/commands.h"
#include "sweeps/fidelity.h"

namespace slidedp {
namespace {

int g_status = 0;

struct FidelityArgs {
  std::string profile = "cpu-dev", model = "slidedp-tiny", out = "results/fidelity";
  int64_t seq = 128;
  std::string backend = "cpu";
  int steps = 16, warmup = 4, plans = 0, rounds = 2, max_ranks = 0;
  bool json = false;
};

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
  cmd->add_option("--plans", args->plans, "Use only the first N validation plans (0: all 20)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", args->out,
                  "Output folder (fidelity.csv, fidelity.svg, README.md, and calibrated_profile.yaml: the profile with "
                  "the fitted scales and synchronisation term, for slidedp-predict / slidedp-plan --hardware)");
  cmd->add_flag("--json", args->json, "Print the summary as JSON");
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  cmd->callback([args, command] {
    FidelityConfig cfg;
    cfg.card = load_model_card(args->model);
    cfg.seq_len = args->seq;
    cfg.hardware = load_hardware(args->profile);
    cfg.steps = args->steps;
    cfg.warmup = args->warmup;
    cfg.rounds = args->rounds;
    cfg.backend = args->backend;
    cfg.plans = default_fidelity_plans();
    if (args->max_ranks > 0) cfg.plans = plans_within_ranks(cfg.plans, args->max_ranks);
    if (cfg.plans.size() < 2)
      throw InputError("--max-ranks", fmt::format("leaves {} validation plan(s); the calibration needs at least 2", cfg.plans.size()));
    if (args->plans > 0 && static_cast<size_t>(args->plans) < cfg.plans.size()) cfg.plans.resize(static_cast<size_t>(args->plans));
    Progress progress("fidelity", static_cast<double>(cfg.plans.size() * static_cast<size_t>(cfg.rounds)), "runs", !args->json);
    cfg.progress = [&](int done, int, const std::string& name) { progress.update(done, name); };
    FidelityReport rep = run_fidelity(cfg);
    progress.finish();
    write_fidelity_outputs(rep, args->out, command);
    if (args->json) {
      nlohmann::json j = {{"heldout_mape", rep.heldout_mape}, {"heldout_worst", rep.heldout_worst}, {"fit_mape", rep.fit_mape},
                          {"raw_mape", rep.raw_mape}, {"bottleneck_match", rep.bottleneck_match},
                          {"rounds", rep.rounds}, {"mean_round_spread", rep.mean_round_spread},
                          {"worst_round_spread", rep.worst_round_spread}, {"scales", rep.scales},
                          {"sync_base", rep.sync_base}, {"sync_straggler", rep.sync_straggler},
                          {"heldout_mape_resources_only", rep.heldout_mape_resources_only},
                          {"worst_plan", rep.worst_plan}, {"out", args->out},
                          {"calibrated_profile", args->out + "/calibrated_profile.yaml"}};
      std::cout << j.dump(2) << "\n";
    } else {
      fmt::print("held-out MAPE {:.1f}% (worst {:.1f}%: {}), fit MAPE {:.1f}%, uncalibrated {:.1f}%, bottleneck match {:.0f}%\n",
                 100 * rep.heldout_mape, 100 * rep.heldout_worst, rep.worst_plan, 100 * rep.fit_mape, 100 * rep.raw_mape,
                 100 * rep.bottleneck_match);
      if (rep.rounds > 1)
        fmt::print("measurement noise: run-to-run spread {:.1f}% mean, {:.1f}% worst over {} rounds\n", 100 * rep.mean_round_spread,
                   100 * rep.worst_round_spread, rep.rounds);
      fmt::print("wrote {}/README.md, fidelity.csv, fidelity.svg, calibrated_profile.yaml\n", args->out);
    }
    set_command_status(0);
  });
}

}  // namespace slidedp
