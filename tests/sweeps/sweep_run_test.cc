// A tiny sweep end to end (every system, a what-if machine, the simulator re-scoring): rows are
// consistent with the planner and the model, the report's CSV is well formed and carries its
// provenance, the plots are complete SVG files. The analyses are checked on hand-made rows whose
// answers are known.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "common/provenance.h"
#include "model/step_model.h"
#include "model/step_work.h"
#include "planner/search.h"
#include "sweeps/sweep_analysis.h"
#include "sweeps/sweep_report.h"
#include "sweeps/sweep_runner.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

const char* kTiny = R"(name: tiny
description: every system on a small model, one what-if machine
analyses: [throughput, speedups, bottlenecks, longest_sequence, scaling]
paper:
  - claim: speedups
    paper: 1.46-2.64x
    metric: speedup_geomean
  - claim: fsdp2
    paper: "+11.2%"
    metric: fsdp2_peak_excess
grids:
  - name: small
    hardware:
      - preset: h100-sxm-x4
      - preset: h100-sxm-x4
        label: gen4
        overrides: {host_link: {h2d_gbps: 25.8, d2h_gbps: 25.7, h2d_all_gbps: 23, d2h_all_gbps: 23}}
    ranks: [2, 4]
    models: [llama-3.2-1b]
    seq_lens: [1024]
    tokens_per_step: [8192, 32768]
    systems: [slidedp, slideformer-dp, zero-offload, megatrain, fsdp2]
)";

// Splits one CSV line, honouring double quotes.
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"')
        out.back() += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        out.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

class TinySweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spec_ = new SweepSpec(sweep_spec_from_yaml(kTiny, "tiny.yaml"));
    SweepRunOptions o;
    o.simulate = true;
    result_ = new SweepResult(run_sweep(*spec_, o));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete spec_;
  }
  static SweepSpec* spec_;
  static SweepResult* result_;
};
SweepSpec* TinySweep::spec_ = nullptr;
SweepResult* TinySweep::result_ = nullptr;

TEST_F(TinySweep, EveryPointIsScoredOrSaysWhyNot) {
  ASSERT_EQ(result_->rows.size(), 2u * 2 * 2 * 5);
  for (const SweepRow& r : result_->rows) {
    SCOPED_TRACE(fmt::format("{} {} r{} {} {}", r.hardware, r.model, r.point.ranks, r.point.tokens_per_step,
                             r.system));
    if (!r.feasible) {
      EXPECT_FALSE(r.infeasible_reason.empty());
      continue;
    }
    EXPECT_GT(r.predicted.step_time_s, 0);
    EXPECT_GT(r.tokens_per_s(), 0);
    // The breakdown sums to the step time (STYLE habit 7), for both views.
    EXPECT_NEAR(r.predicted.breakdown.total(), r.predicted.step_time_s, 1e-9 * r.predicted.step_time_s);
    ASSERT_TRUE(r.simulated.has_value());
    EXPECT_NEAR(r.simulated->breakdown.total(), r.simulated->step_time_s, 1e-6 * r.simulated->step_time_s);
    // The chosen plan runs the point's step: ranks x micro-batch x accumulation x seq = tokens.
    EXPECT_EQ(r.plan.ranks, r.point.ranks);
    EXPECT_EQ(r.plan.global_batch_sequences() * r.point.seq_len, r.point.tokens_per_step);
    EXPECT_DOUBLE_EQ(r.predicted.tokens_per_step, static_cast<double>(r.point.tokens_per_step));
    EXPECT_TRUE(r.predicted.feasible);
    EXPECT_FALSE(r.plan_summary.empty());
  }
  // SlideDP fits every point of a 1B model on 80 GB GPUs.
  for (const SweepRow& r : result_->rows)
    if (r.point.system == System::kSlideDP) {
      EXPECT_TRUE(r.feasible) << r.infeasible_reason;
    }
}

