// The run log's writer: one transaction per call with statements prepared once, every value checked
// first with a message naming the table and field. WAL with synchronous=NORMAL survives a SIGKILL of
// the writer at any moment (only a power loss may drop the last transactions).
#include "runlog/interrupt.h"
#include "runlog/run_log.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/provenance.h"
#include "model/prediction.h"
#include "runlog/liveness.h"
#include "runlog/open_log.h"
#include "runlog/sqlite_db.h"

namespace slidedp::runlog {

const char* run_kind_name(RunKind k) {
  switch (k) {
    case RunKind::kTrain:
      return "train";
    case RunKind::kProfile:
      return "profile";
    case RunKind::kRefine:
      return "refine";
    case RunKind::kSweep:
      return "sweep";
  }
  return "?";
}

const char* run_status_name(RunStatus s) {
  switch (s) {
    case RunStatus::kRunning:
      return "running";
    case RunStatus::kFinished:
      return "finished";
    case RunStatus::kFailed:
      return "failed";
    case RunStatus::kInterrupted:
      return "interrupted";
  }
  return "?";
}

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::kRunning:
      return "running";
    case RunState::kFinished:
      return "finished";
    case RunState::kFailed:
      return "failed";
    case RunState::kInterrupted:
      return "interrupted";
    case RunState::kDidNotFinish:
      return "did not finish";
  }
  return "?";
}

RunKind parse_run_kind(const std::string& s, const std::string& where) {
  for (RunKind k : {RunKind::kTrain, RunKind::kProfile, RunKind::kRefine, RunKind::kSweep})
    if (s == run_kind_name(k)) return k;
  throw InputError(where, "unknown run kind '" + s + "' (expected train, profile, refine or sweep)");
}

RunStatus parse_run_status(const std::string& s, const std::string& where) {
  for (RunStatus k : {RunStatus::kRunning, RunStatus::kFinished, RunStatus::kFailed, RunStatus::kInterrupted})
    if (s == run_status_name(k)) return k;
  throw InputError(where,
                   "unknown run status '" + s + "' (expected running, finished, failed or interrupted)");
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Validation of the caller's values, with messages naming the table and field.

bool is_category(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  return true;
}

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}


}  // namespace

// ---------------------------------------------------------------------------------------------------

PredictionRecord prediction_record(const Prediction& p) {
  PredictionRecord r;
  r.method = p.method;
  r.step_time_s = p.step_time_s;
  r.tokens_per_s = p.tokens_per_s;
  r.exposed_s = p.exposed_s;
  r.bottleneck = p.bottleneck;
  const Breakdown& b = p.breakdown;
  nlohmann::ordered_json bj = {{"compute_s", b.compute_s},
                               {"stall_s", b.stall_s},
                               {"exposed_head_s", b.exposed_head_s},
                               {"exposed_tail_s", b.exposed_tail_s},
                               {"post_update_s", b.post_update_s},
                               {"sync_s", b.sync_s},
                               {"total_s", b.total()}};
  r.breakdown_json = bj.dump();
  nlohmann::ordered_json busy = nlohmann::ordered_json::object();
  for (const auto& [resource, s] : p.busy_s) busy[resource] = s;
  r.busy_json = busy.dump();
  return r;
}

