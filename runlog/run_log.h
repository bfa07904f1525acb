// The SQLite run log (docs/RUN_LOG.md): every run, its steps, per-step busy time per resource, sampled
// spans, errors, the model's prediction and the profiler's samples. This module owns the schema
// (runlog/run_log_schema.sql, embedded); RunLog writes, RunLogReader reads. The file is in WAL mode
// and each write is one transaction, so a run SIGKILLed at any moment leaves a database that opens,
// with the run still 'running' and its pid dead: run_status() then says "did not finish".
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace slidedp {
struct Prediction;
}

namespace slidedp::runlog {

// The schema version this build writes and reads (PRAGMA user_version). An older file is migrated
// when opened (runlog/open_log.cc); a newer or unknown one is refused with an IoError naming it.
inline constexpr int kRunLogSchemaVersion = 5;
// PRAGMA application_id of a run log: 'SDPL'. Tells a run log from any other SQLite file.
inline constexpr int32_t kRunLogApplicationId = 0x5344504C;

enum class RunKind { kTrain, kProfile, kRefine, kSweep };
// What the run itself recorded. kRunning is also what a killed run leaves behind.
enum class RunStatus { kRunning, kFinished, kFailed, kInterrupted };
// What a reader concludes: the recorded status, except that a 'running' row whose process is gone
// (killed, crashed, or on another host or boot) is kDidNotFinish.
enum class RunState { kRunning, kFinished, kFailed, kInterrupted, kDidNotFinish };

const char* run_kind_name(RunKind k);      // "train" | "profile" | "refine" | "sweep"
const char* run_status_name(RunStatus s);  // "running" | "finished" | "failed" | "interrupted"
const char* run_state_name(RunState s);    // the status names, or "did not finish"
RunKind parse_run_kind(const std::string& s, const std::string& where);      // throws InputError
RunStatus parse_run_status(const std::string& s, const std::string& where);  // throws InputError

// Phase categories the executor uses (phases.category, phase_totals.category). Others are allowed if
// they are lowercase identifiers; these map onto the model's resources (model/prediction.h) as
// compute -> gpu_compute, h2d -> h2d_link, d2h -> d2h_link, fabric -> gpu_fabric, and cpu_reduce +
// cpu_update -> cpu_update.
namespace phase_category {
inline constexpr const char* kCompute = "compute";       // forward, backward, recompute on a device
inline constexpr const char* kH2D = "h2d";               // host-to-device copies
inline constexpr const char* kD2H = "d2h";               // device-to-host copies
inline constexpr const char* kFabric = "fabric";         // collectives among devices
inline constexpr const char* kCpuReduce = "cpu_reduce";  // summing the ranks' gradient slots on the CPU
inline constexpr const char* kCpuUpdate = "cpu_update";  // AdamW on the CPU
}  // namespace phase_category

// What the caller knows when a run begins. pid, host, git revision, build type, version and the
// start time are filled in by begin_run.
struct RunInfo {
  RunKind kind = RunKind::kTrain;
  std::optional<int64_t> parent_run_id;  // the refine/sweep run that started this one
  std::string command_line;
  std::string backend;            // "cpu" | "cuda" | "" (none)
  std::string plan_yaml;          // "" = none
  std::string plan_summary;       // Plan::summary(); "" = none
  std::string hardware_name;      // "" = none
  std::string hardware_yaml;      // "" = none
  std::string model_name;         // "" = none
  int64_t seq_len = 0;            // T; 0 = not applicable
  std::string system;             // "slidedp" or a baseline preset; "" = none
  std::string notes_json = "{}";  // any JSON value; validated
};

// One optimizer step. The loss may be NaN or Inf (stored as NULL: a skipped step's loss often is).
struct StepRecord {
  int64_t step = 0;  // 1-based optimizer step since the start of training
  double loss = std::numeric_limits<double>::quiet_NaN();
  int64_t tokens = 0;                      // tokens processed, all ranks and micro-steps
  double wall_s = 0;                       // measured step time
  std::optional<double> predicted_step_s;  // the model's step time for this plan
  double lr = 0;
  std::optional<double> grad_norm;  // global norm before clipping; nullopt when not computed
  bool skipped = false;             // true: the optimizer state was left untouched
  std::string skip_reason;          // required when skipped, empty otherwise
};

// One evaluation on held-out data after optimizer step `step` (slidedp-run --eval-data).
struct EvalRecord {
  int64_t step = 0;                                        // as StepRecord::step; 0: the starting weights
  double loss = std::numeric_limits<double>::quiet_NaN();  // mean token loss (NaN/Inf stored as NULL)
  int64_t tokens = 0;                                      // targets that counted
  double wait_s = 0;  // the trainer's wait for it after the step was done
  std::string data;   // the held-out token file
};

// Busy time of one category on one rank (nullopt: host) in one step: the union of its spans.
struct PhaseTotal {
  int64_t step = 0;
  std::optional<int> rank;
  std::string category;
  double busy_s = 0;
  int64_t count = 0;  // spans
  std::optional<int> node;  // multi-node runs: whose (ranks are numbered within their node)
  // Copies' bytes over the host link (the sum of the spans' MeasuredSpan::bytes) for the categories
  // "h2d" and "d2h"; nullopt for other work, and in a log written before schema 4.
  std::optional<double> bytes;
};

// One sampled span; times in seconds from the start of its step.
struct PhaseSpan {
  int64_t step = 0;
  std::optional<int> rank;  // nullopt: host
  std::string category;
  std::string name;  // "forward", "backward", ... ("" = none)
  std::optional<int> unit;
  std::optional<int64_t> chunk;
  double start_s = 0;
  double end_s = 0;
  std::optional<int> node;  // multi-node runs: whose
};

struct ErrorRecord {
  std::string kind;  // "input" | "infeasible" | "io" | "numeric" | "runtime" | a finer word
  std::string message;
  std::optional<int64_t> step;
  std::optional<int> rank;
};

struct PredictionRecord {
  std::string method;  // "analytical" | "simulator"
  double step_time_s = 0;
  std::optional<double> tokens_per_s;
  std::optional<double> exposed_s;
  std::string bottleneck;
  std::string breakdown_json = "{}";  // {"compute_s": ..., "stall_s": ..., ..., "total_s": ...}
  std::string busy_json = "{}";       // {"gpu_compute": busy_s, ...}
};
// The record of a model prediction (model/prediction.h), breakdown and busy times as JSON objects.
PredictionRecord prediction_record(const Prediction& p);

// One raw profiler sample.
struct ProfileSample {
  std::string measurement;         // "pcie_h2d_gbps", ...
  std::string params_json = "{}";  // what was measured: {"bytes": 268435456, "pinned": true}
  double value = 0;
  std::string unit;  // "GB/s", "s", ...
};

// How long a write waits for another process's transaction before failing with LogLocked.
inline constexpr int kDefaultBusyTimeoutMs = 10000;

// A write that failed because another process held the log past the busy timeout (SQLite's
// "database is locked"): the same write may succeed later (PatientLog retries it).
class LogLocked : public IoError {
 public:
  using IoError::IoError;
};

// The writer. One connection; use it from one thread at a time (the executor's main thread), and do
// not carry an open RunLog across fork(): the child opens its own. Several processes may write one
// file at once (WAL, a busy timeout, and BEGIN IMMEDIATE so two writers never deadlock).
// Every method writes in one transaction and throws IoError (path + SQLite's message) when the write
// fails (LogLocked when another writer held the file past the busy timeout), or InputError naming the field when a value is out of range, a step repeats or a run id is
// unknown; a failed call writes nothing.
class RunLog {
 public:
  // Opens the log at `path`, creating its folders and the schema when absent; an existing log of
  // this schema version is appended to. Throws IoError naming the path for an unwritable location,
  // a file that is not SQLite, an SQLite file that is not a run log, or another schema version.
  // `busy_timeout_ms`: how long a write waits for another writer before it throws LogLocked.
  static RunLog open(const std::string& path, int busy_timeout_ms = kDefaultBusyTimeoutMs);

