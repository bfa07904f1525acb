// The run log: schema and pragmas as created, a full round trip, the views against hand-computed
// numbers, appending, refusal of foreign and newer files naming the path, validation naming the field,
// atomic writes, pid-based run status, and a writer SIGKILLed at several moments (fork) leaving a
// database that passes integrity_check, says "did not finish" and holds every step written before;
// the patient writer (a log locked by another process past the busy timeout never stops the job).
#include "runlog/run_log.h"
#include "runlog/patient_log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/provenance.h"
#include "model/prediction.h"

namespace slidedp::runlog {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "slidedp-runlog-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// Raw SQLite access, independent of the code under test.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK) << path;
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  void exec(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }
  // SQLite's result code of `sql` (for statements that must fail).
  int status(const std::string& sql) { return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr); }
  // Rows of the query, each a vector of column texts ("NULL" for NULL).
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    std::vector<std::vector<std::string>> out;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK)
        << sql << ": " << sqlite3_errmsg(db_);
    while (s && sqlite3_step(s) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int i = 0; i < sqlite3_column_count(s); ++i) {
        const unsigned char* t = sqlite3_column_text(s, i);
        row.push_back(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
      out.push_back(row);
    }
    sqlite3_finalize(s);
    return out;
  }
  std::string one(const std::string& sql) {
    auto r = rows(sql);
    return r.empty() || r[0].empty() ? "<no row>" : r[0][0];
  }
  double number(const std::string& sql) { return std::stod(one(sql)); }

 private:
  sqlite3* db_ = nullptr;
};

template <class E, class F>
std::string expect_throw(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

RunInfo train_info() {
  RunInfo info;
  info.kind = RunKind::kTrain;
  info.command_line = "slidedp-run --plan p.yaml --steps 4";
  info.backend = "cpu";
  info.plan_yaml = "ranks: 2\nmicro_batch: 1\n";
  info.plan_summary = "2 ranks x mb 1 x acc 1 | replicated/cpu";
  info.hardware_name = "cpu-emulated";
  info.hardware_yaml = "name: cpu-emulated\n";
  info.model_name = "tiny-llama";
  info.seq_len = 64;
  info.system = "slidedp";
  info.notes_json = R"({"seed": 7})";
  return info;
}

StepRecord step_record(int64_t step, double loss, int64_t tokens, double wall_s,
                       std::optional<double> predicted) {
  StepRecord r;
  r.step = step;
  r.loss = loss;
  r.tokens = tokens;
  r.wall_s = wall_s;
  r.predicted_step_s = predicted;
  r.lr = 1e-4 * static_cast<double>(step);
  r.grad_norm = 0.5 + static_cast<double>(step);
  return r;
}

TEST(RunLog, CreatesFoldersWalSchemaAndVersion) {
  TempDir tmp;
  const std::string path = tmp / "a/b/runs.db";
  { RunLog log = RunLog::open(path); }
  ASSERT_TRUE(fs::exists(path));
  RawDb db(path);
  EXPECT_EQ(db.one("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(db.one("PRAGMA user_version"), std::to_string(kRunLogSchemaVersion));
  EXPECT_EQ(db.one("PRAGMA application_id"), std::to_string(0x5344504C));  // 'SDPL'
  auto names = db.rows(
      "SELECT type || ' ' || name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
      "AND type IN ('table', 'view') ORDER BY type, name");
  std::vector<std::string> got;
  for (auto& r : names) got.push_back(r[0]);
  const std::vector<std::string> want = {
      "table errors",          "table evals",    "table phase_totals", "table phases",  "table predictions",
      "table profile_samples", "table runs",     "table steps",        "view run_busy", "view run_summary",
      "view steady_steps",     "view step_busy", "view step_view"};
  EXPECT_EQ(got, want);
}

TEST(RunLog, EmptyFileBecomesARunLog) {
  TempDir tmp;
  const std::string path = tmp / "empty.db";
  std::ofstream(path).close();
  RunLog log = RunLog::open(path);
  EXPECT_GT(log.begin_run(train_info()), 0);
}

TEST(RunLog, RoundTripOfEveryRecord) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());

  std::vector<PhaseTotal> totals = {{1, std::nullopt, "cpu_update", 0.25, 8},
                                    {1, 0, "compute", 0.75, 12},
                                    {1, 1, "compute", 0.5, 12},
                                    {1, 0, "h2d", 0.125, 24, std::nullopt, 3.5e9}};
  std::vector<PhaseSpan> spans = {{1, 0, "compute", "forward", 3, std::nullopt, 0.0, 0.1},
                                  {1, std::nullopt, "cpu_update", "", std::nullopt, 17, 0.05, 0.3}};
  log.log_step(id, step_record(1, 2.5, 128, 1.0, 0.8), totals, spans);
  StepRecord skipped = step_record(2, std::numeric_limits<double>::infinity(), 128, 0.5, std::nullopt);
  skipped.grad_norm = std::numeric_limits<double>::quiet_NaN();
  skipped.skipped = true;
  skipped.skip_reason = "non-finite gradient in unit 3";
  log.log_step(id, skipped);
  log.log_error(id, ErrorRecord{"numeric", "NaN in unit 3 backward", 2, 1});

  Prediction p;
  p.method = "analytical";
  p.step_time_s = 0.8;
  p.breakdown.compute_s = 0.5;
  p.breakdown.stall_s = 0.2;
  p.breakdown.exposed_tail_s = 0.1;
  p.busy_s = {{resource::kGpuCompute, 0.5}, {resource::kH2D, 0.3}};
  p.bottleneck = resource::kGpuCompute;
  p.tokens_per_s = 160;
  p.exposed_s = 0.3;
  log.log_prediction(id, prediction_record(p));
  const std::vector<ProfileSample> samples = {{"pcie_h2d_gbps", R"({"bytes": 1048576})", 25.5, "GB/s"},
                                              {"pcie_h2d_gbps", R"({"bytes": 1048576})", 26.0, "GB/s"}};
  log.log_profile_samples(id, samples);

  RunLogReader reader(path);
  EXPECT_EQ(reader.run_status(id), RunState::kRunning);  // this very process wrote it and lives
  log.end_run(id, RunStatus::kFinished);
  EXPECT_EQ(reader.run_status(id), RunState::kFinished);
  EXPECT_EQ(run_status(path, id), RunState::kFinished);

  auto runs = reader.list_runs();
  ASSERT_EQ(runs.size(), 1u);
  const RunRecord& r = runs[0];
  const RunInfo in = train_info();
  EXPECT_EQ(r.id, id);
  EXPECT_EQ(r.kind, RunKind::kTrain);
  EXPECT_EQ(r.status, RunStatus::kFinished);
  EXPECT_EQ(r.pid, ::getpid());
  EXPECT_TRUE(r.pid_start_ticks.has_value());
  EXPECT_EQ(r.host, provenance().host);
  EXPECT_EQ(r.git_revision, provenance().git_revision);
  EXPECT_EQ(r.build_type, provenance().build_type);
  EXPECT_EQ(r.slidedp_version, provenance().version);
  const std::regex iso(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  EXPECT_TRUE(std::regex_match(r.started_at, iso)) << r.started_at;
  EXPECT_TRUE(std::regex_match(r.ended_at, iso)) << r.ended_at;
  EXPECT_LE(r.started_at, r.ended_at);
  EXPECT_EQ(r.last_seen_at, r.ended_at);
  EXPECT_EQ(r.command_line, in.command_line);
  EXPECT_EQ(r.backend, in.backend);
  EXPECT_EQ(r.plan_yaml, in.plan_yaml);
  EXPECT_EQ(r.plan_summary, in.plan_summary);
  EXPECT_EQ(r.hardware_name, in.hardware_name);
  EXPECT_EQ(r.hardware_yaml, in.hardware_yaml);
  EXPECT_EQ(r.model_name, in.model_name);
  EXPECT_EQ(r.seq_len, in.seq_len);
  EXPECT_EQ(r.system, in.system);
  EXPECT_EQ(r.notes_json, in.notes_json);
  EXPECT_FALSE(r.parent_run_id.has_value());

  auto steps = reader.steps(id);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].record.step, 1);
  EXPECT_EQ(steps[0].record.loss, 2.5);
  EXPECT_EQ(steps[0].record.tokens, 128);
  EXPECT_EQ(steps[0].record.wall_s, 1.0);
  EXPECT_EQ(steps[0].record.predicted_step_s, 0.8);
  EXPECT_EQ(steps[0].record.lr, 1e-4);
  EXPECT_EQ(steps[0].record.grad_norm, 1.5);
  EXPECT_FALSE(steps[0].record.skipped);
  EXPECT_EQ(steps[0].tokens_per_s, 128.0);
  EXPECT_GE(steps[0].elapsed_s, 0.0);
  EXPECT_GE(steps[1].elapsed_s, steps[0].elapsed_s);
  EXPECT_TRUE(std::isnan(steps[1].record.loss));  // Inf is stored as NULL: "not finite"
  EXPECT_FALSE(steps[1].record.grad_norm.has_value());
  EXPECT_FALSE(steps[1].record.predicted_step_s.has_value());
  EXPECT_TRUE(steps[1].record.skipped);
  EXPECT_EQ(steps[1].record.skip_reason, skipped.skip_reason);

  auto got_totals = reader.phase_totals(id);
  ASSERT_EQ(got_totals.size(), 4u);  // host first, then ranks in order, categories sorted
  EXPECT_FALSE(got_totals[0].rank.has_value());
  EXPECT_EQ(got_totals[0].category, "cpu_update");
  EXPECT_EQ(got_totals[1].rank, 0);
  EXPECT_EQ(got_totals[1].category, "compute");
  EXPECT_EQ(got_totals[1].busy_s, 0.75);
  EXPECT_EQ(got_totals[1].count, 12);
  EXPECT_FALSE(got_totals[1].bytes.has_value());  // no copies
  EXPECT_EQ(got_totals[2].category, "h2d");
  EXPECT_EQ(got_totals[2].bytes, 3.5e9);
  EXPECT_EQ(got_totals[3].rank, 1);

  auto got_spans = reader.spans(id);
  ASSERT_EQ(got_spans.size(), 2u);
  EXPECT_EQ(got_spans[0].name, "forward");
  EXPECT_EQ(got_spans[0].unit, 3);
  EXPECT_FALSE(got_spans[0].chunk.has_value());
  EXPECT_FALSE(got_spans[1].rank.has_value());
  EXPECT_EQ(got_spans[1].chunk, 17);
  EXPECT_EQ(got_spans[1].end_s, 0.3);

  auto errors = reader.errors(id);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].record.kind, "numeric");
  EXPECT_EQ(errors[0].record.step, 2);
  EXPECT_EQ(errors[0].record.rank, 1);
  EXPECT_TRUE(std::regex_match(errors[0].at, iso));

  auto preds = reader.predictions(id);
  ASSERT_EQ(preds.size(), 1u);
  EXPECT_EQ(preds[0].method, "analytical");
  EXPECT_EQ(preds[0].step_time_s, 0.8);
  EXPECT_EQ(preds[0].bottleneck, "gpu_compute");
  auto breakdown = nlohmann::json::parse(preds[0].breakdown_json);
  EXPECT_DOUBLE_EQ(breakdown["compute_s"].get<double>() + breakdown["stall_s"].get<double>() +
                       breakdown["exposed_tail_s"].get<double>(),
                   breakdown["total_s"].get<double>());
  EXPECT_EQ(nlohmann::json::parse(preds[0].busy_json)["h2d_link"].get<double>(), 0.3);

  RawDb db(path);
  EXPECT_EQ(db.one("SELECT count(*) FROM profile_samples WHERE run_id = " + std::to_string(id)), "2");
  EXPECT_EQ(db.one("SELECT avg(value) FROM profile_samples"), "25.75");
  EXPECT_EQ(db.one("SELECT json_extract(params_json, '$.bytes') FROM profile_samples LIMIT 1"), "1048576");
}

