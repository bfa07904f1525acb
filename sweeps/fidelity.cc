// The validation loop of issue 10; see fidelity.h.
#include "sweeps/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/median.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/provenance.h"
#include "common/table.h"
#include "common/units.h"
#include "executor/target_pacing.h"
#include "executor/trainer.h"
#include "io/default_corpus.h"
#include "model/simulator.h"
#include "model/step_model.h"
#include "model/step_work.h"
#include "sweeps/svg_plot.h"

namespace slidedp {

const std::map<std::string, std::string>& fidelity_resources() {
  static const std::map<std::string, std::string> m = {{resource::kGpuCompute, "compute"},
                                                       {resource::kH2D, "h2d"},
                                                       {resource::kD2H, "d2h"},
                                                       {resource::kFabric, "fabric"},
                                                       {resource::kCpuUpdate, "cpu_update"}};
  return m;
}

std::vector<FidelityPlan> default_fidelity_plans() {
  // 20 plans over routes (all four), 1-4 ranks, chunk sizes, every activation policy and a few
  // micro-batch sizes, for slidedp-tiny (4 layers) at seq 128.
  struct Spec {
    int ranks, mb, accum;
    ParamRoute pr;
    GradRoute gr;
    int64_t chunk;
    const char* act;  // offload, recompute, keep counts over 4 layers
    int depth;
  };
  const Spec specs[] = {
      {1, 4, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 16, "0,0,4", 2},
      {1, 8, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 14, "0,4,0", 2},
      {1, 2, 2, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 18, "2,2,0", 3},
      {2, 4, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 16, "0,4,0", 2},
      {2, 4, 1, ParamRoute::kSharded, GradRoute::kCpu, 1 << 16, "1,2,1", 2},
      {2, 4, 1, ParamRoute::kReplicated, GradRoute::kGpu, 1 << 16, "0,0,4", 2},
      {2, 4, 1, ParamRoute::kSharded, GradRoute::kGpu, 1 << 15, "4,0,0", 2},
      {2, 2, 2, ParamRoute::kSharded, GradRoute::kCpu, 1 << 17, "0,2,2", 3},
      {2, 8, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 14, "2,0,2", 2},
      {3, 2, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 16, "0,4,0", 2},
      {3, 4, 1, ParamRoute::kSharded, GradRoute::kGpu, 1 << 16, "1,1,2", 2},
      {3, 2, 1, ParamRoute::kReplicated, GradRoute::kGpu, 1 << 15, "0,0,4", 3},
      {3, 4, 1, ParamRoute::kSharded, GradRoute::kCpu, 1 << 17, "2,2,0", 2},
      {4, 2, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 16, "0,4,0", 2},
      {4, 2, 1, ParamRoute::kSharded, GradRoute::kCpu, 1 << 16, "0,0,4", 2},
      {4, 2, 1, ParamRoute::kReplicated, GradRoute::kGpu, 1 << 16, "1,2,1", 2},
      {4, 2, 1, ParamRoute::kSharded, GradRoute::kGpu, 1 << 15, "2,2,0", 3},
      {4, 1, 2, ParamRoute::kSharded, GradRoute::kGpu, 1 << 17, "0,2,2", 2},
      {1, 4, 1, ParamRoute::kReplicated, GradRoute::kCpu, 1 << 13, "4,0,0", 2},
      {2, 2, 1, ParamRoute::kReplicated, GradRoute::kGpu, 1 << 18, "0,4,0", 2},
  };
  std::vector<FidelityPlan> out;
  int i = 0;
  for (const Spec& s : specs) {
    FidelityPlan f;
    Plan& p = f.plan;
    p.ranks = s.ranks;
    p.micro_batch = s.mb;
    p.accum_steps = s.accum;
    p.param_route = s.pr;
    p.grad_route = s.gr;
    p.chunk_numel = s.chunk;
    std::sscanf(s.act, "%d,%d,%d", &p.offload_layers, &p.recompute_layers, &p.keep_layers);
    p.gpu_buffer_depth = s.depth;
    f.name = fmt::format("p{:02d}", ++i);
    out.push_back(f);
  }
  return out;
}

namespace {

// Multiplies the time a resource takes by `s` in a hardware profile (capacities divided by s).
void scale_resource(Hardware& hw, const std::string& r, double s) {
  if (r == resource::kGpuCompute) {
    for (auto& u : hw.unit_times)
      for (TimeFit* f : {&u.forward, &u.backward, &u.recompute}) {
        f->fixed_s *= s, f->per_token_s *= s, f->per_token_ctx_s *= s;
      }
    hw.gpu.bf16_peak_flops /= s;
    hw.gpu.hbm_gbps /= s;
    hw.gpu.kernel_overhead_s *= s;
  } else if (r == resource::kH2D) {
    hw.link.h2d_gbps /= s, hw.link.h2d_all_gbps /= s, hw.link.h2d_bidir_gbps /= s;
  } else if (r == resource::kD2H) {
    hw.link.d2h_gbps /= s, hw.link.d2h_all_gbps /= s, hw.link.d2h_bidir_gbps /= s;
  } else if (r == resource::kFabric) {
    hw.fabric.allgather_busbw_gbps /= s, hw.fabric.reduce_scatter_busbw_gbps /= s;
  } else if (r == resource::kCpuUpdate) {
    for (auto& p : hw.cpu.adamw_params_per_s) p.rate /= s;
    for (auto& p : hw.cpu.reduce_gbps) p.rate /= s;
  }
}

}  // namespace

FidelityPrediction predict_for_fidelity(const Workload& w, const Hardware& hw, const Plan& plan, System system) {
  SimulatorOptions opt;
  opt.record_timeline = false;
  opt.measure_sync = false;
  Simulation sim = simulate(w, hw, plan, system, opt);
  FidelityPrediction p;
  p.step = sim.prediction.step_time_s;
  const double compute = sim.prediction.span_busy_s.count(resource::kGpuCompute) ? sim.prediction.span_busy_s.at(resource::kGpuCompute) : 0.0;
  p.exposed = std::max(0.0, p.step - compute);
  double best = -1;
  for (const auto& [r, cat] : fidelity_resources()) {
    const double b = sim.prediction.span_busy_s.count(r) ? sim.prediction.span_busy_s.at(r) : 0.0;
    p.busy[r] = b;
    if (b > best) best = b, p.bottleneck = r;
  }
  const Prediction closed_form = predict_analytical(w, hw, plan, system);
  p.analytical = closed_form.step_time_s;
  p.feasible = closed_form.feasible;
  return p;
}

std::pair<double, double> fit_sync_term(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  if (x.empty()) return {0.0, 0.0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double det = n * sxx - sx * sx;
  double a = sy / n, b = 0;  // the base alone (one rank count, or the straggler pinned at 0)
  if (std::fabs(det) > 1e-12 * std::max(1.0, n * sxx)) {
    b = (n * sxy - sx * sy) / det;
    a = (sy - b * sx) / n;
    if (b < 0) {
      b = 0, a = sy / n;
    } else if (a < 0) {
      a = 0, b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;  // the straggler alone, through the origin
    }
  }
  return {std::max(0.0, a), b};
}

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string backend_label(const std::string& backend) { return backend == "cuda" ? "CUDA" : "CPU"; }

}  // namespace

std::vector<FidelityPlan> plans_within_ranks(std::vector<FidelityPlan> plans, int max_ranks) {
  std::erase_if(plans, [&](const FidelityPlan& p) { return p.plan.ranks > max_ranks; });
  return plans;
}

namespace {

// Fit / held-out split: a seeded shuffle, half each.
std::vector<bool> fit_half(std::size_t plans, uint64_t seed) {
  std::vector<size_t> order(plans);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<bool> fit(plans, false);
  for (size_t i = 0; i < plans / 2; ++i) fit[order[i]] = true;
  return fit;
}

// One plan's measurements over every round, in the target's seconds when paced.
struct PlanSamples {
  std::vector<double> step, exposed, round_step;
  std::map<std::string, std::vector<double>> busy;
  double scale = 1;  // paced: seconds here per second of the target
  int64_t paced_ops = 0, paced_overruns = 0;
};

// One run of `fp`, its steps after the warm-up added to `sm`.
void measure_once(const FidelityConfig& cfg, const FidelityPlan& fp, PlanSamples& sm) {
  exec::TrainOptions o;
  o.card = cfg.card;
  o.seq_len = cfg.seq_len;
  o.plan = fp.plan;
  o.system = fp.system;
  o.backend = cfg.backend;
  o.dataset = default_corpus_dataset();
  o.steps = cfg.steps;
  o.lr.lr = 1e-3;
  o.trace = true;
  if (cfg.paced) o.emulate = cfg.hardware, o.time_scale = sm.scale;
  const exec::TrainResult r = exec::train(o);
  sm.paced_ops += r.paced_ops;
  sm.paced_overruns += r.paced_overruns;
  std::vector<double> this_run;
  const double per_target_s = 1.0 / sm.scale;  // seconds here -> the target's seconds
  for (size_t s = static_cast<size_t>(cfg.warmup); s < r.steps.size(); ++s) {
    const exec::TrainStep& ts = r.steps[s];
    const double step = ts.wall_s * per_target_s;
    sm.step.push_back(step);
    this_run.push_back(step);
    const double compute = (ts.busy_s.count("compute") ? ts.busy_s.at("compute") : 0.0) * per_target_s;
    sm.exposed.push_back(std::max(0.0, step - compute));
    for (const auto& [res, cat] : fidelity_resources())
      sm.busy[res].push_back((ts.busy_s.count(cat) ? ts.busy_s.at(cat) : 0.0) * per_target_s);
  }
  sm.round_step.push_back(median(this_run));
}

// Every plan runs `rounds` times, each round in its own seeded order, so slow drift of the host (other
// tenants, frequency, page cache) spreads over all plans instead of landing on the ones that ran
// last; the round-to-round spread is reported as the measurement's own noise.
std::vector<PlanSamples> measure_plans(const FidelityConfig& cfg, const std::vector<FidelityPlan>& plans,
                                       const Workload& w) {
  std::vector<PlanSamples> samples(plans.size());
  // Paced: one time scale per plan, measured once (it depends on the plan's micro-batch and ranks).
  if (cfg.paced) {
    if (cfg.backend != "cpu") throw InputError("--emulate", "pacing to a target machine is for the CPU backend");
    for (size_t i = 0; i < plans.size(); ++i)
      samples[i].scale = cfg.time_scale > 0 ? cfg.time_scale
                                            : exec::TargetPacing::measured_time_scale(
                                                  w, cfg.hardware, plans[i].plan, plans[i].system);
  }
  const int total = cfg.rounds * static_cast<int>(plans.size());
  int done = 0;
  std::mt19937_64 round_rng(cfg.split_seed + 1);
  for (int round = 0; round < cfg.rounds; ++round) {
    std::vector<size_t> run_order(plans.size());
    for (size_t i = 0; i < run_order.size(); ++i) run_order[i] = i;
    std::shuffle(run_order.begin(), run_order.end(), round_rng);
    for (size_t i : run_order) {
      if (cfg.progress) cfg.progress(done, total, plans[i].name);
      measure_once(cfg, plans[i], samples[i]);
      ++done;
    }
  }
  if (cfg.progress) cfg.progress(done, total, "");
  return samples;
}

// A plan's row: its measured medians and spread, and the uncalibrated prediction.
FidelityRow measured_row(const FidelityConfig& cfg, const Workload& w, const FidelityPlan& fp,
                         const PlanSamples& sm, bool fit) {
  FidelityRow row;
  row.name = fp.name;
  row.plan_summary =
      plan_for_system(fp.plan, fp.system, cfg.card).summary(static_cast<int>(cfg.card.num_layers));
  if (fp.system != System::kSlideDP)
    row.plan_summary = std::string(system_name(fp.system)) + ": " + row.plan_summary;
  if (fp.plan.update_threads > 0)
    row.plan_summary += fmt::format(" | {} update threads", fp.plan.update_threads);
  row.time_scale = sm.scale;
  row.paced_ops = sm.paced_ops;
  row.paced_overruns = sm.paced_overruns;
  row.ranks = fp.plan.ranks;
  row.fit = fit;
  row.round_step_s = sm.round_step;
  row.measured_step_s = median(sm.step);
  row.measured_exposed_s = median(sm.exposed);
  double best = -1;
  for (const auto& [res, v] : sm.busy) {
    row.measured_busy_s[res] = median(v);
    if (row.measured_busy_s[res] > best) best = row.measured_busy_s[res], row.measured_busiest = res;
  }
  if (sm.round_step.size() > 1) {
    const auto [lo, hi] = std::minmax_element(sm.round_step.begin(), sm.round_step.end());
    row.round_spread = (*hi - *lo) / median(sm.round_step);
  }
  const FidelityPrediction p = predict_for_fidelity(w, cfg.hardware, fp.plan, fp.system);
  row.predicted_step_s = p.step;
  row.predicted_exposed_s = p.exposed;
  row.predicted_busy_s = p.busy;
  row.predicted_bottleneck = p.bottleneck;
  return row;
}

// Calibration on the fit half: one time scale per resource, measured / predicted busy.
Hardware scale_resources(const Hardware& hw, FidelityReport& rep) {
  Hardware cal = hw;
  cal.sync = {};  // fitted afterwards, on top of the scaled pipeline
  for (const auto& [res, cat] : fidelity_resources()) {
    double m = 0, pr = 0;
    for (const auto& row : rep.rows)
      if (row.fit && row.predicted_busy_s.at(res) > 0 && row.measured_busy_s.at(res) > 0)
        m += row.measured_busy_s.at(res), pr += row.predicted_busy_s.at(res);
    const double s = pr > 0 && m > 0 ? m / pr : 1.0;
    rep.scales[res] = s;
    scale_resource(cal, res, s);
  }
  return cal;
}

// The synchronisation term, least squares on the fit half: measured / scaled - 1 = a + b x,
// x = sqrt(2 ln N), with a, b >= 0 (synchronisation only costs time): when the unconstrained fit
// makes one negative, it is 0 and the other is fitted alone. With one rank count in the fit half
// only the base a can be fitted. The profile's schema stops at SyncSpec::kMax (a step 11x its
// pipeline); a fit beyond it is the measurement, not the machine: clamped, and said in the returned
// note.
std::string fit_sync(FidelityReport& rep, const std::vector<FidelityPrediction>& scaled) {
  std::vector<double> xs, ys, resources_only;
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    const FidelityRow& row = rep.rows[i];
    if (!row.fit) {
      resources_only.push_back(std::fabs(scaled[i].step - row.measured_step_s) / row.measured_step_s);
      continue;
    }
    xs.push_back(std::sqrt(2.0 * std::log(static_cast<double>(row.ranks))));
    ys.push_back(row.measured_step_s / scaled[i].step - 1.0);
  }
  rep.heldout_mape_resources_only = mean(resources_only);
  const auto [a, b] = fit_sync_term(xs, ys);
  rep.sync_base = a;
  rep.sync_straggler = b;
  if (!(rep.sync_base > SyncSpec::kMax || rep.sync_straggler > SyncSpec::kMax)) return "";
  const std::string note = fmt::format(" (fitted base {:.3f}, straggler {:.3f}, clamped to {})",
                                       rep.sync_base, rep.sync_straggler, SyncSpec::kMax);
  rep.sync_base = std::min(rep.sync_base, SyncSpec::kMax);
  rep.sync_straggler = std::min(rep.sync_straggler, SyncSpec::kMax);
  return note;
}

// The calibrated profile's name, description and source line.
void name_calibration(Hardware& cal, const FidelityConfig& cfg, const FidelityReport& rep,
                      const std::string& sync_note) {
  cal.sync = {rep.sync_base, rep.sync_straggler};
  cal.name = cfg.hardware.name + "-calibrated";
  cal.description = fmt::format("{} calibrated against measured executor runs by slidedp-sweep fidelity",
                                cfg.hardware.name);
  std::string scales;
  for (const auto& [res, sc] : rep.scales)
    scales += fmt::format("{}{} x{:.3f}", scales.empty() ? "" : ", ", res, sc);
  cal.sources["calibration"] = fmt::format(
      "slidedp-sweep fidelity on {} plans of {} (seq {}): resource time scales {}; synchronisation term "
      "base {:.4f}, straggler {:.4f}{}",
      rep.rows.size(), cfg.card.name, cfg.seq_len, scales, rep.sync_base, rep.sync_straggler, sync_note);
}

// Why the worst held-out plan missed: the resource whose calibrated prediction is furthest from its
// measurement.
std::string worst_reason(const FidelityRow& row) {
  std::string why;
  double far = -1;
  for (const auto& [res, cat] : fidelity_resources()) {
    const double d = std::fabs(row.calibrated_busy_s.at(res) - row.measured_busy_s.at(res));
    if (d > far) far = d, why = res;
  }
  return fmt::format(
      "step predicted {} vs measured {}; the largest busy-time gap is {} (predicted {}, measured {}); "
      "exposed time predicted {} vs measured {}",
      format_seconds(row.calibrated_step_s), format_seconds(row.measured_step_s), why,
      format_seconds(row.calibrated_busy_s.at(why)), format_seconds(row.measured_busy_s.at(why)),
      format_seconds(row.calibrated_exposed_s), format_seconds(row.measured_exposed_s));
}

// The calibrated predictions against the measurements: errors on the held-out half (and the fit
// half, and before calibration), exposed time, bottlenecks.
void report_errors(FidelityReport& rep, const std::vector<FidelityPrediction>& calibrated) {
  std::vector<double> held, fitted, raw, raw_held, exp_err, exp_rel, exp_rel_raw;
  int match = 0, raw_match = 0;
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    FidelityRow& row = rep.rows[i];
    const FidelityPrediction& p = calibrated[i];
    row.calibrated_step_s = p.step;
    row.calibrated_exposed_s = p.exposed;
    row.calibrated_busy_s = p.busy;
    row.calibrated_bottleneck = p.bottleneck;
    row.analytical_step_s = p.analytical;
    const double e = std::fabs(row.error());
    (row.fit ? fitted : held).push_back(e);
    const double raw_e = std::fabs(row.predicted_step_s - row.measured_step_s) / row.measured_step_s;
    raw.push_back(raw_e);
    if (!row.fit) {
      raw_held.push_back(raw_e);
      exp_err.push_back(std::fabs(row.calibrated_exposed_s - row.measured_exposed_s));
      if (row.measured_exposed_s >= 0.05 * row.measured_step_s) {
        exp_rel.push_back(std::fabs(row.calibrated_exposed_s - row.measured_exposed_s) / row.measured_exposed_s);
        exp_rel_raw.push_back(std::fabs(row.predicted_exposed_s - row.measured_exposed_s) / row.measured_exposed_s);
      }
    }
    if (row.calibrated_bottleneck == row.measured_busiest) ++match;
    if (row.predicted_bottleneck == row.measured_busiest) ++raw_match;
    ++rep.measured_bottleneck_counts[row.measured_busiest];
    if (!row.fit && e > rep.heldout_worst) {
      rep.heldout_worst = e;
      rep.worst_plan = row.name + " (" + row.plan_summary + ")";
      rep.worst_reason = worst_reason(row);
    }
  }
  rep.heldout_mape = mean(held);
  rep.fit_mape = mean(fitted);
  rep.raw_mape = mean(raw);
  rep.heldout_exposed_mae_s = mean(exp_err);
  rep.heldout_raw_mape = mean(raw_held);
  rep.exposed_rel_plans = static_cast<int>(exp_rel.size());
  rep.exposed_rel_mean = mean(exp_rel);
  rep.exposed_rel_raw_mean = mean(exp_rel_raw);
  rep.exposed_rel_worst = exp_rel.empty() ? 0.0 : *std::max_element(exp_rel.begin(), exp_rel.end());
  const double n = static_cast<double>(rep.rows.size());
  rep.bottleneck_match = match / n;
  rep.raw_bottleneck_match = raw_match / n;
  for (const auto& [res, count] : rep.measured_bottleneck_counts)
    if (count / n > rep.majority_bottleneck_match) rep.majority_bottleneck_match = count / n, rep.majority_bottleneck = res;
}

}  // namespace