  RunLog(RunLog&&) noexcept;
  RunLog& operator=(RunLog&&) noexcept;
  ~RunLog();

  // Inserts a 'running' row with this process's pid, host and provenance; returns the run id.
  int64_t begin_run(const RunInfo& info);
  // One step; with its phase totals and sampled spans in the same transaction, so a reader never sees
  // a step without them.
  void log_step(int64_t run_id, const StepRecord& step, std::span<const PhaseTotal> totals = {},
                std::span<const PhaseSpan> spans = {});
  void log_phase_totals(int64_t run_id, std::span<const PhaseTotal> totals);
  void log_spans(int64_t run_id, std::span<const PhaseSpan> spans);
  void log_error(int64_t run_id, const ErrorRecord& error);
  // Throws InputError naming the field for a negative step, tokens or wait, an empty data
  // name, or an evaluation of that step already logged.
  void log_eval(int64_t run_id, const EvalRecord& eval);
  void log_prediction(int64_t run_id, const PredictionRecord& prediction);
  void log_profile_samples(int64_t run_id, std::span<const ProfileSample> samples);
  // Sets the final status (not kRunning) and ended_at. Throws InputError if the run does not exist
  // or has already ended.
  void end_run(int64_t run_id, RunStatus status);

  const std::string& path() const;