TEST_F(TinySweep, SlideDPRowIsThePlannersChoiceAndBaselinesKeepTheirFixedChoices) {
  for (const SweepRow& r : result_->rows) {
    if (!r.feasible) continue;
    const SweepGrid& g = spec_->grids[0];
    const Workload w = make_workload(g.models[0], r.point.seq_len);
    const Hardware& hw = g.hardware[static_cast<std::size_t>(r.point.hardware)].hw;
    if (r.point.system == System::kSlideDP) {
      planner::SearchSpec s;
      s.ranks = r.point.ranks;
      s.global_batch_tokens = r.point.tokens_per_step;
      planner::SearchOptions o;
      o.top_k = 1;
      o.rescore_with_simulator = false;
      const planner::SearchResult sr = planner::search_plans(w, hw, s, o);
      EXPECT_DOUBLE_EQ(r.predicted.step_time_s, sr.best().predicted.step_time_s);
      EXPECT_EQ(r.plan_summary, sr.best().plan.summary(static_cast<int>(w.model.num_layers)));
    } else {
      // The row's plan is the plan as the system runs it.
      const Plan fixed = plan_for_system(r.plan, r.point.system, w.model);
      EXPECT_EQ(fixed.summary(static_cast<int>(w.model.num_layers)), r.plan_summary);
      EXPECT_DOUBLE_EQ(predict_analytical(w, hw, r.plan, r.point.system).step_time_s,
                       r.predicted.step_time_s);
    }
  }
}

// A baseline's plan is the fastest batch split that fits: no other split of the same step that fits
// is faster under the same model.
// A grid's optimizer_states and clip reach the planner: the row is its choice under them, and the CSV
// says which format and schedule each point ran.
TEST(SweepRunner, AGridsFormatAndClippingAreThePlannersAndTheCsvs) {
  const SweepSpec spec = sweep_spec_from_yaml(R"(name: formats
grids:
  - name: bf16 clipped
    hardware: [{preset: h100-sxm-x4}]
    ranks: [4]
    models: [llama-3.2-1b]
    seq_lens: [1024]
    tokens_per_step: [16384]
    systems: [slidedp]
    optimizer_states: bf16
    clip: true
)",
                                              "formats.yaml");
  const SweepResult res = run_sweep(spec, SweepRunOptions{});
  ASSERT_EQ(res.rows.size(), 1u);
  const SweepRow& r = res.rows[0];
  ASSERT_TRUE(r.feasible) << r.infeasible_reason;
  EXPECT_EQ(r.plan.optimizer_states, OptimizerStates::kBf16);
  EXPECT_TRUE(r.plan.verify_updates);
  planner::SearchSpec s;
  s.ranks = 4;
  s.objective = planner::Objective::kMatchedBatch;
  s.global_batch_tokens = 16384;
  s.optimizer_states = OptimizerStates::kBf16;
  s.verify_updates = true;
  planner::SearchOptions o;
  o.top_k = 1;
  o.rescore_with_simulator = false;
  const planner::SearchResult want =
      planner::search_plans(make_workload(spec.grids[0].models[0], 1024), spec.grids[0].hardware[0].hw, s, o);
  EXPECT_EQ(r.predicted.step_time_s, want.best().predicted.step_time_s);
  const std::vector<std::string> cols = sweep_csv_columns(), cells = sweep_csv_cells(r);
  const auto at = [&](const std::string& c) {
    return cells[static_cast<std::size_t>(std::find(cols.begin(), cols.end(), c) - cols.begin())];
  };
  EXPECT_EQ(at("optimizer_states"), "bf16");
  EXPECT_EQ(at("clip"), "1");
}

