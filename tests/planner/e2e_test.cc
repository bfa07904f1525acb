// End to end on the CPU backend: plan a small model on emulated devices (the cpu-dev preset), write
// the plan file, read it back and run it with the executor; refine the top plans with measured runs
// logged to a run database; and refinement's refusal of models that do not fit this host. (Paced
// refinement on a profile of real GPUs: refine_paced_test.cc.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"
#include "runlog/run_log.h"
#include "executor/trainer.h"
#include "io/default_corpus.h"
#include "io/token_dataset.h"
#include "model/step_work.h"
#include "planner/refine.h"
#include "planner/report.h"
#include "planner/search.h"

namespace slidedp::planner {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("slidedp_planner_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

SearchSpec tiny_spec() {
  SearchSpec spec;
  spec.ranks = 2;
  spec.global_batch_tokens = 2 * 64 * 4;
  return spec;
}

TEST(PlannerEndToEnd, PlanATinyModelOnEmulatedDevicesThenRunThePlan) {
  const Workload w = make_workload(model_preset("slidedp-tiny"), 64);
  const Hardware hw = hardware_preset("cpu-dev");
  const SearchResult r = search_plans(w, hw, tiny_spec(), {});
  TempDir dir("e2e");
  const std::string path = (dir.path / "plan.yaml").string();
  write_file_atomic(path, plan_file_to_yaml(best_plan_file(r, "slidedp-tiny", "cpu-dev", 64)));

  // What slidedp-run --plan does with the file.
  const PlanFile f = load_plan_file(path);
  exec::TrainOptions o;
  o.card = load_model_card(f.model);
  o.seq_len = f.seq_len;
  o.plan = f.plan;
  o.backend = "cpu";
  o.update_threads = resolve_update_threads(f.plan, load_hardware(f.hardware));
  o.dataset = default_corpus_dataset();
  o.steps = 4;
  o.lr.lr = 3e-3;
  const exec::TrainResult t = exec::train(o);
  ASSERT_EQ(t.steps.size(), 4u);
  for (const exec::TrainStep& s : t.steps) {
    EXPECT_TRUE(std::isfinite(s.loss));
    EXPECT_EQ(s.tokens, tiny_spec().global_batch_tokens);
    EXPECT_FALSE(s.skipped);
  }
  EXPECT_LT(t.steps.back().loss, t.steps.front().loss);  // it trains
  for (int64_t hw_bytes : t.device_high_water_bytes) EXPECT_LE(hw_bytes, t.device_budget_bytes);
}

// Every plan the planner returns under a budget is accepted by the executor's up-front check under the
// same budget, and both charge it the same bytes (one memory account, model/memory_account.h). The
// budget is tight: the smallest plan's peak plus a little, so the planner must choose among plans that
// barely fit.
TEST(PlannerEndToEnd, EveryReturnedPlanPassesTheExecutorsCheckUnderTheSameBudget) {
  const Workload w = make_workload(model_preset("slidedp-tiny"), 64);
  const Hardware hw = hardware_preset("cpu-dev");
  SearchSpec spec = tiny_spec();
  spec.gpu_mem_budget_bytes = int64_t{24} << 20;
  SearchOptions so;
  so.top_k = 8;
  const SearchResult r = search_plans(w, hw, spec, so);
  ASSERT_FALSE(r.top.empty());
  for (const Candidate& c : r.top) {
    SCOPED_TRACE(c.plan.summary(static_cast<int>(w.model.num_layers)));
    exec::TrainOptions o;
    o.card = w.model;
    o.seq_len = w.seq_len;
    o.plan = c.plan;
    o.dataset = default_corpus_dataset();
    o.steps = 0;  // the up-front check only
    o.device_budget_bytes = spec.gpu_mem_budget_bytes;
    exec::TrainResult t;
    ASSERT_NO_THROW(t = exec::train(o));
    EXPECT_NEAR(c.predicted.memory.gpu_peak_bytes, t.device_account.peak_bytes, 0.01 * t.device_account.peak_bytes);
    EXPECT_LE(t.device_account.peak_bytes, static_cast<double>(spec.gpu_mem_budget_bytes));
  }
}

TEST(PlannerEndToEnd, RefineRunsTheTopPlansLogsThemAndKeepsTheMeasuredBest) {
  const Workload w = make_workload(model_preset("slidedp-tiny"), 64);
  const Hardware hw = hardware_preset("cpu-dev");
  SearchOptions so;
  so.top_k = 3;
  so.distinct_families = true;  // as slidedp-plan --refine does: measure plans that differ
  const SearchResult r = search_plans(w, hw, tiny_spec(), so);
  TempDir dir("refine");
  RefineOptions ro;
  ro.candidates = 3;
  ro.steps = 4;
  ro.warmup_steps = 1;
  ro.rounds = 2;
  ro.db_path = (dir.path / "runs.db").string();
  ro.command_line = "test";
  const RefineResult rr = refine_plans(w, hw, r, ro);
  ASSERT_EQ(rr.runs.size(), 3u);
  runlog::RunLogReader log(ro.db_path);
  // Each candidate's measured step time again, from the run log's step rows (not from refine's
  // in-memory tally): the median of the steps after each round's warm-up. The chosen plan is the one
  // with the shortest (every candidate trains the same tokens per step), and the reported Kendall
  // tau-b is that of the predicted order against these medians, computed here pair by pair.
  std::vector<double> from_log, predicted;
  for (const RefinedRun& x : rr.runs) {
    ASSERT_TRUE(x.failed.empty()) << x.failed;
    EXPECT_EQ(x.step_wall_s.size(), 8u);  // 4 steps in each of 2 rounds
    ASSERT_EQ(x.run_ids.size(), 2u);
    std::vector<double> walls;
    for (int64_t id : x.run_ids)
      for (const auto& s : log.steps(id))
        if (s.record.step > ro.warmup_steps) walls.push_back(s.record.wall_s);
    ASSERT_EQ(walls.size(), 6u);
    std::sort(walls.begin(), walls.end());
    from_log.push_back((walls[2] + walls[3]) / 2);
    predicted.push_back(x.predicted_score);
    EXPECT_NEAR(x.measured_step_s, from_log.back(), 1e-9 * from_log.back());
  }
  const auto best = std::min_element(from_log.begin(), from_log.end()) - from_log.begin();
  EXPECT_EQ(rr.chosen, best);
  double concordant_minus_discordant = 0, untied_x = 0, untied_y = 0;
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = i + 1; j < 3; ++j) {
      const double dx = predicted[i] - predicted[j], dy = from_log[i] - from_log[j];
      concordant_minus_discordant += static_cast<double>(((dx > 0) - (dx < 0)) * ((dy > 0) - (dy < 0)));
      untied_x += dx != 0, untied_y += dy != 0;
    }
  if (untied_x > 0 && untied_y > 0)
    EXPECT_NEAR(rr.kendall_tau, concordant_minus_discordant / std::sqrt(untied_x * untied_y), 1e-12);
  else
    EXPECT_TRUE(std::isnan(rr.kendall_tau));
  EXPECT_NE(render_refine(rr, 4).find("Kendall tau-b"), std::string::npos);

  // The run log: one refine run, each candidate's runs (one per round) as training runs under it,
  // every step with the prediction next to the measurement.
  const auto runs = log.list_runs();
  ASSERT_EQ(runs.size(), 7u);
  EXPECT_EQ(runs[0].kind, runlog::RunKind::kRefine);
  EXPECT_EQ(runs[0].id, rr.parent_run_id);
  EXPECT_EQ(log.run_status(rr.parent_run_id), runlog::RunState::kFinished);
  for (int i = 1; i < 7; ++i) {
    EXPECT_EQ(runs[static_cast<std::size_t>(i)].kind, runlog::RunKind::kTrain);
    EXPECT_EQ(runs[static_cast<std::size_t>(i)].parent_run_id, rr.parent_run_id);
    const auto steps = log.steps(runs[static_cast<std::size_t>(i)].id);
    ASSERT_EQ(steps.size(), 4u);
    EXPECT_TRUE(steps[0].record.predicted_step_s.has_value());
    EXPECT_FALSE(log.predictions(runs[static_cast<std::size_t>(i)].id).empty());
  }
}

TEST(PlannerEndToEnd, RefineStopsOnDataThatDoesNotFitTheModel) {
  const Workload w = make_workload(model_preset("slidedp-tiny"), 64);
  const Hardware hw = hardware_preset("cpu-dev");
  const SearchResult r = search_plans(w, hw, tiny_spec(), {});
  TempDir dir("data");
  const std::string path = (dir.path / "tokens.bin").string();
  std::vector<uint32_t> tokens(4096);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 1000);
  write_token_file(path, tokens, {}, 1000, token_dtype_for_vocab(1000));  // vocabulary 1000 > 256
  RefineOptions ro;
  ro.candidates = 2;
  ro.data_path = path;
  EXPECT_THROW(refine_plans(w, hw, r, ro), InputError);
}