 private:
  struct Impl;
  explicit RunLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------
// Reading.

struct RunRecord {
  int64_t id = 0;
  RunKind kind = RunKind::kTrain;
  std::optional<int64_t> parent_run_id;
  RunStatus status = RunStatus::kRunning;
  std::string started_at;    // ISO-8601 UTC
  std::string ended_at;      // "" while running or when killed
  std::string last_seen_at;  // the run's latest write
  int64_t pid = 0;
  std::optional<int64_t> pid_start_ticks;
  std::string boot_id;
  std::string host;
  std::string git_revision;
  std::string build_type;
  std::string slidedp_version;
  std::string command_line;
  std::string backend;
  std::string plan_yaml;
  std::string plan_summary;
  std::string hardware_name;
  std::string hardware_yaml;
  std::string model_name;
  int64_t seq_len = 0;
  std::string system;
  std::string notes_json;
};

// A logged step as read back: what was written plus the derived columns.
struct StepRow {
  StepRecord record;                   // loss NaN where it was stored as NULL
  std::optional<double> tokens_per_s;  // tokens / wall_s; nullopt when wall_s was 0
  double elapsed_s = 0;                // from begin_run to the step's write
};

struct ErrorRow {
  ErrorRecord record;
  std::string at;  // ISO-8601 UTC, when it was logged
};

// The reader's conclusion for one run row (see RunLogReader::run_status).
RunState run_state(const RunRecord& run);

// A read connection (it never creates or changes a log). Like RunLog, one thread at a time.
class RunLogReader {
 public:
  // Opens an existing run log (never creates one). Throws IoError naming the path when it is
  // missing, not SQLite, not a run log, or of another schema version.
  explicit RunLogReader(const std::string& path);
  RunLogReader(RunLogReader&&) noexcept;
  RunLogReader& operator=(RunLogReader&&) noexcept;
  ~RunLogReader();

  std::vector<RunRecord> list_runs() const;  // by id
  std::optional<RunRecord> run(int64_t run_id) const;
  std::vector<StepRow> steps(int64_t run_id) const;            // by step
  std::vector<PhaseTotal> phase_totals(int64_t run_id) const;  // by step, rank (host first), category
  std::vector<PhaseSpan> spans(int64_t run_id) const;          // by step, start_s
  std::vector<ErrorRow> errors(int64_t run_id) const;          // in order written
  std::vector<EvalRecord> evals(int64_t run_id) const;         // by step
  std::vector<PredictionRecord> predictions(int64_t run_id) const;
  // run_state(run(run_id)): the recorded status, except that 'running' becomes kDidNotFinish unless
  // the recorded process is alive: same host, same boot, the pid exists, is not a zombie and started
  // at the recorded time. Throws InputError for an unknown run id.
  RunState run_status(int64_t run_id) const;
  // PRAGMA integrity_check: "ok", or SQLite's list of problems.
  std::string integrity_check() const;

  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// RunLogReader(db_path).run_status(run_id).
RunState run_status(const std::string& db_path, int64_t run_id);

}  // namespace slidedp::runlog