// The views, against numbers worked out by hand.
TEST(RunLog, ViewsMatchHandComputedValues) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());
  // (step, tokens, wall_s, predicted_s): step 1 is warm-up and left out of the steady-state means.
  struct S {
    int64_t step, tokens;
    double wall_s, predicted_s, compute0_s, compute1_s;
  };
  const S rows[] = {{1, 1000, 2.0, 1.0, 0.5, 0.5},
                    {2, 1000, 1.0, 0.8, 0.75, 0.5},
                    {3, 1000, 0.5, 0.8, 0.25, 0.375},
                    {4, 2000, 1.5, 0.9, 1.0, 1.25}};
  for (const S& s : rows) {
    std::vector<PhaseTotal> totals = {{s.step, 0, "compute", s.compute0_s, 4},
                                      {s.step, 1, "compute", s.compute1_s, 4},
                                      {s.step, std::nullopt, "cpu_update", 0.125, 2}};
    if (s.step == 3) totals.push_back({s.step, 0, "h2d", 0.375, 6});  // copies in one step only
    log.log_step(id,
                 step_record(s.step, 10.0 - static_cast<double>(s.step), s.tokens, s.wall_s, s.predicted_s),
                 totals);
  }
  const int64_t unfinished = log.begin_run(train_info());
  log.end_run(id, RunStatus::kFinished);

  RawDb db(path);
  const std::string where = " FROM run_summary WHERE run_id = " + std::to_string(id);
  EXPECT_EQ(db.one("SELECT outcome" + where), "finished");
  EXPECT_EQ(db.one("SELECT steps" + where), "4");
  EXPECT_EQ(db.one("SELECT last_step" + where), "4");
  EXPECT_EQ(db.number("SELECT last_loss" + where), 6.0);
  // Steady steps 2..4: 4000 tokens in 3.0 s; mean step 1.0 s; mean predicted 2.5 / 3 s.
  EXPECT_NEAR(db.number("SELECT tokens_per_s" + where), 4000.0 / 3.0, 1e-9);
  EXPECT_NEAR(db.number("SELECT mean_step_s" + where), 1.0, 1e-12);
  EXPECT_NEAR(db.number("SELECT mean_predicted_step_s" + where), 2.5 / 3.0, 1e-12);
  EXPECT_NEAR(db.number("SELECT measured_over_predicted" + where), 1.2, 1e-12);
  EXPECT_EQ(db.one("SELECT errors" + where), "0");
  EXPECT_GE(db.number("SELECT duration_s" + where), 0.0);
  // A run that never ended reads 'did not finish' in SQL (only run_status can see a live pid).
  EXPECT_EQ(db.one("SELECT outcome FROM run_summary WHERE run_id = " + std::to_string(unfinished)),
            "did not finish");
  EXPECT_EQ(db.one("SELECT steps FROM run_summary WHERE run_id = " + std::to_string(unfinished)), "0");

  // step_view: compute busy is the busiest rank's; exposed = wall - that.
  auto sv = db.rows(
      "SELECT step, compute_busy_s, exposed_s, measured_over_predicted FROM step_view WHERE run_id = " +
      std::to_string(id) + " ORDER BY step");
  ASSERT_EQ(sv.size(), 4u);
  EXPECT_EQ(std::stod(sv[1][1]), 0.75);
  EXPECT_EQ(std::stod(sv[1][2]), 0.25);
  EXPECT_EQ(std::stod(sv[2][1]), 0.375);
  EXPECT_EQ(std::stod(sv[3][2]), 0.25);
  EXPECT_NEAR(std::stod(sv[0][3]), 2.0, 1e-12);

  // run_busy over steady steps: compute max-rank (0.75 + 0.375 + 1.25) / 3, mean-rank
  // (0.625 + 0.3125 + 1.125) / 3; the host's cpu_update 0.125 with one "rank".
  const std::string rb = "FROM run_busy WHERE run_id = " + std::to_string(id);
  EXPECT_NEAR(db.number("SELECT max_rank_busy_s " + rb + " AND category = 'compute'"), 2.375 / 3, 1e-12);
  EXPECT_NEAR(db.number("SELECT mean_rank_busy_s " + rb + " AND category = 'compute'"), 2.0625 / 3, 1e-12);
  EXPECT_EQ(db.one("SELECT steps " + rb + " AND category = 'compute'"), "3");
  EXPECT_NEAR(db.number("SELECT max_rank_busy_s " + rb + " AND category = 'cpu_update'"), 0.125, 1e-15);
  // Steps 2 and 4 had no copies: they count as zero, so 0.375 s over 3 steady steps.
  EXPECT_NEAR(db.number("SELECT max_rank_busy_s " + rb + " AND category = 'h2d'"), 0.125, 1e-15);
  EXPECT_EQ(db.one("SELECT steps " + rb + " AND category = 'h2d'"), "3");
}