FidelityReport run_fidelity(const FidelityConfig& cfg) {
  FidelityReport rep;
  rep.model_name = cfg.card.name;
  rep.hardware_name = cfg.hardware.name;
  rep.backend = cfg.backend;
  rep.seq_len = cfg.seq_len;
  rep.paced = cfg.paced;
  const std::vector<FidelityPlan> plans = cfg.plans.empty() ? default_fidelity_plans() : cfg.plans;
  if (plans.size() < 2) throw InputError("fidelity", "needs at least 2 plans (one to fit, one to hold out)");
  if (cfg.steps <= cfg.warmup) throw InputError("fidelity", "steps must exceed the warm-up steps");
  if (cfg.rounds < 1) throw InputError("fidelity", "rounds must be at least 1");
  const Workload w = make_workload(cfg.card, cfg.seq_len);
  const std::vector<bool> fit = fit_half(plans.size(), cfg.split_seed);
  const std::vector<PlanSamples> samples = measure_plans(cfg, plans, w);
  std::vector<double> spreads;
  for (size_t i = 0; i < plans.size(); ++i) {
    const FidelityRow row = measured_row(cfg, w, plans[i], samples[i], fit[i]);
    rep.paced_ops += row.paced_ops;
    rep.paced_overruns += row.paced_overruns;
    if (samples[i].round_step.size() > 1) {
      spreads.push_back(row.round_spread);
      rep.worst_round_spread = std::max(rep.worst_round_spread, row.round_spread);
    }
    rep.rows.push_back(row);
  }
  rep.rounds = cfg.rounds;
  rep.mean_round_spread = mean(spreads);

  Hardware cal = scale_resources(cfg.hardware, rep);
  std::vector<FidelityPrediction> scaled;
  for (const FidelityPlan& fp : plans) scaled.push_back(predict_for_fidelity(w, cal, fp.plan, fp.system));
  const std::string sync_note = fit_sync(rep, scaled);
  name_calibration(cal, cfg, rep, sync_note);
  rep.calibrated_hardware = cal;
  // The calibrated profile's own predictions (the model applies its synchronisation term).
  std::vector<FidelityPrediction> calibrated;
  for (const FidelityPlan& fp : plans) calibrated.push_back(predict_for_fidelity(w, cal, fp.plan, fp.system));
  report_errors(rep, calibrated);
  return rep;
}

