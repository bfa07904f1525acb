// Closing the loop (issue 10): run a validation set of plans with the executor, predict each with the
// model, and compare step time, per-resource busy time and exposed time. Either on this machine's own
// profile (the CPU backend as it is, or the CUDA backend), or paced (issue 18): the CPU backend runs at a
// target machine's ratios (executor/target_pacing.h) and the model predicts for that target, both in
// the target's seconds. Systematic error is calibrated honestly: one scale per resource, fitted on half
// of the plans (busy time measured / predicted), reported on the other half.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "card/model_card.h"
#include "model/hardware.h"
#include "model/plan.h"
#include "model/system.h"
#include "model/workload.h"

namespace slidedp {

struct FidelityPlan {
  std::string name;
  Plan plan;
  System system = System::kSlideDP;  // whose data movement runs and is predicted
};

struct FidelityConfig {
  ModelCard card;
  int64_t seq_len = 128;
  Hardware hardware;                 // the machine's profile (slidedp-profile), or the paced target
  std::string backend = "cpu";       // executor backend: "cpu" (emulated devices) or "cuda"
  // Paced: the CPU backend runs at `hardware`'s ratios, time stretched by time_scale (<= 0: measured
  // per plan, TargetPacing::measured_time_scale); measured times are divided by the scale.
  bool paced = false;
  double time_scale = 0;
  std::vector<FidelityPlan> plans;   // default_fidelity_plans() when empty
  // Per plan; the first `warmup` are not measured (fresh pages, thread start-up and allocator growth
  // stretch the first steps, most with several emulated ranks on few cores), the rest give medians.
  int steps = 16;
  int warmup = 4;
  int rounds = 2;                    // runs of every plan, each round in a fresh shuffled order
  uint64_t split_seed = 7;           // which plans fit the calibration, which are held out
  std::function<void(int done, int total, const std::string& name)> progress;
};

// The resources both sides report: model resource name -> executor span category.
const std::map<std::string, std::string>& fidelity_resources();

// The model's figures for one plan, as the study compares them: the simulated step, its exposed time
// (step minus GPU compute), each resource's busy time, the busiest of them, and the closed form.
struct FidelityPrediction {
  bool feasible = true;  // fits the hardware's memory
  double step = 0, exposed = 0, analytical = 0;
  std::map<std::string, double> busy;
  std::string bottleneck;
};
FidelityPrediction predict_for_fidelity(const Workload& w, const Hardware& hw, const Plan& plan,
                                        System system = System::kSlideDP);

struct FidelityRow {
  std::string name, plan_summary;
  int ranks = 1;
  bool fit = false;  // in the calibration half
  double measured_step_s = 0, measured_exposed_s = 0;
  std::map<std::string, double> measured_busy_s;
  std::string measured_busiest;
  std::vector<double> round_step_s;  // each round's median step
  double round_spread = 0;           // (max - min) / median of round_step_s: the measurement's own noise
  // Model, raw (profile as measured) and calibrated.
  double predicted_step_s = 0, predicted_exposed_s = 0;
  std::map<std::string, double> predicted_busy_s;
  std::string predicted_bottleneck;
  double calibrated_step_s = 0, calibrated_exposed_s = 0;
  std::map<std::string, double> calibrated_busy_s;
  std::string calibrated_bottleneck;
  double analytical_step_s = 0;  // the closed form, calibrated, for reference
  // Paced runs: seconds here per second of the target, operations paced and those over their time.
  double time_scale = 1;
  int64_t paced_ops = 0, paced_overruns = 0;
  double error() const { return (calibrated_step_s - measured_step_s) / measured_step_s; }
};

struct FidelityReport {
  std::vector<FidelityRow> rows;
  std::map<std::string, double> scales;  // calibration: resource -> multiplier of its time
  // Synchronisation term, fitted on the fit half after the resource scales: a plan of N ranks runs
  // (1 + sync_base + sync_straggler * sqrt(2 ln N)) times its calibrated simulation. sync_base is the
  // hand-off latency between threads that the simulator does not model; the second term is the
  // expected maximum of N ranks' jitter (Gaussian: sigma * sqrt(2 ln N)), since a synchronous step
  // waits for the slowest rank at every collective. Both are added as exposed time (the model applies
  // them from the profile: Hardware::sync). Fitted with a, b >= 0.
  double sync_base = 0, sync_straggler = 0;
  // The profile with the scales and the synchronisation term applied (Hardware::sync): what
  // slidedp-predict and slidedp-plan should use on this machine; written as calibrated_profile.yaml.
  Hardware calibrated_hardware;
  double heldout_mape_resources_only = 0;  // held-out MAPE with the resource scales alone
  double heldout_mape = 0, heldout_worst = 0, fit_mape = 0, raw_mape = 0;
  double heldout_raw_mape = 0;  // held-out plans, uncalibrated
  double heldout_exposed_mae_s = 0;
  // Exposed time relative to its measurement, held-out plans whose measured exposed time is at least
  // 5% of their step (smaller ones are noise-level): mean and worst, calibrated and uncalibrated.
  int exposed_rel_plans = 0;
  double exposed_rel_mean = 0, exposed_rel_worst = 0, exposed_rel_raw_mean = 0;
  double bottleneck_match = 0;  // fraction of plans whose calibrated bottleneck is the measured busiest
  double raw_bottleneck_match = 0;
  // The predictor that always answers the most common measured bottleneck, and what it scores.
  std::string majority_bottleneck;
  double majority_bottleneck_match = 0;
  std::map<std::string, int> measured_bottleneck_counts;
  bool paced = false;
  int64_t paced_ops = 0, paced_overruns = 0;
  std::string worst_plan, worst_reason;
  int rounds = 1;
  double mean_round_spread = 0, worst_round_spread = 0;  // run-to-run spread of the measured step time
  std::string model_name, hardware_name, backend;
  int64_t seq_len = 0;
};

// The synchronisation term's fit: least squares of y = a + b x with a, b >= 0 (when the free fit
// makes one negative, it is 0 and the other is fitted alone; one distinct x fits a alone).
std::pair<double, double> fit_sync_term(const std::vector<double>& x, const std::vector<double>& y);

std::vector<FidelityPlan> default_fidelity_plans();
// The plans of at most `max_ranks` ranks (a GPU machine runs one rank per GPU).
std::vector<FidelityPlan> plans_within_ranks(std::vector<FidelityPlan> plans, int max_ranks);
FidelityReport run_fidelity(const FidelityConfig& config);

// Writes fidelity.csv, fidelity.svg (predicted vs measured, y = x and +/-10%), calibrated_profile.yaml
// and README.md into dir.
void write_fidelity_outputs(const FidelityReport& report, const std::string& dir, const std::string& command);

// A paced study over several targets (slidedp-sweep fidelity --emulate A,B,C): README.md in dir with
// one line per target (each target's own outputs are in dir/<target>/) and the pooled figures: how
// often each resource was the measured bottleneck, bottleneck accuracy over all plans and what always
// answering the most common bottleneck would score.
void write_fidelity_summary(const std::vector<FidelityReport>& reports, const std::string& dir, const std::string& command);

}  // namespace slidedp