struct RunLog::Impl {
  explicit Impl(const std::string& path)
      : conn(open_run_log(path, /*create=*/true)),
        begin(*conn, "BEGIN IMMEDIATE"),
        commit(*conn, "COMMIT"),
        touch_run(*conn, "UPDATE runs SET last_seen_at = ?2 WHERE id = ?1"),
        insert_run(
            *conn,
            "INSERT INTO runs (kind, parent_run_id, started_at, status, pid, pid_start_ticks, boot_id, "
            "host, git_revision, build_type, slidedp_version, command_line, backend, plan_yaml, "
            "plan_summary, hardware_name, hardware_yaml, model_name, seq_len, system, notes_json, "
            "last_seen_at) VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
            "?14, ?15, ?16, ?17, ?18, ?19, ?20, ?3)"),
        insert_step(
            *conn,
            "INSERT INTO steps (run_id, step, loss, tokens, wall_s, predicted_step_s, tokens_per_s, lr, "
            "grad_norm, skipped, skip_reason, elapsed_s) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
            "?10, ?11, coalesce(?12, (julianday(?13) - julianday((SELECT started_at FROM runs "
            "WHERE id = ?1))) * 86400.0))"),
        insert_total(*conn,
                     "INSERT INTO phase_totals (run_id, step, rank, category, busy_s, count, node, bytes) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
        insert_span(
            *conn,
            "INSERT INTO phases (run_id, step, rank, category, name, unit, chunk, start_s, end_s, node) "
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
        insert_error(
            *conn,
            "INSERT INTO errors (run_id, at, step, rank, kind, message) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
        insert_eval(*conn,
                    "INSERT INTO evals (run_id, step, loss, perplexity, tokens, wait_s, data) "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        insert_prediction(*conn,
                          "INSERT INTO predictions (run_id, method, step_time_s, tokens_per_s, exposed_s, "
                          "bottleneck, breakdown_json, busy_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
        insert_sample(*conn,
                      "INSERT INTO profile_samples (run_id, measurement, params_json, value, unit) "
                      "VALUES (?1, ?2, ?3, ?4, ?5)"),
        end(*conn,
            "UPDATE runs SET status = ?2, ended_at = ?3, last_seen_at = ?3 WHERE id = ?1 AND status = "
            "'running'"),
        status_of(*conn, "SELECT status FROM runs WHERE id = ?1") {}

  // BEGIN IMMEDIATE takes the write lock up front: a deferred transaction that upgrades from read to
  // write can fail with SQLITE_BUSY without waiting, which the busy timeout cannot cure.
  class Transaction {
   public:
    explicit Transaction(Impl& impl) : impl_(impl) { impl_.begin.run(); }
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;
    void commit() {
      impl_.commit.run();
      done_ = true;
    }
    ~Transaction() {
      if (!done_) sqlite3_exec(impl_.conn->db(), "ROLLBACK", nullptr, nullptr, nullptr);
    }

   private:
    Impl& impl_;
    bool done_ = false;
  };

  std::string where(const std::string& field) const { return conn->path() + ": " + field; }

  // Marks the run as alive now; also the existence check every write of a run starts with.
  void touch(int64_t run_id, const std::string& now) {
    touch_run.bind(1, run_id).bind(2, now).run();
    if (sqlite3_changes(conn->db()) != 1)
      throw InputError(where("runs"), "no run with id " + std::to_string(run_id) + " in this log");
  }

  void check_total(const PhaseTotal& t) const {
    const std::string w = "phase_totals[step " + std::to_string(t.step) + "]";
    if (t.step < 1) throw InputError(where(w + ".step"), "must be at least 1");
    if (t.rank && *t.rank < 0) throw InputError(where(w + ".rank"), "must be >= 0 (nullopt for the host)");
    if (!is_category(t.category))
      throw InputError(where(w + ".category"), "'" + t.category + "' is not a lowercase identifier");
    if (!std::isfinite(t.busy_s) || t.busy_s < 0)
      throw InputError(where(w + ".busy_s"), "must be finite and >= 0 seconds, got " + num(t.busy_s));
    if (t.count < 0) throw InputError(where(w + ".count"), "must be >= 0");
    if (t.node && *t.node < 0) throw InputError(where(w + ".node"), "must be >= 0 (nullopt for a one-node run)");
    if (t.bytes && (!std::isfinite(*t.bytes) || *t.bytes < 0))
      throw InputError(where(w + ".bytes"), "must be finite and >= 0, got " + num(*t.bytes));
  }
  void check_span(const PhaseSpan& s) const {
    const std::string w = "phases[step " + std::to_string(s.step) + "]";
    if (s.step < 1) throw InputError(where(w + ".step"), "must be at least 1");
    if (s.rank && *s.rank < 0) throw InputError(where(w + ".rank"), "must be >= 0 (nullopt for the host)");
    if (!is_category(s.category))
      throw InputError(where(w + ".category"), "'" + s.category + "' is not a lowercase identifier");
    if (s.unit && *s.unit < 0) throw InputError(where(w + ".unit"), "must be >= 0");
    if (s.chunk && *s.chunk < 0) throw InputError(where(w + ".chunk"), "must be >= 0");
    if (s.node && *s.node < 0) throw InputError(where(w + ".node"), "must be >= 0 (nullopt for a one-node run)");
    if (!std::isfinite(s.start_s) || !std::isfinite(s.end_s) || s.end_s < s.start_s)
      throw InputError(where(w + ".end_s"), "start_s " + num(s.start_s) + " and end_s " + num(s.end_s) +
                                                " must be finite with end_s >= start_s (seconds)");
  }

  void write_totals(int64_t run_id, std::span<const PhaseTotal> totals) {
    for (const PhaseTotal& t : totals) {
      check_total(t);
      insert_total.bind(1, run_id).bind(2, t.step).bind(3, t.rank).bind(4, t.category).bind(5, t.busy_s);
      insert_total.bind(6, t.count).bind(7, t.node).bind(8, t.bytes).run();
    }
  }
  void write_spans(int64_t run_id, std::span<const PhaseSpan> spans) {
    for (const PhaseSpan& s : spans) {
      check_span(s);
      insert_span.bind(1, run_id)
          .bind(2, s.step)
          .bind(3, s.rank)
          .bind(4, s.category)
          .bind_text_or_null(5, s.name);
      insert_span.bind(6, s.unit).bind(7, s.chunk).bind(8, s.start_s).bind(9, s.end_s).bind(10, s.node).run();
    }
  }

  // Declared first: destroyed last, after the statements.
  std::unique_ptr<Connection> conn;
  Statement begin, commit, touch_run, insert_run, insert_step, insert_total, insert_span, insert_error,
      insert_eval, insert_prediction, insert_sample, end, status_of;
  // When each run this writer began started, on the steady clock (elapsed_s is immune to clock steps).
  std::map<int64_t, std::chrono::steady_clock::time_point> started;
};

RunLog::RunLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunLog::RunLog(RunLog&&) noexcept = default;
RunLog& RunLog::operator=(RunLog&&) noexcept = default;
RunLog::~RunLog() = default;

RunLog RunLog::open(const std::string& path, int busy_timeout_ms) {
  if (busy_timeout_ms < 0) throw InputError(path, "busy timeout must be >= 0 ms");
  auto impl = std::make_unique<Impl>(path);
  sqlite3_busy_timeout(impl->conn->db(), busy_timeout_ms);
  return RunLog(std::move(impl));
}

const std::string& RunLog::path() const { return impl_->conn->path(); }

int64_t RunLog::begin_run(const RunInfo& info) {
  Impl& m = *impl_;
  if (info.seq_len < 0) throw InputError(m.where("runs.seq_len"), "must be >= 0 (0 = not applicable)");
  if (!nlohmann::json::accept(info.notes_json))
    throw InputError(m.where("runs.notes_json"), "not valid JSON: " + info.notes_json);
  const Provenance& prov = provenance();
  const int64_t pid = ::getpid();
  std::optional<int64_t> start_ticks;
  if (auto st = read_proc_stat(pid)) start_ticks = st->start_ticks;
  const std::string now = utc_now_ms();

  Impl::Transaction txn(m);
  Statement& s = m.insert_run;
  s.bind(1, std::string(run_kind_name(info.kind))).bind(2, info.parent_run_id).bind(3, now).bind(4, pid);
  s.bind(5, start_ticks)
      .bind_text_or_null(6, current_boot_id())
      .bind(7, prov.host)
      .bind(8, prov.git_revision);
  s.bind(9, prov.build_type).bind(10, prov.version).bind(11, info.command_line);
  s.bind_text_or_null(12, info.backend)
      .bind_text_or_null(13, info.plan_yaml)
      .bind_text_or_null(14, info.plan_summary);
  s.bind_text_or_null(15, info.hardware_name).bind_text_or_null(16, info.hardware_yaml);
  s.bind_text_or_null(17, info.model_name);
  if (info.seq_len > 0) s.bind(18, info.seq_len);
  s.bind_text_or_null(19, info.system).bind(20, info.notes_json).run();
  const int64_t id = sqlite3_last_insert_rowid(m.conn->db());
  txn.commit();
  m.started[id] = std::chrono::steady_clock::now();
  note_run_opened(path(), id);
  return id;
}

void RunLog::log_step(int64_t run_id, const StepRecord& r, std::span<const PhaseTotal> totals,
                      std::span<const PhaseSpan> spans) {
  Impl& m = *impl_;
  const std::string w = "steps[step " + std::to_string(r.step) + "]";
  if (r.step < 1) throw InputError(m.where(w + ".step"), "must be at least 1 (optimizer steps are 1-based)");
  if (r.tokens < 0) throw InputError(m.where(w + ".tokens"), "must be >= 0");
  if (!std::isfinite(r.wall_s) || r.wall_s < 0)
    throw InputError(m.where(w + ".wall_s"), "must be finite and >= 0 seconds, got " + num(r.wall_s));
  if (r.predicted_step_s && !(std::isfinite(*r.predicted_step_s) && *r.predicted_step_s > 0))
    throw InputError(m.where(w + ".predicted_step_s"),
                     "must be finite and > 0 seconds, got " + num(*r.predicted_step_s));
  if (!std::isfinite(r.lr) || r.lr < 0)
    throw InputError(m.where(w + ".lr"), "must be finite and >= 0, got " + num(r.lr));
  if (r.skipped == r.skip_reason.empty())
    throw InputError(m.where(w + ".skip_reason"),
                     r.skipped ? "a skipped step needs a reason" : "only a skipped step has a reason");
  for (const PhaseTotal& t : totals)
    if (t.step != r.step)
      throw InputError(m.where("phase_totals.step"), "a total of step " + std::to_string(t.step) +
                                                         " logged with step " + std::to_string(r.step));
  for (const PhaseSpan& s : spans)
    if (s.step != r.step)
      throw InputError(m.where("phases.step"), "a span of step " + std::to_string(s.step) +
                                                   " logged with step " + std::to_string(r.step));

  const std::string now = utc_now_ms();
  std::optional<double> elapsed_s;
  if (auto it = m.started.find(run_id); it != m.started.end())
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second).count();

  Impl::Transaction txn(m);
  m.touch(run_id, now);
  Statement& s = m.insert_step;
  s.bind(1, run_id)
      .bind(2, r.step)
      .bind(3, r.loss)
      .bind(4, r.tokens)
      .bind(5, r.wall_s)
      .bind(6, r.predicted_step_s);
  if (r.wall_s > 0) s.bind(7, static_cast<double>(r.tokens) / r.wall_s);
  s.bind(8, r.lr)
      .bind(9, r.grad_norm)
      .bind(10, int64_t{r.skipped ? 1 : 0})
      .bind_text_or_null(11, r.skip_reason);
  s.bind(12, elapsed_s).bind(13, now);
  try {
    s.run();
  } catch (const InputError& e) {
    // The values passed the checks above, so the constraint that failed is the key: a repeated step.
    std::string sqlite_msg = e.what();
    if (sqlite_msg.rfind(m.conn->path() + ": ", 0) == 0) sqlite_msg.erase(0, m.conn->path().size() + 2);
    throw InputError(m.where(w),
                     "already logged for run " + std::to_string(run_id) + " (" + sqlite_msg + ")");
  }
  m.write_totals(run_id, totals);
  m.write_spans(run_id, spans);
  txn.commit();
}

void RunLog::log_phase_totals(int64_t run_id, std::span<const PhaseTotal> totals) {
  Impl& m = *impl_;
  for (const PhaseTotal& t : totals) m.check_total(t);
  Impl::Transaction txn(m);
  m.touch(run_id, utc_now_ms());
  m.write_totals(run_id, totals);
  txn.commit();
}

void RunLog::log_spans(int64_t run_id, std::span<const PhaseSpan> spans) {
  Impl& m = *impl_;
  for (const PhaseSpan& s : spans) m.check_span(s);
  Impl::Transaction txn(m);
  m.touch(run_id, utc_now_ms());
  m.write_spans(run_id, spans);
  txn.commit();
}

void RunLog::log_error(int64_t run_id, const ErrorRecord& e) {
  Impl& m = *impl_;
  if (e.kind.empty()) throw InputError(m.where("errors.kind"), "must not be empty");
  if (e.step && *e.step < 1) throw InputError(m.where("errors.step"), "must be at least 1");
  if (e.rank && *e.rank < 0) throw InputError(m.where("errors.rank"), "must be >= 0 (nullopt for the host)");
  const std::string now = utc_now_ms();
  Impl::Transaction txn(m);
  m.touch(run_id, now);
  m.insert_error.bind(1, run_id)
      .bind(2, now)
      .bind(3, e.step)
      .bind(4, e.rank)
      .bind(5, e.kind)
      .bind(6, e.message)
      .run();
  txn.commit();
}

void RunLog::log_eval(int64_t run_id, const EvalRecord& e) {
  Impl& m = *impl_;
  const std::string w = "evals[step " + std::to_string(e.step) + "]";
  if (e.step < 0) throw InputError(m.where(w + ".step"), "must be at least 0 (0: the starting weights)");
  if (e.tokens < 0) throw InputError(m.where(w + ".tokens"), "must be >= 0");
  if (!(std::isfinite(e.wait_s) && e.wait_s >= 0))
    throw InputError(m.where(w + ".wait_s"), "must be finite and >= 0 seconds, got " + num(e.wait_s));
  if (e.data.empty()) throw InputError(m.where(w + ".data"), "must name the held-out data");
  Impl::Transaction txn(m);
  m.touch(run_id, utc_now_ms());
  m.insert_eval.bind(1, run_id)
      .bind(2, e.step)
      .bind(3, e.loss)
      .bind(4, std::exp(e.loss))  // a non-finite value binds as NULL
      .bind(5, e.tokens)
      .bind(6, e.wait_s)
      .bind(7, e.data);
  try {
    m.insert_eval.run();
  } catch (const InputError&) {
    throw InputError(m.where(w), "already logged for run " + std::to_string(run_id));
  }
  txn.commit();
}

void RunLog::log_prediction(int64_t run_id, const PredictionRecord& p) {
  Impl& m = *impl_;
  if (p.method.empty()) throw InputError(m.where("predictions.method"), "must not be empty");
  if (!(std::isfinite(p.step_time_s) && p.step_time_s > 0))
    throw InputError(m.where("predictions.step_time_s"),
                     "must be finite and > 0 seconds, got " + num(p.step_time_s));
  if (!nlohmann::json::accept(p.breakdown_json))
    throw InputError(m.where("predictions.breakdown_json"), "not valid JSON: " + p.breakdown_json);
  if (!nlohmann::json::accept(p.busy_json))
    throw InputError(m.where("predictions.busy_json"), "not valid JSON: " + p.busy_json);
  Impl::Transaction txn(m);
  m.touch(run_id, utc_now_ms());
  Statement& s = m.insert_prediction;
  s.bind(1, run_id).bind(2, p.method).bind(3, p.step_time_s).bind(4, p.tokens_per_s).bind(5, p.exposed_s);
  s.bind(6, p.bottleneck).bind(7, p.breakdown_json).bind(8, p.busy_json).run();
  txn.commit();
}

void RunLog::log_profile_samples(int64_t run_id, std::span<const ProfileSample> samples) {
  Impl& m = *impl_;
  for (const ProfileSample& p : samples) {
    if (p.measurement.empty()) throw InputError(m.where("profile_samples.measurement"), "must not be empty");
    const std::string w = "profile_samples[" + p.measurement + "]";
    if (!std::isfinite(p.value))
      throw InputError(m.where(w + ".value"), "must be finite, got " + num(p.value));
    if (p.unit.empty()) throw InputError(m.where(w + ".unit"), "must not be empty");
    if (!nlohmann::json::accept(p.params_json))
      throw InputError(m.where(w + ".params_json"), "not valid JSON: " + p.params_json);
  }
  Impl::Transaction txn(m);
  m.touch(run_id, utc_now_ms());
  for (const ProfileSample& p : samples)
    m.insert_sample.bind(1, run_id)
        .bind(2, p.measurement)
        .bind(3, p.params_json)
        .bind(4, p.value)
        .bind(5, p.unit)
        .run();
  txn.commit();
}

void RunLog::end_run(int64_t run_id, RunStatus status) {
  Impl& m = *impl_;
  if (status == RunStatus::kRunning)
    throw InputError(m.where("runs.status"), "end_run needs a final status, not 'running'");
  Impl::Transaction txn(m);
  m.end.bind(1, run_id).bind(2, std::string(run_status_name(status))).bind(3, utc_now_ms()).run();
  if (sqlite3_changes(m.conn->db()) != 1) {
    m.status_of.bind(1, run_id);
    const bool exists = m.status_of.step();
    const std::string was = exists ? m.status_of.text(0) : "";
    m.status_of.reset();
    throw InputError(m.where("runs"),
                     exists ? "run " + std::to_string(run_id) + " has already ended as '" + was + "'"
                            : "no run with id " + std::to_string(run_id) + " in this log");
  }
  txn.commit();
  m.started.erase(run_id);
  note_run_closed(path(), run_id);
}

}  // namespace slidedp::runlog