TEST(SweepRunner, BaselinePlanIsTheFastestSplitThatFits) {
  const Workload w = make_workload(model_preset("qwen3-14b"), 4096);
  const Hardware hw = hardware_preset("h100-sxm-x4");
  const int64_t tokens = 4 * 4096 * 16;
  for (System sys : {System::kSlideFormerDP, System::kZeroOffload, System::kMegaTrain, System::kFsdp2}) {
    SCOPED_TRACE(system_name(sys));
    std::string why;
    const auto best = best_baseline_plan(w, hw, sys, 4, tokens, &why);
    ASSERT_TRUE(best.has_value()) << why;
    EXPECT_GT(best->candidates, 0);
    for (int mb : {1, 2, 4, 8, 16}) {
      Plan p;
      p.ranks = 4;
      p.micro_batch = mb;
      p.accum_steps = 16 / mb;
      const Prediction pr = predict_analytical(w, hw, p, sys);
      if (pr.feasible) {
        EXPECT_LE(best->predicted.step_time_s, pr.step_time_s * (1 + 1e-12)) << "mb " << mb;
      }
    }
  }
  // A step nobody can fit: the reason names the budget and the closest miss.
  std::string why;
  EXPECT_FALSE(best_baseline_plan(make_workload(model_preset("qwen2.5-72b"), 4096),
                                  hardware_preset("rtx4090-x4"), System::kFsdp2, 4, 4 * 4096, &why));
  EXPECT_NE(why.find("closest"), std::string::npos) << why;
  EXPECT_NE(why.find("GPU memory"), std::string::npos) << why;
}

// A point whose step the simulator cannot hold (2^32 tokens per step: 2^20 micro-steps) keeps the
// analytical model's figures, is marked, and the report counts it; the sweep does not fail.
TEST(SweepRunner, APointTooLargeToSimulateKeepsItsAnalyticalScoreAndIsCounted) {
  const SweepSpec spec = sweep_spec_from_yaml(R"(name: huge
grids:
  - name: huge
    hardware: [{preset: h100-sxm-x4}]
    ranks: [4]
    models: [llama-3.2-1b]
    seq_lens: [1024]
    tokens_per_step: [4294967296]
    systems: [slidedp]
)", "huge.yaml");
  SweepRunOptions o;
  o.simulate = true;
  const SweepResult r = run_sweep(spec, o);
  ASSERT_EQ(r.rows.size(), 1u);
  const SweepRow& row = r.rows.front();
  ASSERT_TRUE(row.feasible) << row.infeasible_reason;
  EXPECT_FALSE(row.simulated.has_value());
  EXPECT_TRUE(row.too_large_to_simulate);
  EXPECT_GT(row.tokens_per_s(), 0.0);
  EXPECT_EQ(row.tokens_per_s(), row.analytical_tokens_per_s());
  bool counted = false;
  for (const SweepFile& f : render_sweep_report(r, "test"))
    counted |= f.content.find("1 points were not simulated") != std::string::npos;
  EXPECT_TRUE(counted) << "the report's simulator section does not count the point";
}