TEST(RunLog, ReopeningAppends) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  int64_t first = 0, second = 0;
  {
    RunLog log = RunLog::open(path);
    first = log.begin_run(train_info());
    log.log_step(first, step_record(1, 3.0, 64, 0.5, std::nullopt));
    log.end_run(first, RunStatus::kFailed);
  }
  {
    RunLog log = RunLog::open(path);
    RunInfo child = train_info();
    child.kind = RunKind::kRefine;
    child.parent_run_id = first;
    second = log.begin_run(child);
    log.log_step(second, step_record(1, 4.0, 64, 0.5, std::nullopt));
    log.end_run(second, RunStatus::kInterrupted);
  }
  RunLogReader reader(path);
  auto runs = reader.list_runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_NE(first, second);
  EXPECT_EQ(runs[0].id, first);
  EXPECT_EQ(runs[1].kind, RunKind::kRefine);
  EXPECT_EQ(runs[1].parent_run_id, first);
  EXPECT_EQ(reader.run_status(first), RunState::kFailed);
  EXPECT_EQ(reader.run_status(second), RunState::kInterrupted);
  ASSERT_EQ(reader.steps(first).size(), 1u);
  EXPECT_EQ(reader.steps(first)[0].record.loss, 3.0);
}

// Two writers on one file (as when a sweep's children share a log) interleave without "locked".
TEST(RunLog, TwoWritersShareAFile) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog a = RunLog::open(path);
  RunLog b = RunLog::open(path);
  const int64_t ra = a.begin_run(train_info());
  const int64_t rb = b.begin_run(train_info());
  for (int64_t s = 1; s <= 5; ++s) {
    a.log_step(ra, step_record(s, 1.0, 10, 0.1, std::nullopt));
    b.log_step(rb, step_record(s, 2.0, 10, 0.1, std::nullopt));
  }
  RunLogReader reader(path);
  EXPECT_EQ(reader.steps(ra).size(), 5u);
  EXPECT_EQ(reader.steps(rb).size(), 5u);
}

// Runs that start together on a new --db: every process opens it (switching a new file to WAL takes
// a lock another starting writer may hold; the switch waits for it like any write).
TEST(RunLog, WritersStartingTogetherOnANewFileAllOpenIt) {
  for (int round = 0; round < 10; ++round) {
    TempDir tmp;
    const std::string path = tmp / "runs.db";
    const std::string go = tmp / "go";
    constexpr int kWriters = 6;
    std::vector<pid_t> children;
    for (int i = 0; i < kWriters; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        while (!std::filesystem::exists(go)) std::this_thread::sleep_for(std::chrono::microseconds(50));
        try {
          RunLog log = RunLog::open(path);
          log.begin_run(train_info());
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          ::_exit(1);
        }
        ::_exit(0);
      }
      ASSERT_GT(pid, 0);
      children.push_back(pid);
    }
    std::ofstream(go).put('1');
    int failed = 0;
    for (pid_t c : children) {
      int status = 0;
      ASSERT_EQ(::waitpid(c, &status, 0), c);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    ASSERT_EQ(failed, 0) << "round " << round;
    EXPECT_EQ(RunLogReader(path).list_runs().size(), static_cast<size_t>(kWriters));
  }
}

