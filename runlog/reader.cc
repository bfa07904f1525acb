// The run log's reader; see run_log.h.
#include "runlog/run_log.h"

#include "runlog/open_log.h"
#include "runlog/sqlite_db.h"

namespace slidedp::runlog {

struct RunLogReader::Impl {
  explicit Impl(const std::string& path) : conn(open_run_log(path, /*create=*/false)) {}
  std::unique_ptr<Connection> conn;
};

RunLogReader::RunLogReader(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
RunLogReader::RunLogReader(RunLogReader&&) noexcept = default;
RunLogReader& RunLogReader::operator=(RunLogReader&&) noexcept = default;
RunLogReader::~RunLogReader() = default;

const std::string& RunLogReader::path() const { return impl_->conn->path(); }

namespace {

constexpr const char* kRunColumns =
    "SELECT id, kind, parent_run_id, status, started_at, ended_at, last_seen_at, pid, pid_start_ticks, "
    "boot_id, "
    "host, git_revision, build_type, slidedp_version, command_line, backend, plan_yaml, plan_summary, "
    "hardware_name, hardware_yaml, model_name, seq_len, system, notes_json FROM runs";

RunRecord read_run(const Statement& s, const std::string& path) {
  RunRecord r;
  r.id = s.integer(0);
  r.kind = parse_run_kind(s.text(1), path + ": runs.kind");
  r.parent_run_id = s.opt_integer(2);
  r.status = parse_run_status(s.text(3), path + ": runs.status");
  r.started_at = s.text(4);
  r.ended_at = s.text(5);
  r.last_seen_at = s.text(6);
  r.pid = s.integer(7);
  r.pid_start_ticks = s.opt_integer(8);
  r.boot_id = s.text(9);
  r.host = s.text(10);
  r.git_revision = s.text(11);
  r.build_type = s.text(12);
  r.slidedp_version = s.text(13);
  r.command_line = s.text(14);
  r.backend = s.text(15);
  r.plan_yaml = s.text(16);
  r.plan_summary = s.text(17);
  r.hardware_name = s.text(18);
  r.hardware_yaml = s.text(19);
  r.model_name = s.text(20);
  r.seq_len = s.opt_integer(21).value_or(0);
  r.system = s.text(22);
  r.notes_json = s.text(23);
  return r;
}

std::optional<int> opt_int(const std::optional<int64_t>& v) {
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}

}  // namespace

std::vector<RunRecord> RunLogReader::list_runs() const {
  Statement s(*impl_->conn, (std::string(kRunColumns) + " ORDER BY id").c_str());
  std::vector<RunRecord> out;
  while (s.step()) out.push_back(read_run(s, path()));
  return out;
}

std::optional<RunRecord> RunLogReader::run(int64_t run_id) const {
  Statement s(*impl_->conn, (std::string(kRunColumns) + " WHERE id = ?1").c_str());
  s.bind(1, run_id);
  if (!s.step()) return std::nullopt;
  return read_run(s, path());
}

std::vector<StepRow> RunLogReader::steps(int64_t run_id) const {
  Statement s(*impl_->conn,
              "SELECT step, loss, tokens, wall_s, predicted_step_s, lr, grad_norm, skipped, skip_reason, "
              "tokens_per_s, elapsed_s FROM steps WHERE run_id = ?1 ORDER BY step");
  s.bind(1, run_id);
  std::vector<StepRow> out;
  while (s.step()) {
    StepRow row;
    StepRecord& r = row.record;
    r.step = s.integer(0);
    r.loss = s.real(1);
    r.tokens = s.integer(2);
    r.wall_s = s.real(3);
    r.predicted_step_s = s.opt_real(4);
    r.lr = s.real(5);
    r.grad_norm = s.opt_real(6);
    r.skipped = s.integer(7) != 0;
    r.skip_reason = s.text(8);
    row.tokens_per_s = s.opt_real(9);
    row.elapsed_s = s.real(10);
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<EvalRecord> RunLogReader::evals(int64_t run_id) const {
  Statement s(*impl_->conn,
              "SELECT step, loss, tokens, wait_s, data FROM evals WHERE run_id = ?1 ORDER BY step");
  s.bind(1, run_id);
  std::vector<EvalRecord> out;
  while (s.step()) {
    EvalRecord e;
    e.step = s.integer(0);
    e.loss = s.real(1);
    e.tokens = s.integer(2);
    e.wait_s = s.real(3);
    e.data = s.text(4);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<PhaseTotal> RunLogReader::phase_totals(int64_t run_id) const {
  // NULL ranks sort first in SQLite: the host's totals precede rank 0's.
  Statement s(*impl_->conn,
              "SELECT step, rank, category, busy_s, count, node, bytes FROM phase_totals WHERE run_id = ?1 "
              "ORDER BY step, node, rank, category");
  s.bind(1, run_id);
  std::vector<PhaseTotal> out;
  while (s.step())
    out.push_back(PhaseTotal{s.integer(0), opt_int(s.opt_integer(1)), s.text(2), s.real(3), s.integer(4),
                             opt_int(s.opt_integer(5)), s.opt_real(6)});
  return out;
}

std::vector<PhaseSpan> RunLogReader::spans(int64_t run_id) const {
  Statement s(*impl_->conn,
              "SELECT step, rank, category, name, unit, chunk, start_s, end_s, node FROM phases WHERE run_id = ?1 "
              "ORDER BY step, start_s, rowid");
  s.bind(1, run_id);
  std::vector<PhaseSpan> out;
  while (s.step())
    out.push_back(PhaseSpan{s.integer(0), opt_int(s.opt_integer(1)), s.text(2), s.text(3),
                            opt_int(s.opt_integer(4)), s.opt_integer(5), s.real(6), s.real(7),
                            opt_int(s.opt_integer(8))});
  return out;
}

std::vector<ErrorRow> RunLogReader::errors(int64_t run_id) const {
  Statement s(*impl_->conn, "SELECT kind, message, step, rank, at FROM errors WHERE run_id = ?1 ORDER BY id");
  s.bind(1, run_id);
  std::vector<ErrorRow> out;
  while (s.step())
    out.push_back(
        ErrorRow{ErrorRecord{s.text(0), s.text(1), s.opt_integer(2), opt_int(s.opt_integer(3))}, s.text(4)});
  return out;
}

std::vector<PredictionRecord> RunLogReader::predictions(int64_t run_id) const {
  Statement s(*impl_->conn,
              "SELECT method, step_time_s, tokens_per_s, exposed_s, bottleneck, breakdown_json, busy_json "
              "FROM predictions WHERE run_id = ?1 ORDER BY id");
  s.bind(1, run_id);
  std::vector<PredictionRecord> out;
  while (s.step())
    out.push_back(PredictionRecord{s.text(0), s.real(1), s.opt_real(2), s.opt_real(3), s.text(4), s.text(5),
                                   s.text(6)});
  return out;
}

RunState RunLogReader::run_status(int64_t run_id) const {
  std::optional<RunRecord> r = run(run_id);
  if (!r) throw InputError(path() + ": runs", "no run with id " + std::to_string(run_id) + " in this log");
  return run_state(*r);
}

std::string RunLogReader::integrity_check() const {
  Statement s(*impl_->conn, "PRAGMA integrity_check");
  std::string out;
  while (s.step()) out += (out.empty() ? "" : "\n") + s.text(0);
  return out;
}

RunState run_status(const std::string& db_path, int64_t run_id) {
  return RunLogReader(db_path).run_status(run_id);
}

}  // namespace slidedp::runlog