void write_fidelity_outputs(const FidelityReport& rep, const std::string& dir, const std::string& command) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const Provenance& pv = provenance();
  const std::string stamp = fmt::format("{} | git {} | {} ({} cores) | {}", command, pv.git_revision, pv.cpu_model,
                                        pv.cpu_count, utc_timestamp());
  // CSV: one row per plan.
  std::string csv = "# " + stamp + "\n";
  csv += "plan,summary,ranks,half,measured_step_s,predicted_step_s,calibrated_step_s,analytical_step_s,error,"
         "measured_exposed_s,predicted_exposed_s,calibrated_exposed_s,measured_busiest,predicted_bottleneck,"
         "calibrated_bottleneck,round_spread,time_scale,paced_ops,paced_overruns";
  for (const auto& [res, cat] : fidelity_resources()) csv += ",measured_" + res + "_s,calibrated_" + res + "_s";
  csv += "\n";
  for (const auto& r : rep.rows) {
    csv += fmt::format("{},\"{}\",{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.4f},{:.6g},{:.6g},{:.6g},{},{},{},{:.4f},{:.4g},{},{}",
                       r.name, r.plan_summary, r.ranks, r.fit ? "fit" : "heldout", r.measured_step_s, r.predicted_step_s,
                       r.calibrated_step_s, r.analytical_step_s, r.error(), r.measured_exposed_s, r.predicted_exposed_s,
                       r.calibrated_exposed_s, r.measured_busiest, r.predicted_bottleneck, r.calibrated_bottleneck,
                       r.round_spread, r.time_scale, r.paced_ops, r.paced_overruns);
    for (const auto& [res, cat] : fidelity_resources())
      csv += fmt::format(",{:.6g},{:.6g}", r.measured_busy_s.at(res), r.calibrated_busy_s.at(res));
    csv += "\n";
  }
  write_file_atomic((fs::path(dir) / "fidelity.csv").string(), csv);

  // Plot: calibrated prediction vs measurement, fit and held-out halves.
  ScatterPlot plot;
  plot.title = fmt::format("Predicted vs measured step time ({} on the {} backend)", rep.model_name, backend_label(rep.backend));
  plot.caption = stamp;
  plot.x = {"measured step time (s)", true};
  plot.y = {"predicted step time (s, calibrated)", true};
  PlotSeries fit{"fit half", {}, {}, {}}, held{"held-out half", {}, {}, {}};
  for (const auto& r : rep.rows) {
    PlotSeries& s = r.fit ? fit : held;
    s.x.push_back(r.measured_step_s);
    s.y.push_back(r.calibrated_step_s);
    s.labels.push_back(r.name + ": " + r.plan_summary);
  }
  plot.series = {held, fit};
  write_file_atomic((fs::path(dir) / "fidelity.svg").string(), svg_scatter(plot));
  write_file_atomic((fs::path(dir) / "calibrated_profile.yaml").string(), hardware_to_yaml(rep.calibrated_hardware));

  // Summary.
  std::vector<std::string> head = {"plan", "half", "measured", "run spread", "predicted", "error", "uncal. error",
                                   "exposed meas.", "exposed pred.", "busiest meas.", "bottleneck pred."};
  std::vector<std::string> units = {"", "", "ms", "%", "ms", "%", "%", "ms", "ms", "", ""};
  if (rep.paced) head.push_back("time scale"), units.push_back("");
  Table t(head, units);
  for (const auto& r : rep.rows) {
    std::vector<std::string> cells = {
        r.name, r.fit ? "fit" : "held-out", fmt::format("{:.2f}", r.measured_step_s * 1e3),
        fmt::format("{:.1f}", 100 * r.round_spread), fmt::format("{:.2f}", r.calibrated_step_s * 1e3),
        fmt::format("{:+.1f}", 100 * r.error()),
        fmt::format("{:+.1f}", 100 * (r.predicted_step_s - r.measured_step_s) / r.measured_step_s),
        fmt::format("{:.2f}", r.measured_exposed_s * 1e3), fmt::format("{:.2f}", r.calibrated_exposed_s * 1e3),
        r.measured_busiest, r.calibrated_bottleneck};
    if (rep.paced) cells.push_back(fmt::format("{:.0f}", r.time_scale));
    t.add_row(cells);
  }
  std::string md = "# Model fidelity: predicted vs measured executor runs\n\n";
  md += "Produced by: `" + command + "`  \n" + fmt::format("git {}, {} ({} cores), {}\n\n", pv.git_revision, pv.cpu_model,
                                                           pv.cpu_count, utc_timestamp());
  if (rep.paced)
    md += fmt::format(
        "{} plans of {} (seq {}), each run with the executor on the CPU backend paced at the ratios of `{}` (every "
        "operation done for real, then held until that machine would be done, time stretched by the plan's scale; "
        "measured times below are divided by it, so they are the target's seconds) and predicted by the "
        "discrete-event simulator for `{}`. {} of {} paced operations ran over their paced time. One time scale "
        "per resource was fitted on half of the plans (measured / predicted busy time) and the errors below are "
        "reported on the other half. Every plan ran {} times (rounds in shuffled orders); measured figures are "
        "medians over the measured steps of all rounds.\n\n",
        rep.rows.size(), rep.model_name, rep.seq_len, rep.hardware_name, rep.hardware_name, rep.paced_overruns,
        rep.paced_ops, rep.rounds);
  else
    md += fmt::format(
        "{} plans of {} (seq {}) on the {} backend, each run with the executor and predicted by the discrete-event "
        "simulator on the hardware profile `{}`. One time scale per resource was fitted on half of the plans "
        "(measured / predicted busy time) and the errors below are reported on the other half. Every plan ran {} "
        "times (rounds in shuffled orders); measured figures are medians over the measured steps of all "
        "rounds.\n\n",
        rep.rows.size(), rep.model_name, rep.seq_len, backend_label(rep.backend), rep.hardware_name, rep.rounds);
  md += "| metric | calibrated | uncalibrated | target |\n|---|---|---|---|\n";
  md += fmt::format("| step time, mean absolute % error, held-out | {:.1f}% | {:.1f}% | {} |\n", 100 * rep.heldout_mape,
                    100 * rep.heldout_raw_mape, rep.paced ? "<= 5% goal, <= 8%" : "<= 10%");
  md += fmt::format("| step time, worst held-out plan | {:.1f}% | | {} |\n", 100 * rep.heldout_worst,
                    rep.paced ? "<= 15%" : "<= 20%");
  md += fmt::format("| step time, MAPE on the fit half | {:.1f}% | | |\n", 100 * rep.fit_mape);
  md += fmt::format("| step time, MAPE of all plans | | {:.1f}% | |\n", 100 * rep.raw_mape);
  md += fmt::format("| step time, held-out MAPE with the resource scales alone (no synchronisation term) | {:.1f}% | | |\n",
                    100 * rep.heldout_mape_resources_only);
  md += fmt::format("| exposed time, mean absolute error, held-out | {} | | |\n", format_seconds(rep.heldout_exposed_mae_s));
  if (rep.exposed_rel_plans > 0)
    md += fmt::format("| exposed time, relative error, held-out plans exposing >= 5% of their step ({}), mean / worst | "
                      "{:.0f}% / {:.0f}% | {:.0f}% mean | <= 20% |\n",
                      rep.exposed_rel_plans, 100 * rep.exposed_rel_mean, 100 * rep.exposed_rel_worst,
                      100 * rep.exposed_rel_raw_mean);
  md += fmt::format("| predicted bottleneck = measured busiest resource | {:.0f}% of plans | {:.0f}% | >= 90% |\n",
                    100 * rep.bottleneck_match, 100 * rep.raw_bottleneck_match);
  md += fmt::format("| ... the predictor that always answers the most common measured bottleneck ({}) | {:.0f}% | | "
                    "30 points below |\n",
                    rep.majority_bottleneck, 100 * rep.majority_bottleneck_match);
  if (rep.rounds > 1)
    md += fmt::format("| measurement noise: run-to-run spread of a plan's step time (max - min) / median, mean / worst | "
                      "{:.1f}% / {:.1f}% | | |\n",
                      100 * rep.mean_round_spread, 100 * rep.worst_round_spread);
  md += "\n";
  md += "Calibration (time multiplier per resource, fitted on the fit half): ";
  std::vector<std::string> sc;
  for (const auto& [k, v] : rep.scales) sc.push_back(fmt::format("{} x{:.2f}", k, v));
  md += fmt::format("{}.\n\n", fmt::join(sc, ", "));
  md += fmt::format(
      "Synchronisation term (fitted on the fit half after the resource scales): a plan of N ranks takes "
      "(1 + {:.3f} + {:.3f} * sqrt(2 ln N)) times its calibrated simulation, the difference counted as exposed time. "
      "The first number is the hand-off latency between the emulated devices' threads that the simulator does not "
      "model; the second is the straggler effect: a synchronous step waits for the slowest of N ranks at every "
      "collective, and the expected maximum of N Gaussian jitters grows as sqrt(2 ln N). Both are fitted >= 0.\n\n",
      rep.sync_base, rep.sync_straggler);
  md += "`calibrated_profile.yaml` is the profile with both applied (the resource scales to its rates, the term as "
        "`sync:`, which the model applies itself): `slidedp-predict --hardware` and `slidedp-plan --hardware` with it "
        "predict the calibrated figures above.\n\n";
  md += "Worst held-out plan: " + rep.worst_plan + ": " + rep.worst_reason + ".\n\n";
  md += "Files: `fidelity.csv` (every plan, every resource), `fidelity.svg` (predicted vs measured, y = x and +/-10%), "
        "`calibrated_profile.yaml`.\n\n";
  md += "```\n" + t.render() + "```\n";
  write_file_atomic((fs::path(dir) / "README.md").string(), md);
}