// Multi-node runs tag phases with their node; one (step, rank, category) may repeat across nodes.
TEST(RunLog, PhasesOfSeveralNodesKeepTheirNode) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());
  std::vector<PhaseTotal> totals = {{1, 0, "compute", 0.75, 12, 0}, {1, 0, "compute", 0.5, 12, 1},
                                    {1, std::nullopt, "cpu_update", 0.25, 8, 1}};
  std::vector<PhaseSpan> spans = {{1, 0, "compute", "forward", 3, std::nullopt, 0.0, 0.1, 1}};
  log.log_step(id, step_record(1, 2.5, 128, 1.0, 0.8), totals, spans);
  RunLogReader reader(path);
  const auto back = reader.phase_totals(id);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].node, 0);
  EXPECT_EQ(back[1].node, 1);
  EXPECT_FALSE(back[1].rank.has_value());  // node 1's host row before its rank 0 (NULL sorts first)
  EXPECT_EQ(back[2].busy_s, 0.5);
  EXPECT_EQ(reader.spans(id).at(0).node, 1);
  // The same node twice is still a repeated total.
  std::vector<PhaseTotal> twice = {{2, 0, "compute", 0.5, 1, 1}, {2, 0, "compute", 0.5, 1, 1}};
  expect_throw<InputError>([&] { log.log_step(id, step_record(2, 2.5, 128, 1.0, 0.8), twice); });
  expect_throw<InputError>([&] { log.log_step(id, step_record(2, 2.5, 128, 1.0, 0.8), std::vector<PhaseTotal>{{2, 0, "compute", 0.5, 1, -1}}); });
}

// A file of schema 1 (before the node columns) is migrated when opened, its rows kept, and ends up
// with the columns and tables of a file created now.
// The busy views of files before version 5 (no bytes), as those versions created them: a test that
// makes an older file puts them back before it drops the bytes column they do not read.
constexpr const char* kSchemaFourBusyViews =
    "DROP VIEW run_busy; DROP VIEW step_busy;"
    "CREATE VIEW step_busy AS SELECT run_id, step, category, max(busy_s) AS max_rank_busy_s,"
    " avg(busy_s) AS mean_rank_busy_s, count(*) AS ranks FROM phase_totals GROUP BY run_id, step, category;"
    "CREATE VIEW run_busy AS SELECT b.run_id, b.category, sum(b.max_rank_busy_s) / n.steps AS "
    "max_rank_busy_s,"
    " sum(b.mean_rank_busy_s) / n.steps AS mean_rank_busy_s, n.steps AS steps FROM step_busy b"
    " JOIN steady_steps s ON s.run_id = b.run_id AND s.step = b.step"
    " JOIN (SELECT run_id, count(*) AS steps FROM steady_steps GROUP BY run_id) n ON n.run_id = b.run_id"
    " GROUP BY b.run_id, b.category;";

// A fresh run log and an old one to take back to an earlier schema, in one temporary folder.
struct FreshAndOld {
  TempDir tmp;
  const std::string fresh = tmp / "fresh.db", old = tmp / "old.db";
  FreshAndOld() { RunLog log = RunLog::open(fresh); }
};

TEST(RunLog, MigratesSchemaOneFiles) {
  const FreshAndOld logs;
  const std::string &fresh = logs.fresh, &old = logs.old;
  int64_t id = 0;
  {
    RunLog log = RunLog::open(old);
    id = log.begin_run(train_info());
    std::vector<PhaseTotal> totals = {{1, 0, "compute", 0.75, 12}};
    std::vector<PhaseSpan> spans = {{1, 0, "compute", "forward", 3, std::nullopt, 0.0, 0.1}};
    log.log_step(id, step_record(1, 2.5, 128, 1.0, 0.8), totals, spans);
  }
  // Back to schema 1 as it was: no node columns, the three-part key.
  RawDb(old).exec(
      std::string(kSchemaFourBusyViews) +
      "DROP INDEX phase_totals_unique; ALTER TABLE phases DROP COLUMN node; ALTER TABLE phase_totals DROP "
      "COLUMN node; ALTER TABLE phase_totals DROP COLUMN bytes; "
      "CREATE UNIQUE INDEX phase_totals_unique ON phase_totals (run_id, step, ifnull(rank, -1), category); "
      "DROP TABLE evals; PRAGMA user_version = 1;");
  ASSERT_EQ(RawDb(old).one("PRAGMA user_version"), "1");
  {
    RunLog log = RunLog::open(old);
    std::vector<PhaseTotal> totals = {{2, 0, "compute", 0.5, 12, 0}, {2, 0, "compute", 0.25, 12, 1}};
    log.log_step(id, step_record(2, 2.4, 128, 1.0, 0.8), totals);
  }
  EXPECT_EQ(RawDb(old).one("PRAGMA user_version"), std::to_string(kRunLogSchemaVersion));
  for (const char* table : {"phases", "phase_totals", "evals"})
    EXPECT_EQ(RawDb(old).rows(std::string("SELECT name FROM pragma_table_info('") + table + "')"),
              RawDb(fresh).rows(std::string("SELECT name FROM pragma_table_info('") + table + "')"))
        << table;
  EXPECT_EQ(RawDb(old).one("SELECT sql FROM sqlite_master WHERE name = 'phase_totals_unique'"),
            RawDb(fresh).one("SELECT sql FROM sqlite_master WHERE name = 'phase_totals_unique'"));
  const auto totals = RunLogReader(old).phase_totals(id);
  ASSERT_EQ(totals.size(), 3u);
  EXPECT_FALSE(totals[0].node.has_value());  // step 1's row, from before the migration
  EXPECT_EQ(totals[2].node, 1);
  EXPECT_EQ(RunLogReader(old).integrity_check(), "ok");
}

// Version 2 had no evaluations' table: opening one adds it exactly as a new file defines it, and the
// steps already logged stay.
TEST(RunLog, MigratesSchemaTwoFilesAndLogsEvaluations) {
  const FreshAndOld logs;
  const std::string &fresh = logs.fresh, &old = logs.old;
  int64_t id = 0;
  {
    RunLog log = RunLog::open(old);
    id = log.begin_run(train_info());
    log.log_step(id, step_record(1, 2.5, 128, 1.0, 0.8));
  }
  RawDb(old).exec(std::string(kSchemaFourBusyViews) +
                  "DROP TABLE evals; ALTER TABLE phase_totals DROP COLUMN bytes; PRAGMA user_version = 2;");
  {
    RunLog log = RunLog::open(old);
    EvalRecord e;
    e.step = 1;
    e.loss = 2.25;
    e.tokens = 512;
    e.wait_s = 0.5;
    e.data = "held_out.tok";
    log.log_eval(id, e);
    // One evaluation per step; bad fields are named.
    EXPECT_TRUE(contains(expect_throw<InputError>([&] { log.log_eval(id, e); }), "already logged"));
    e.step = -1;
    EXPECT_TRUE(contains(expect_throw<InputError>([&] { log.log_eval(id, e); }), "evals[step -1].step"));
    e.step = 2;
    e.loss = std::numeric_limits<double>::quiet_NaN();
    log.log_eval(id, e);
  }
  EXPECT_EQ(RawDb(old).one("PRAGMA user_version"), std::to_string(kRunLogSchemaVersion));
  EXPECT_EQ(RawDb(old).one("SELECT sql FROM sqlite_master WHERE name = 'evals'"),
            RawDb(fresh).one("SELECT sql FROM sqlite_master WHERE name = 'evals'"));
  EXPECT_DOUBLE_EQ(RawDb(old).number("SELECT perplexity FROM evals WHERE step = 1"), std::exp(2.25));
  const auto evals = RunLogReader(old).evals(id);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0].loss, 2.25);
  EXPECT_EQ(evals[0].tokens, 512);
  EXPECT_EQ(evals[0].data, "held_out.tok");
  EXPECT_TRUE(std::isnan(evals[1].loss));  // stored as NULL
  EXPECT_EQ(RunLogReader(old).steps(id).size(), 1u);
  EXPECT_EQ(RunLogReader(old).integrity_check(), "ok");
}