TEST_F(TinySweep, ReportFilesAreWellFormedAndCarryTheirProvenance) {
  const std::vector<SweepFile> files = render_sweep_report(*result_, "slidedp-sweep run tiny.yaml");
  const std::string rev = provenance().git_revision, hash = hash_hex(spec_->text_hash);
  bool csv_seen = false, readme_seen = false;
  int svgs = 0;
  for (const SweepFile& f : files) {
    SCOPED_TRACE(f.name);
    if (f.name == "points.csv") {
      csv_seen = true;
      std::istringstream in(f.content);
      std::string stamp, header, line;
      std::getline(in, stamp);
      EXPECT_EQ(stamp.rfind("# slidedp-sweep run tiny.yaml", 0), 0u) << stamp;
      EXPECT_NE(stamp.find("git " + rev), std::string::npos);
      EXPECT_NE(stamp.find(hash), std::string::npos);
      std::getline(in, header);
      const std::vector<std::string> cols = split_csv(header);
      EXPECT_EQ(cols, sweep_csv_columns());
      std::size_t rows = 0;
      const auto col = [&](const std::string& name) {
        return static_cast<std::size_t>(std::find(cols.begin(), cols.end(), name) - cols.begin());
      };
      while (std::getline(in, line)) {
        const std::vector<std::string> cells = split_csv(line);
        ASSERT_EQ(cells.size(), cols.size()) << line;
        const SweepRow& r = result_->rows[rows];
        EXPECT_EQ(cells[col("system")], r.system);
        EXPECT_EQ(cells[col("feasible")], r.feasible ? "1" : "0");
        if (r.feasible) {
          EXPECT_NEAR(std::stod(cells[col("tokens_per_s")]), r.predicted.tokens_per_s, 0.06);
          EXPECT_GT(std::stod(cells[col("sim_step_time_s")]), 0);
        } else {
          EXPECT_FALSE(cells[col("infeasible_reason")].empty());
        }
        ++rows;
      }
      EXPECT_EQ(rows, result_->rows.size());
    } else if (f.name == "README.md") {
      readme_seen = true;
      EXPECT_NE(f.content.find("slidedp-sweep run tiny.yaml"), std::string::npos);
      EXPECT_NE(f.content.find(rev), std::string::npos);
      EXPECT_NE(f.content.find(spec_->text), std::string::npos) << "the spec is copied into the README";
      EXPECT_NE(f.content.find("## Simulator cross-check"), std::string::npos);
      EXPECT_NE(f.content.find("## SlideDP's speedup over each baseline"), std::string::npos);
      EXPECT_NE(f.content.find("## Scaling with the number of GPUs"), std::string::npos);
      // Every plot the README links exists.
      for (const SweepFile& g : files)
        if (g.name.size() > 4 && g.name.substr(g.name.size() - 4) == ".svg") {
          EXPECT_NE(f.content.find("(" + g.name + ")"), std::string::npos) << g.name;
        }
    } else {
      ASSERT_EQ(f.name.substr(f.name.size() - 4), ".svg");
      ++svgs;
      EXPECT_EQ(f.content.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
      EXPECT_EQ(f.content.substr(f.content.size() - 7), "</svg>\n");
      EXPECT_NE(f.content.find("git " + rev), std::string::npos) << "the caption names the revision";
      for (const char* bad : {"nan\"", "inf\"", "nan,", "inf,", "nan ", "inf "})
        EXPECT_EQ(f.content.find(bad), std::string::npos) << "a coordinate is not finite: " << bad;
    }
  }
  EXPECT_TRUE(csv_seen);
  EXPECT_TRUE(readme_seen);
  // throughput: 2 machines x 2 rank counts; speedups: 2 machines; bottlenecks: 1 grid; seq_len: 2 machines;
  // scaling: 2 machines x 2 batches (strong).
  EXPECT_EQ(svgs, 4 + 2 + 1 + 2 + 4);

  const fs::path dir = fs::temp_directory_path() / ("slidedp_sweep_run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::vector<std::string> names =
      write_sweep_report(*result_, dir.string(), "slidedp-sweep run tiny.yaml");
  EXPECT_EQ(names.size(), files.size());
  for (const std::string& n : names) EXPECT_TRUE(fs::exists(dir / n)) << n;
  // Same rows as rendered (the stamp's time of day may differ by a second).
  const std::string written = read_text_file((dir / "points.csv").string());
  ASSERT_EQ(files[1].name, "points.csv");
  EXPECT_EQ(written.substr(written.find('\n')), files[1].content.substr(files[1].content.find('\n')));
  // Written again over the old report: published in one step from a temporary folder, so nothing is
  // left beside it; a file the run does not write (notes) carries over; the rows are the new ones.
  write_file_atomic((dir / "NOTES.md").string(), "hand-written\n");
  write_file_atomic((dir / "points.csv").string(), "stale\n");
  write_sweep_report(*result_, dir.string(), "slidedp-sweep run tiny.yaml");
  EXPECT_EQ(read_text_file((dir / "NOTES.md").string()), "hand-written\n");
  EXPECT_NE(read_text_file((dir / "points.csv").string()), "stale\n");
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-" + dir.filename().string() + "-", 0), 0u) << e.path();
  fs::remove_all(dir);
}

// ---- analyses on hand-made rows ----

SweepRow row(int model, int64_t seq, int ranks, int64_t batch, System sys, double tokens_per_s,
             bool feasible = true) {
  SweepRow r;
  r.point.model = model;
  r.point.seq_len = seq;
  r.point.ranks = ranks;
  r.point.batch_value = batch;
  r.point.tokens_per_step = batch;
  r.point.system = sys;
  r.hardware = "box";
  r.model = model == 0 ? "m0" : "m1";
  r.system = system_name(sys);
  r.feasible = feasible;
  r.predicted.tokens_per_s = tokens_per_s;
  r.predicted.step_time_s = 1;
  r.predicted.bottleneck = "gpu_compute";
  if (!feasible) r.infeasible_reason = "GPU memory";
  return r;
}

TEST(SweepAnalysis, SpeedupsAreGeometricMeansOverPointsWhereBothFit) {
  std::vector<SweepRow> rows = {
      row(0, 1024, 4, 100, System::kSlideDP, 400),      row(0, 1024, 4, 100, System::kMegaTrain, 100),  // 4x
      row(0, 1024, 4, 200, System::kSlideDP, 400),      row(0, 1024, 4, 200, System::kMegaTrain, 400),  // 1x
      row(0, 1024, 4, 300, System::kSlideDP, 400),      row(0, 1024, 4, 300, System::kMegaTrain, 0, false),
      row(0, 1024, 4, 400, System::kSlideDP, 0, false), row(0, 1024, 4, 400, System::kMegaTrain, 50),
  };
  const std::vector<SpeedupStat> s = speedup_stats(rows);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].baseline, "megatrain");
  EXPECT_DOUBLE_EQ(s[0].geomean, 2.0);
  EXPECT_DOUBLE_EQ(s[0].min, 1.0);
  EXPECT_DOUBLE_EQ(s[0].max, 4.0);
  EXPECT_EQ(s[0].points, 2);
  EXPECT_EQ(s[0].baseline_infeasible, 1);
  EXPECT_EQ(s[0].slidedp_infeasible, 1);
  EXPECT_DOUBLE_EQ(geometric_mean({2, 8}), 4.0);
  EXPECT_EQ(format_tokens(65536), "64K");
  EXPECT_EQ(format_tokens(2097152), "2M");
  EXPECT_EQ(format_tokens(3000), "3000");
}