TEST(PlannerEndToEnd, RefineRefusesModelsThatDoNotFitThisMachine) {
  SearchSpec spec;
  spec.ranks = 2;
  spec.global_batch_tokens = 2 * 128;
  spec.layer_counts = {0, 80};
  spec.chunk_numels = {1 << 26};
  spec.buffer_depths = {2};
  spec.update_threads = {0};
  const Workload big = make_workload(model_preset("qwen2.5-72b"), 128);
  RefineOptions ro;
  ro.candidates = 1;

  // On real GPUs the runs would be paced on this host, which cannot hold a 72B model's state either.
  const Hardware gpus = hardware_preset("h100-sxm-x8");
  const SearchResult on_gpus = search_plans(big, gpus, spec, {});
  EXPECT_THROW(refine_plans(big, gpus, on_gpus, ro), InfeasibleError);

  // An emulated-device profile of a (hypothetical) host big enough to plan a 72B model: planning
  // works, running it on this machine does not, and the error says so with both sizes.
  Hardware host = hardware_preset("cpu-dev");
  host.host.ram_bytes = host.host.pinned_limit_bytes = int64_t{8} << 40;
  const SearchResult r = search_plans(big, host, spec, {});
  try {
    refine_plans(big, host, r, ro);
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("applies to models that fit this machine"), std::string::npos) << msg;
    EXPECT_NE(msg.find("this machine has"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace slidedp::planner