// Version 3 had no copied bytes in the phase totals: opening one appends the column as a new file
// defines it; the rows before have none (NULL), the rows after keep theirs.
TEST(RunLog, MigratesSchemaThreeFilesAndLogsCopiedBytes) {
  const FreshAndOld logs;
  const std::string &fresh = logs.fresh, &old = logs.old;
  int64_t id = 0;
  {
    RunLog log = RunLog::open(old);
    id = log.begin_run(train_info());
    const std::vector<PhaseTotal> totals = {{1, 0, "h2d", 0.5, 4}};
    log.log_step(id, step_record(1, 2.5, 128, 1.0, 0.8), totals);
  }
  RawDb(old).exec(std::string(kSchemaFourBusyViews) +
                  "ALTER TABLE phase_totals DROP COLUMN bytes; PRAGMA user_version = 3;");
  {
    RunLog log = RunLog::open(old);
    const std::vector<PhaseTotal> totals = {{2, 0, "h2d", 0.5, 4, std::nullopt, 1.25e6}};
    log.log_step(id, step_record(2, 2.4, 128, 1.0, 0.8), totals);
  }
  EXPECT_EQ(RawDb(old).one("PRAGMA user_version"), std::to_string(kRunLogSchemaVersion));
  EXPECT_EQ(RawDb(old).rows("SELECT name || ' ' || type FROM pragma_table_info('phase_totals')"),
            RawDb(fresh).rows("SELECT name || ' ' || type FROM pragma_table_info('phase_totals')"));
  const auto totals = RunLogReader(old).phase_totals(id);
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_FALSE(totals[0].bytes.has_value());
  EXPECT_EQ(totals[1].bytes, 1.25e6);
  EXPECT_EQ(RunLogReader(old).integrity_check(), "ok");
  // The migrated column keeps the fresh file's check.
  EXPECT_EQ(RawDb(old).status("INSERT INTO phase_totals (run_id, step, rank, category, busy_s, count, bytes) "
                              "VALUES (" +
                              std::to_string(id) + ", 3, 0, 'h2d', 0.5, 4, -1)"),
            SQLITE_CONSTRAINT);
}

TEST(RunLog, MigratesSchemaFourFilesAndShowsBytesInTheBusyViews) {
  const FreshAndOld logs;
  const std::string &fresh = logs.fresh, &old = logs.old;
  int64_t id = 0;
  {
    RunLog log = RunLog::open(old);
    id = log.begin_run(train_info());
    // Two ranks' gradient copies; step 3's rank 1 row has no bytes (it must not dilute the rate);
    // step 4 copies nothing (zero bytes in the run's mean, no rate).
    const std::vector<std::vector<PhaseTotal>> steps = {
        {{1, 0, "d2h", 0.5, 4, std::nullopt, 1e9}, {1, 1, "d2h", 0.25, 4, std::nullopt, 3e8}},
        {{2, 0, "d2h", 0.5, 4, std::nullopt, 1e9}, {2, 1, "d2h", 0.25, 4, std::nullopt, 3e8}},
        {{3, 0, "d2h", 1.0, 4, std::nullopt, 2e9}, {3, 1, "d2h", 0.25, 4}},
        {{4, 0, "compute", 1.0, 4}}};
    for (const auto& totals : steps)
      log.log_step(id, step_record(totals[0].step, 2.0, 128, 1.0, 0.8), totals);
  }
  RawDb(old).exec(std::string(kSchemaFourBusyViews) + "PRAGMA user_version = 4;");
  { RunLogReader reader(old); }  // opening migrates
  RawDb db(old);
  EXPECT_EQ(db.one("PRAGMA user_version"), std::to_string(kRunLogSchemaVersion));
  const std::string views = "SELECT name || ': ' || sql FROM sqlite_master WHERE type = 'view' ORDER BY name";
  EXPECT_EQ(db.rows(views), RawDb(fresh).rows(views));
  // By hand: step 2 moved 1e9 + 3e8 bytes in 0.5 + 0.25 s; step 3 2e9 in rank 0's 1.0 s.
  const std::string sb =
      " FROM step_busy WHERE run_id = " + std::to_string(id) + " AND category = 'd2h' AND step = ";
  EXPECT_EQ(db.number("SELECT bytes" + sb + "2"), 1.3e9);
  EXPECT_EQ(db.number("SELECT max_rank_bytes" + sb + "2"), 1e9);
  EXPECT_NEAR(db.number("SELECT busy_gbps" + sb + "2"), 1.3 / 0.75, 1e-12);
  EXPECT_EQ(db.number("SELECT bytes" + sb + "3"), 2e9);
  EXPECT_NEAR(db.number("SELECT busy_gbps" + sb + "3"), 2.0, 1e-12);
  // Over steady steps 2..4: (1.3e9 + 2e9 + 0) / 3 bytes a step, max rank (1e9 + 2e9) / 3, and
  // 3.3e9 bytes in 1.75 busy seconds with bytes.
  const std::string rb = " FROM run_busy WHERE run_id = " + std::to_string(id) + " AND category = ";
  EXPECT_NEAR(db.number("SELECT bytes" + rb + "'d2h'"), 1.1e9, 1e-3);
  EXPECT_NEAR(db.number("SELECT max_rank_bytes" + rb + "'d2h'"), 1e9, 1e-3);
  EXPECT_NEAR(db.number("SELECT busy_gbps" + rb + "'d2h'"), 3.3 / 1.75, 1e-12);
  EXPECT_EQ(db.one("SELECT ifnull(bytes, 'NULL') || ifnull(busy_gbps, 'NULL')" + rb + "'compute'"),
            "NULLNULL");
  EXPECT_EQ(RunLogReader(old).integrity_check(), "ok");
}