TEST(SweepAnalysis, LongestFitIsTheLastLengthThatFitsAndSaysWhyTheNextDoesNot) {
  std::vector<SweepRow> rows = {
      row(0, 4096, 4, 1, System::kSlideDP, 10), row(0, 8192, 4, 1, System::kSlideDP, 9),
      row(0, 16384, 4, 1, System::kSlideDP, 0, false), row(0, 32768, 4, 1, System::kSlideDP, 0, false)};
  const std::vector<LongestFit> f = longest_fits(rows);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].longest_seq, 8192);
  EXPECT_DOUBLE_EQ(f[0].tokens_per_s, 9);
  EXPECT_EQ(f[0].first_failing_seq, 16384);
  EXPECT_EQ(f[0].why, "GPU memory");
}

// Compute-bound from the smallest size whose every larger swept size binds GPU compute: a compute-
// bound point below a streaming-bound one does not count.
TEST(SweepAnalysis, ComputeBoundFromIsWhereEveryLargerPointBindsCompute) {
  std::vector<SweepRow> rows;
  const std::vector<std::pair<int64_t, const char*>> binds = {
      {16, "gpu_compute"}, {32, "host_mem"}, {64, "h2d_link"}, {128, "gpu_compute"}, {256, "gpu_compute"}};
  for (const auto& [tokens, b] : binds) {
    rows.push_back(row(0, 8, 2, tokens, System::kSlideDP, static_cast<double>(tokens)));
    rows.back().predicted.bottleneck = b;
    rows.back().predicted.exposed_s = 0.25;
  }
  rows.push_back(row(0, 8, 2, 512, System::kSlideDP, 0, false));    // does not fit: ignored
  rows.push_back(row(0, 8, 2, 64, System::kMegaTrain, 5));          // a baseline: ignored
  std::vector<ComputeBound> c = compute_bound_thresholds(rows);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].from_tokens, 128);
  EXPECT_DOUBLE_EQ(c[0].tokens_per_s_from, 128);
  EXPECT_EQ(c[0].below_tokens, 64);
  EXPECT_EQ(c[0].below_binding, "h2d_link");
  EXPECT_DOUBLE_EQ(c[0].below_exposed_share, 0.25);
  EXPECT_EQ(c[0].smallest_tokens, 16);
  EXPECT_EQ(c[0].smallest_binding, "gpu_compute");
  // The largest point bound elsewhere: never.
  rows[4].predicted.bottleneck = "host_mem";
  c = compute_bound_thresholds(rows);
  EXPECT_EQ(c[0].from_tokens, 0);
  EXPECT_EQ(c[0].below_tokens, 256);
  EXPECT_EQ(c[0].below_binding, "host_mem");
}

