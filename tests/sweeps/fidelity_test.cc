// The fidelity pipeline end to end on a small version (3 plans, few steps): it measures, predicts,
// calibrates and writes a well-formed CSV, plot and summary. The accuracy figures themselves live in
// results/fidelity/, never in timed tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/hardware.h"
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
  // fit plan's whole residual (the straggler slope cannot be fitted) and that plan is then exact.
  EXPECT_EQ(rep.sync_straggler, 0.0);
  for (const auto& r : rep.rows) {
    if (!r.fit) continue;
    EXPECT_NEAR(r.calibrated_step_s / r.measured_step_s, 1.0, 1e-9) << r.name;
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