TEST(RunLog, RefusesNewerAndUnknownSchemaVersions) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  { RunLog log = RunLog::open(path); }
  RawDb(path).exec("PRAGMA user_version = " + std::to_string(kRunLogSchemaVersion + 1));
  std::string what = expect_throw<IoError>([&] { RunLog::open(path); });
  EXPECT_TRUE(contains(what, path)) << what;
  EXPECT_TRUE(contains(what, "newer")) << what;
  what = expect_throw<IoError>([&] { RunLogReader reader(path); });
  EXPECT_TRUE(contains(what, "newer")) << what;

  RawDb(path).exec("PRAGMA user_version = 0");
  what = expect_throw<IoError>([&] { RunLog::open(path); });
  EXPECT_TRUE(contains(what, "unknown run log schema version 0")) << what;
}

TEST(RunLog, RefusesFilesThatAreNotRunLogs) {
  TempDir tmp;
  const std::string text = tmp / "notes.txt";
  std::ofstream(text) << "this is not a database, but it is long enough to have a header page......\n";
  std::string what = expect_throw<IoError>([&] { RunLog::open(text); });
  EXPECT_TRUE(contains(what, text)) << what;
  EXPECT_TRUE(contains(what, "not an SQLite database")) << what;
  what = expect_throw<IoError>([&] { RunLogReader reader(text); });
  EXPECT_TRUE(contains(what, text)) << what;

  const std::string other = tmp / "other.db";
  {
    sqlite3* db = nullptr;
    sqlite3_open(other.c_str(), &db);
    sqlite3_exec(db, "CREATE TABLE t (x)", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  what = expect_throw<IoError>([&] { RunLog::open(other); });
  EXPECT_TRUE(contains(what, other)) << what;
  EXPECT_TRUE(contains(what, "not a SlideDP run log")) << what;
  EXPECT_EQ(RawDb(other).one("SELECT count(*) FROM sqlite_master"), "1");  // left untouched

  const std::string missing = tmp / "missing.db";
  what = expect_throw<IoError>([&] { RunLogReader reader(missing); });
  EXPECT_TRUE(contains(what, missing)) << what;
  EXPECT_FALSE(fs::exists(missing)) << "a reader must never create a log";
}

TEST(RunLog, UnwritablePathsNameThePath) {
  TempDir tmp;
  const std::string file = tmp / "plain.txt";
  std::ofstream(file) << "x";
  const std::string under_file = file + "/sub/runs.db";  // a folder cannot be created inside a file
  std::string what = expect_throw<IoError>([&] { RunLog::open(under_file); });
  EXPECT_TRUE(contains(what, under_file)) << what;

  const std::string folder = tmp / "a-folder";
  fs::create_directories(folder);
  what = expect_throw<IoError>([&] { RunLog::open(folder); });
  EXPECT_TRUE(contains(what, folder)) << what;

  // procfs accepts no new files, even for root (tests may run as root, which ignores permissions).
  const std::string proc = "/proc/slidedp-runlog-test.db";
  what = expect_throw<IoError>([&] { RunLog::open(proc); });
  EXPECT_TRUE(contains(what, proc)) << what;
}

TEST(RunLog, ValidationNamesTheField) {
  TempDir tmp;
  RunLog log = RunLog::open(tmp / "runs.db");
  const int64_t id = log.begin_run(train_info());
  auto field_error = [&](auto&& f, const std::string& field) {
    std::string what = expect_throw<InputError>(f);
    EXPECT_TRUE(contains(what, field)) << "expected " << field << " in: " << what;
    EXPECT_TRUE(contains(what, "runs.db")) << what;
  };
  StepRecord bad = step_record(1, 1.0, 10, std::nan(""), std::nullopt);
  field_error([&] { log.log_step(id, bad); }, "wall_s");
  bad = step_record(0, 1.0, 10, 1.0, std::nullopt);
  field_error([&] { log.log_step(id, bad); }, "step");
  bad = step_record(1, 1.0, -1, 1.0, std::nullopt);
  field_error([&] { log.log_step(id, bad); }, "tokens");
  bad = step_record(1, 1.0, 10, 1.0, 0.0);
  field_error([&] { log.log_step(id, bad); }, "predicted_step_s");
  bad = step_record(1, 1.0, 10, 1.0, std::nullopt);
  bad.lr = -1;
  field_error([&] { log.log_step(id, bad); }, "lr");
  bad.lr = 1e-4;
  bad.skipped = true;
  field_error([&] { log.log_step(id, bad); }, "skip_reason");
  const StepRecord ok = step_record(1, 1.0, 10, 1.0, std::nullopt);
  field_error([&] { log.log_step(id + 99, ok); }, "no run with id " + std::to_string(id + 99));
  log.log_step(id, ok);
  field_error([&] { log.log_step(id, ok); }, "already logged");

  const PhaseTotal bad_category[] = {{2, 0, "H2D", 0.1, 1}};
  field_error([&] { log.log_phase_totals(id, bad_category); }, "category");
  const PhaseTotal negative_busy[] = {{2, 0, "h2d", -0.1, 1}};
  field_error([&] { log.log_phase_totals(id, negative_busy); }, "busy_s");
  const PhaseTotal negative_bytes[] = {{2, 0, "h2d", 0.1, 1, std::nullopt, -1.0}};
  field_error([&] { log.log_phase_totals(id, negative_bytes); }, "bytes");
  const PhaseTotal nan_bytes[] = {
      {2, 0, "h2d", 0.1, 1, std::nullopt, std::numeric_limits<double>::quiet_NaN()}};
  field_error([&] { log.log_phase_totals(id, nan_bytes); }, "bytes");
  const PhaseSpan backwards[] = {{2, 0, "h2d", "", std::nullopt, std::nullopt, 0.5, 0.25}};
  field_error([&] { log.log_spans(id, backwards); }, "end_s");
  const PhaseTotal other_step[] = {{3, 0, "h2d", 0.1, 1}};
  field_error([&] { log.log_step(id, step_record(2, 1.0, 10, 1.0, std::nullopt), other_step); }, "step");

  RunInfo info = train_info();
  info.notes_json = "{not json";
  field_error([&] { log.begin_run(info); }, "notes_json");
  info = train_info();
  info.seq_len = -1;
  field_error([&] { log.begin_run(info); }, "seq_len");
  field_error([&] { log.log_error(id, ErrorRecord{"", "x", std::nullopt, std::nullopt}); }, "errors.kind");
  field_error(
      [&] {
        log.log_prediction(id, PredictionRecord{"analytical", -1.0, {}, {}, "x", "{}", "{}"});
      },
      "step_time_s");
  const ProfileSample no_unit[] = {{"pcie_h2d_gbps", "{}", 25.0, ""}};
  field_error([&] { log.log_profile_samples(id, no_unit); }, "unit");
  field_error([&] { log.end_run(id, RunStatus::kRunning); }, "status");
  log.end_run(id, RunStatus::kFinished);
  field_error([&] { log.end_run(id, RunStatus::kFailed); }, "already ended as 'finished'");
  field_error([&] { RunLogReader(tmp / "runs.db").run_status(id + 99); }, "no run with id");
}

// A failed write leaves nothing behind: the step and its totals go in together or not at all.
TEST(RunLog, FailedWritesWriteNothing) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());
  // The second total is invalid; it is checked after the step row was inserted.
  const PhaseTotal totals[] = {{1, 0, "compute", 0.5, 1}, {1, 0, "bad category", 0.5, 1}};
  EXPECT_THROW(log.log_step(id, step_record(1, 1.0, 10, 1.0, std::nullopt), totals), InputError);
  // A duplicate (step, rank, category) is caught by the database in the middle of the batch.
  const PhaseTotal dup[] = {{1, std::nullopt, "cpu_update", 0.5, 1}, {1, std::nullopt, "cpu_update", 0.5, 1}};
  EXPECT_THROW(log.log_phase_totals(id, dup), InputError);
  RunLogReader reader(path);
  EXPECT_TRUE(reader.steps(id).empty());
  EXPECT_TRUE(reader.phase_totals(id).empty());
  // The connection is usable afterwards.
  log.log_step(id, step_record(1, 1.0, 10, 1.0, std::nullopt), std::span(totals, 1));
  EXPECT_EQ(reader.steps(id).size(), 1u);
  EXPECT_EQ(reader.phase_totals(id).size(), 1u);
}

