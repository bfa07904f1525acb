// The fidelity pipeline end to end on a small version (3 plans, few steps): it measures, predicts,
// calibrates and writes a well-formed CSV, plot and summary. The accuracy figures themselves live in
// results/fidelity/, never in timed tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "model/hardware.h"
#include "model/simulator.h"
#include "sweeps/fidelity.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

TEST(Fidelity, SmallValidationRunsEndToEndAndWritesWellFormedOutputs) {
  FidelityConfig cfg;
  cfg.card = model_card_from_yaml(
      "name: tiny\nmodel_type: llama\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 64\nvocab_size: 256\n",
      "tiny");
  cfg.seq_len = 16;
  cfg.hardware = hardware_preset("cpu-dev");
  cfg.steps = 3;
  cfg.warmup = 1;
  cfg.rounds = 2;  // every plan twice, so the run-to-run spread is measured
  auto plans = default_fidelity_plans();
  cfg.plans = {plans[0], plans[5], plans[16]};  // 1 rank; 2 ranks gpu route; 4 ranks sharded + offload
  for (auto& p : cfg.plans) {
    p.plan.offload_layers = std::min(p.plan.offload_layers, 1);
    p.plan.keep_layers = Plan::kRest;
    p.plan.recompute_layers = std::min(p.plan.recompute_layers, 1);
  }
  FidelityReport rep = run_fidelity(cfg);
  ASSERT_EQ(rep.rows.size(), 3u);
  int fit = 0;
  for (const auto& r : rep.rows) {
    EXPECT_GT(r.measured_step_s, 0);
    EXPECT_GT(r.predicted_step_s, 0);
    EXPECT_GT(r.calibrated_step_s, 0);
    EXPECT_GT(r.measured_busy_s.at("gpu_compute"), 0);
    ASSERT_EQ(r.round_step_s.size(), 2u);
    // The spread is (max - min) / median of the two round medians, so it is 2|a-b|/(a+b).
    const double a = r.round_step_s[0], b = r.round_step_s[1];
    EXPECT_NEAR(r.round_spread, 2 * std::abs(a - b) / (a + b), 1e-12);
    EXPECT_LE(r.round_spread, rep.worst_round_spread);
    fit += r.fit;
  }
  EXPECT_EQ(rep.rounds, 2);
  // One plan fits the calibration, so the synchronisation term has one point: its base absorbs the
  // fit plan's whole residual (the straggler slope cannot be fitted) and that plan is then exact,
  // unless the residual is negative (the scaled simulation already too slow), when the base is 0.
  EXPECT_EQ(rep.sync_straggler, 0.0);
  for (const auto& r : rep.rows) {
    if (!r.fit) continue;
    if (rep.sync_base > 0 && rep.sync_base < SyncSpec::kMax) {
      EXPECT_NEAR(r.calibrated_step_s / r.measured_step_s, 1.0, 1e-9) << r.name;
    } else if (rep.sync_base == 0) {
      EXPECT_GE(r.calibrated_step_s, r.measured_step_s) << r.name;
    }  // (at kMax the fit was clamped: a step 11x its pipeline, a machine too busy to calibrate)
  }
  // The calibrated profile carries the term and reproduces every calibrated figure by itself.
  EXPECT_EQ(rep.calibrated_hardware.sync.base, rep.sync_base);
  EXPECT_EQ(rep.calibrated_hardware.sync.straggler, rep.sync_straggler);
  for (std::size_t i = 0; i < rep.rows.size(); ++i) {
    const Workload w = make_workload(cfg.card, cfg.seq_len);
    SimulatorOptions opt;
    opt.record_timeline = false;
    opt.measure_sync = false;
    const double step = simulate(w, rep.calibrated_hardware, cfg.plans[i].plan, System::kSlideDP, opt).prediction.step_time_s;
    EXPECT_NEAR(step, rep.rows[i].calibrated_step_s, 1e-12 * step) << rep.rows[i].name;
  }
  EXPECT_EQ(fit, 1);  // half (rounded down) fits the calibration
  for (const auto& [res, s] : rep.scales) EXPECT_GT(s, 0) << res;

  const fs::path dir = fs::temp_directory_path() / ("slidedp_fidelity_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_fidelity_outputs(rep, dir.string(), "test");
  std::ifstream csv(dir / "fidelity.csv");
  std::string line, header;
  std::getline(csv, line);
  EXPECT_EQ(line.rfind("# test", 0), 0u);  // provenance comment first
  std::getline(csv, header);
  const auto columns = std::count(header.begin(), header.end(), ',') + 1;
  int rows = 0;
  while (std::getline(csv, line)) {
    // Quoted plan summaries contain no commas (they use " | "), so commas count columns.
    EXPECT_EQ(std::count(line.begin(), line.end(), ',') + 1, columns) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 3);
  // The calibrated profile is written and loads.
  const Hardware cal = load_hardware((dir / "calibrated_profile.yaml").string());
  EXPECT_NEAR(cal.sync.base, rep.sync_base, 1e-14);  // YAML keeps 15 digits
  EXPECT_EQ(cal.name, rep.calibrated_hardware.name);
  std::stringstream svg;
  svg << std::ifstream(dir / "fidelity.svg").rdbuf();
  EXPECT_EQ(svg.str().rfind("<svg", 0), 0u);
  EXPECT_NE(svg.str().find("</svg>"), std::string::npos);
  int circles = 0;
  for (size_t p = svg.str().find("<circle"); p != std::string::npos; p = svg.str().find("<circle", p + 1)) ++circles;
  EXPECT_EQ(circles, 3);
  EXPECT_TRUE(fs::exists(dir / "README.md"));
  fs::remove_all(dir);
}

TEST(Fidelity, SyncTermFitIsLeastSquaresWithNonNegativeTerms) {
  // Exact data y = 0.06 + 0.075 x comes back exactly.
  const std::vector<double> x = {0.0, 1.1774, 1.6651, 0.0, 1.6651};
  std::vector<double> y;
  for (double v : x) y.push_back(0.06 + 0.075 * v);
  auto [a, b] = fit_sync_term(x, y);
  EXPECT_NEAR(a, 0.06, 1e-12);
  EXPECT_NEAR(b, 0.075, 1e-12);
  // A falling trend: the straggler is pinned at 0 and the base is the mean.
  std::tie(a, b) = fit_sync_term({0.0, 1.0, 2.0}, {0.3, 0.2, 0.1});
  EXPECT_EQ(b, 0.0);
  EXPECT_NEAR(a, 0.2, 1e-12);
  // A negative intercept: the base is pinned at 0 and the slope fitted through the origin,
  // sum(xy) / sum(x^2) = (0.1 + 0.6) / (1 + 4) = 0.14.
  std::tie(a, b) = fit_sync_term({0.0, 1.0, 2.0}, {-0.1, 0.1, 0.3});
  EXPECT_EQ(a, 0.0);
  EXPECT_NEAR(b, 0.14, 1e-12);
  // One distinct x: the base alone; all negative: nothing.
  std::tie(a, b) = fit_sync_term({0.0, 0.0}, {0.1, 0.3});
  EXPECT_NEAR(a, 0.2, 1e-12);
  EXPECT_EQ(b, 0.0);
  std::tie(a, b) = fit_sync_term({0.0}, {-0.2});
  EXPECT_EQ(a, 0.0);
  EXPECT_EQ(b, 0.0);
}

TEST(Fidelity, PlansWithinRanksKeepsOnlyPlansAGpuMachineCanRun) {
  const auto all = default_fidelity_plans();
  for (int max_ranks : {1, 2, 4}) {
    const auto kept = plans_within_ranks(all, max_ranks);
    size_t expected = 0;
    for (const auto& p : all) expected += p.plan.ranks <= max_ranks;
    EXPECT_EQ(kept.size(), expected) << max_ranks;
    for (const auto& p : kept) EXPECT_LE(p.plan.ranks, max_ranks) << p.name;
  }
  EXPECT_EQ(plans_within_ranks(all, 4).size(), all.size());  // the validation set spans 1-4 ranks
  EXPECT_GE(plans_within_ranks(all, 1).size(), 2u);          // one GPU still fits and holds out a plan
}

}  // namespace
}  // namespace slidedp