void write_fidelity_summary(const std::vector<FidelityReport>& reports, const std::string& dir, const std::string& command) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const Provenance& pv = provenance();
  Table t({"target", "plans", "held-out MAPE", "uncal.", "worst", "bottleneck right", "uncal.", "always-most-common",
           "exposed err. (n)", "ops over"},
          {"", "", "%", "%", "%", "%", "%", "%", "% mean / worst", ""});
  std::map<std::string, int> pooled_counts;
  int plans = 0, match = 0, raw_match = 0;
  std::string scales;
  for (const FidelityReport& r : reports) {
    const int n = static_cast<int>(r.rows.size());
    plans += n;
    for (const FidelityRow& row : r.rows) {
      ++pooled_counts[row.measured_busiest];
      match += row.calibrated_bottleneck == row.measured_busiest;
      raw_match += row.predicted_bottleneck == row.measured_busiest;
    }
    t.add_row({r.hardware_name, std::to_string(n), fmt::format("{:.1f}", 100 * r.heldout_mape),
               fmt::format("{:.1f}", 100 * r.heldout_raw_mape), fmt::format("{:.1f}", 100 * r.heldout_worst),
               fmt::format("{:.0f}", 100 * r.bottleneck_match), fmt::format("{:.0f}", 100 * r.raw_bottleneck_match),
               fmt::format("{:.0f} ({})", 100 * r.majority_bottleneck_match, r.majority_bottleneck),
               r.exposed_rel_plans ? fmt::format("{:.0f} / {:.0f} ({})", 100 * r.exposed_rel_mean, 100 * r.exposed_rel_worst,
                                                 r.exposed_rel_plans)
                                   : "-",
               fmt::format("{} of {}", r.paced_overruns, r.paced_ops)});
    std::vector<std::string> sc;
    for (const auto& [k, v] : r.scales) sc.push_back(fmt::format("{} x{:.2f}", k, v));
    scales += fmt::format("- {}: {}; synchronisation base {:.3f}, straggler {:.3f}\n", r.hardware_name, fmt::join(sc, ", "),
                          r.sync_base, r.sync_straggler);
  }
  int most = 0;
  std::string most_name;
  for (const auto& [res, c] : pooled_counts)
    if (c > most) most = c, most_name = res;
  std::string md = "# Model fidelity in every regime: paced runs on several targets\n\n";
  md += "Produced by: `" + command + "`  \n" +
        fmt::format("git {}, {} ({} cores), {}\n\n", pv.git_revision, pv.cpu_model, pv.cpu_count, utc_timestamp());
  md += fmt::format(
      "{} plans over {} targets. For each target the plans were chosen from a grid so that the model predicts "
      "each resource it can bind there as the bottleneck of several (sweeps/fidelity_regimes.h); every plan then ran "
      "on the CPU backend paced at the target's ratios and was compared with the model's prediction for the target. "
      "Per target: calibrated on half of its plans, reported on the other half (details and plots in each target's "
      "folder).\n\n",
      plans, reports.size());
  md += "```\n" + t.render() + "```\n\n";
  md += "Measured bottleneck (busiest resource) over all plans:";
  for (const auto& [res, c] : pooled_counts) md += fmt::format(" {} {},", res, c);
  md.back() = '.';
  md += fmt::format(
      "\n\nPooled: the calibrated model names the measured bottleneck in {:.0f}% of the {} plans ({:.0f}% "
      "uncalibrated); always answering the most common one ({}) would score {:.0f}%.\n\n",
      100.0 * match / std::max(1, plans), plans, 100.0 * raw_match / std::max(1, plans), most_name,
      100.0 * most / std::max(1, plans));
  md += "Resource time scales fitted per target (measured / predicted busy time on the fit half):\n\n" + scales;
  write_file_atomic((fs::path(dir) / "README.md").string(), md);
}

}  // namespace slidedp