// 'running' is believed only while the recorded process is alive: same host, boot, pid, start time.
TEST(RunLog, RunStatusChecksTheRecordedProcess) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());
  RunLogReader reader(path);
  RawDb db(path);
  const std::string row = " WHERE id = " + std::to_string(id);
  EXPECT_EQ(reader.run_status(id), RunState::kRunning);

  db.exec("UPDATE runs SET pid_start_ticks = pid_start_ticks + 1" + row);  // the pid was recycled
  EXPECT_EQ(reader.run_status(id), RunState::kDidNotFinish);
  db.exec("UPDATE runs SET pid_start_ticks = pid_start_ticks - 1" + row);
  EXPECT_EQ(reader.run_status(id), RunState::kRunning);

  db.exec("UPDATE runs SET boot_id = 'another-boot'" + row);  // written before a reboot
  EXPECT_EQ(reader.run_status(id), RunState::kDidNotFinish);
  db.exec("UPDATE runs SET boot_id = NULL, host = 'another-host'" + row);
  EXPECT_EQ(reader.run_status(id), RunState::kDidNotFinish);

  pid_t child = ::fork();  // a pid that existed and is gone
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  db.exec("UPDATE runs SET host = '" + provenance().host + "', pid = " + std::to_string(child) + row);
  EXPECT_EQ(reader.run_status(id), RunState::kDidNotFinish);
  EXPECT_STREQ(run_state_name(reader.run_status(id)), "did not finish");
}

// ---------------------------------------------------------------------------------------------------
// SIGKILL at any moment.

// The values a step of the killed writer carries, so the parent can check each row it finds.
double killed_loss(int64_t step) { return 10.0 / static_cast<double>(step); }
double killed_busy(int64_t step, int rank) { return 0.001 * static_cast<double>(step) + rank; }

[[noreturn]] void killed_writer(const std::string& path) {
  try {
    RunLog log = RunLog::open(path);
    const int64_t id = log.begin_run(train_info());
    for (int64_t step = 1;; ++step) {
      const PhaseTotal totals[] = {{step, 0, "compute", killed_busy(step, 0), 3},
                                   {step, 1, "compute", killed_busy(step, 1), 3},
                                   {step, std::nullopt, "cpu_update", killed_busy(step, 2), 1}};
      const PhaseSpan spans[] = {{step, 0, "compute", "forward", 0, std::nullopt, 0.0, 0.01}};
      log.log_step(id, step_record(step, killed_loss(step), 256, 0.01, 0.01), totals, spans);
    }
  } catch (...) {
    ::_exit(3);
  }
}

// Kills a writer after `delay` (0: as soon as it is forked) or, with min_steps > 0, once that many
// steps are readable; then checks the database.
void kill_writer_and_check(const std::string& path, std::chrono::microseconds delay, int64_t min_steps) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) killed_writer(path);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  if (min_steps > 0) {
    bool reached = false;
    while (!reached && std::chrono::steady_clock::now() < deadline) {
      try {
        RunLogReader reader(path);
        auto runs = reader.list_runs();
        reached = !runs.empty() && static_cast<int64_t>(reader.steps(runs[0].id).size()) >= min_steps;
      } catch (const IoError&) {
        // Not created yet, or the schema transaction is still open.
      }
      if (!reached) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_TRUE(reached) << "the writer never logged " << min_steps << " steps";
  } else {
    std::this_thread::sleep_for(delay);
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the writer exited on its own: " << status;

  // Whatever the moment, the file opens as a run log (the writer creates the schema if the kill came
  // before it existed) and is consistent.
  { RunLog reopened = RunLog::open(path); }
  RunLogReader reader(path);
  EXPECT_EQ(reader.integrity_check(), "ok");
  auto runs = reader.list_runs();
  ASSERT_LE(runs.size(), 1u);
  if (runs.empty()) return;  // killed before begin_run committed
  const RunRecord& run = runs[0];
  EXPECT_EQ(run.status, RunStatus::kRunning);
  EXPECT_TRUE(run.ended_at.empty());
  EXPECT_EQ(run.pid, child);
  EXPECT_EQ(reader.run_status(run.id), RunState::kDidNotFinish);
  RawDb db(path);
  EXPECT_EQ(db.one("SELECT outcome FROM run_summary"), "did not finish");

  auto steps = reader.steps(run.id);
  EXPECT_GE(static_cast<int64_t>(steps.size()), min_steps);
  auto totals = reader.phase_totals(run.id);
  ASSERT_EQ(totals.size(), 3 * steps.size()) << "a step without its totals: the transaction was split";
  EXPECT_EQ(reader.spans(run.id).size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    ASSERT_EQ(steps[i].record.step, step) << "steps are contiguous from 1";
    EXPECT_EQ(steps[i].record.loss, killed_loss(step));
    EXPECT_EQ(totals[3 * i].category, "cpu_update");  // host first
    EXPECT_EQ(totals[3 * i].busy_s, killed_busy(step, 2));
    EXPECT_EQ(totals[3 * i + 1].busy_s, killed_busy(step, 0));
    EXPECT_EQ(totals[3 * i + 2].busy_s, killed_busy(step, 1));
  }
}

TEST(RunLogKill, KilledWhileStarting) {
  TempDir tmp;
  kill_writer_and_check(tmp / "runs.db", std::chrono::microseconds(0), 0);
}

TEST(RunLogKill, KilledAfterAFewMilliseconds) {
  for (int us : {500, 2000, 5000}) {
    TempDir tmp;
    kill_writer_and_check(tmp / "runs.db", std::chrono::microseconds(us), 0);
  }
}

TEST(RunLogKill, KilledMidRunKeepsEveryLoggedStep) {
  for (int64_t steps : {1, 13, 60}) {
    TempDir tmp;
    kill_writer_and_check(tmp / "sub/runs.db", std::chrono::microseconds(0), steps);
  }
}

// A second writer appends to a log whose last writer was killed, and the dead run stays dead.
TEST(RunLogKill, AppendAfterAKill) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  kill_writer_and_check(path, std::chrono::microseconds(0), 5);
  RunLog log = RunLog::open(path);
  const int64_t id = log.begin_run(train_info());
  log.log_step(id, step_record(1, 1.0, 10, 1.0, std::nullopt));
  log.end_run(id, RunStatus::kFinished);
  RunLogReader reader(path);
  auto runs = reader.list_runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(reader.run_status(runs[0].id), RunState::kDidNotFinish);
  EXPECT_EQ(reader.run_status(id), RunState::kFinished);
  EXPECT_EQ(reader.integrity_check(), "ok");
}