TEST(SweepAnalysis, ScalingEfficiencyIsRelativeToTheSmallestRankCount) {
  SweepResult res;
  SweepGrid g;
  g.batch_mode = BatchMode::kSequencesPerRank;
  res.spec.grids = {g};
  res.rows = {row(0, 4096, 1, 4, System::kSlideDP, 100), row(0, 4096, 2, 4, System::kSlideDP, 196),
              row(0, 4096, 8, 4, System::kSlideDP, 760)};
  const std::vector<ScalingPoint> sp = scaling_points(res);
  ASSERT_EQ(sp.size(), 3u);
  EXPECT_TRUE(sp[0].weak);
  EXPECT_DOUBLE_EQ(sp[0].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(sp[1].efficiency, 0.98);
  EXPECT_DOUBLE_EQ(sp[2].efficiency, 0.95);
  PaperClaim c;
  c.claim = "weak";
  c.paper = "95-98%";
  c.metric = "weak_scaling_efficiency";
  res.spec.claims = {c};
  const std::vector<ClaimResult> cr = evaluate_claims(res);
  ASSERT_EQ(cr.size(), 1u);
  EXPECT_DOUBLE_EQ(cr[0].low, 0.95);
  EXPECT_DOUBLE_EQ(cr[0].high, 0.98);
}

TEST(SweepAnalysis, Fsdp2ClaimsCompareWithItsPeakAndAtEachPoint) {
  SweepResult res;
  res.spec.grids = {SweepGrid{}};
  res.rows = {row(0, 4096, 4, 1 << 18, System::kSlideDP, 90), row(0, 4096, 4, 1 << 18, System::kFsdp2, 100),
              row(0, 4096, 4, 1 << 20, System::kSlideDP, 120),
              row(0, 4096, 4, 1 << 20, System::kFsdp2, 0, false)};
  PaperClaim peak;
  peak.metric = "fsdp2_peak_excess";
  peak.min_tokens_per_step = 1 << 20;
  PaperClaim ratio;
  ratio.metric = "fsdp2_ratio";
  res.spec.claims = {peak, ratio};
  const std::vector<ClaimResult> cr = evaluate_claims(res);
  EXPECT_NEAR(cr[0].low, 0.2, 1e-12);  // 120 at 1M against FSDP2's peak of 100 (at 256K)
  EXPECT_DOUBLE_EQ(cr[1].low, 0.9);
  EXPECT_NE(cr[1].model.find("1M: FSDP2 does not fit"), std::string::npos) << cr[1].model;
}

}  // namespace
}  // namespace slidedp