// ---- A locked log never stops the job (runlog/patient_log.h) ----------------------------------------

// Another process holding the write lock (BEGIN IMMEDIATE, as every writer takes it) past the busy
// timeout: plain RunLog writes fail with LogLocked (what stopped training before the queue); through
// the PatientLog every write is accepted, none is lost, and they commit in order once the lock goes.
TEST(PatientLog, WritesWaitOutALockInOrderAndNoneIsLost) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path, /*busy_timeout_ms=*/50);
  const int64_t run = log.begin_run(train_info());
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");
  // The failure the queue exists for.
  expect_throw<LogLocked>([&] { log.log_step(run, step_record(1, 1.0, 10, 0.1, std::nullopt)); });

  std::vector<std::string> warnings;
  std::mutex warnings_mutex;
  PatientLog patient(log, 64, [&](const std::string& w) {
    std::lock_guard<std::mutex> lock(warnings_mutex);
    warnings.push_back(w);
  });
  for (int64_t s = 1; s <= 5; ++s) {
    const StepRecord r = step_record(s, 1.0 / static_cast<double>(s), 10, 0.1, std::nullopt);
    EXPECT_NO_THROW(patient.submit([run, r](RunLog& l) { l.log_step(run, r); })) << "step " << s;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several retries, all locked out
  EXPECT_EQ(holder.one("SELECT count(*) FROM steps"), "0");
  holder.exec("COMMIT");
  const PatientLog::Outcome o = patient.flush(std::chrono::seconds(20));
  EXPECT_EQ(o.uncommitted, 0u);
  EXPECT_EQ(o.dropped, 0u);
  log.end_run(run, RunStatus::kFinished);  // the log is the caller's again after flush
  RunLogReader reader(path);
  const std::vector<StepRow> steps = reader.steps(run);
  ASSERT_EQ(steps.size(), 5u);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].record.step, static_cast<int64_t>(i + 1));
    EXPECT_DOUBLE_EQ(steps[i].record.loss, 1.0 / static_cast<double>(i + 1));
  }
  // In commit order too: rowids rise with the step.
  EXPECT_EQ(holder.one("SELECT count(*) FROM steps a JOIN steps b ON a.rowid < b.rowid WHERE a.step > b.step"), "0");
  std::lock_guard<std::mutex> lock(warnings_mutex);
  ASSERT_EQ(warnings.size(), 2u);  // one when the stall began, one when it ended
  EXPECT_TRUE(contains(warnings[0], path) && contains(warnings[0], "locked")) << warnings[0];
}

// A write that does not wait: with the log free, submit() has committed when it returns (the step row
// is in before the job goes on to publish the step's checkpoint).
TEST(PatientLog, AFreeLogIsWrittenBeforeSubmitReturns) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path);
  const int64_t run = log.begin_run(train_info());
  PatientLog patient(log, 64, [](const std::string& w) { ADD_FAILURE() << "unexpected warning: " << w; });
  RawDb raw(path);
  for (int64_t s = 1; s <= 3; ++s) {
    const StepRecord r = step_record(s, 1.0, 10, 0.1, std::nullopt);
    patient.submit([run, r](RunLog& l) { l.log_step(run, r); });
    EXPECT_EQ(raw.one("SELECT count(*) FROM steps"), std::to_string(s));
  }
  EXPECT_EQ(patient.flush(std::chrono::seconds(1)).uncommitted, 0u);
}

// The bound: a lock that outlasts the job's patience leaves its writes counted, not silently lost,
// and a queue that is full counts what it dropped; memory does not grow with the stall.
TEST(PatientLog, ALockThatOutlastsThePatienceIsReported) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path, /*busy_timeout_ms=*/20);
  const int64_t run = log.begin_run(train_info());
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");
  PatientLog patient(log, /*max_queued=*/3, [](const std::string&) {});
  for (int64_t s = 1; s <= 5; ++s) {
    const StepRecord r = step_record(s, 1.0, 10, 0.1, std::nullopt);
    patient.submit([run, r](RunLog& l) { l.log_step(run, r); });
  }
  const PatientLog::Outcome o = patient.flush(std::chrono::milliseconds(100));
  EXPECT_EQ(o.uncommitted, 3u);
  EXPECT_EQ(o.dropped, 2u);
  holder.exec("COMMIT");
  EXPECT_EQ(holder.one("SELECT count(*) FROM steps"), "0");
}

// Failures other than a lock are not retried: the job hears of them at its next call, as it would
// have from the RunLog call itself.
TEST(PatientLog, OtherFailuresReachTheCaller) {
  TempDir tmp;
  const std::string path = tmp / "runs.db";
  RunLog log = RunLog::open(path, /*busy_timeout_ms=*/20);
  const int64_t run = log.begin_run(train_info());
  PatientLog patient(log, 64, [](const std::string&) {});
  patient.submit([run](RunLog& l) { l.log_step(run, step_record(1, 1.0, 10, 0.1, std::nullopt)); });
  // Directly: a repeated step is the caller's bad value.
  EXPECT_TRUE(contains(expect_throw<InputError>([&] {
                         patient.submit([run](RunLog& l) { l.log_step(run, step_record(1, 1.0, 10, 0.1, std::nullopt)); });
                       }),
                       "already logged"));
  // Behind a lock: queued, retried once the lock goes, and its failure reaches flush().
  RawDb holder(path);
  holder.exec("BEGIN IMMEDIATE");
  patient.submit([run](RunLog& l) { l.log_step(run, step_record(2, 1.0, 10, 0.1, std::nullopt)); });
  patient.submit([run](RunLog& l) { l.log_step(run, step_record(2, 1.0, 10, 0.1, std::nullopt)); });
  holder.exec("COMMIT");
  EXPECT_TRUE(contains(expect_throw<InputError>([&] { patient.flush(std::chrono::seconds(20)); }), "already logged"));
}

}  // namespace
}  // namespace slidedp::runlog
