// The run log on SQLite's C API. The schema comes from the embedded run_log_schema.sql and is created
// in one IMMEDIATE transaction (so two processes opening a new file at once agree on it). Writes are
// one transaction per call with statements prepared once; WAL with synchronous=NORMAL survives a
// SIGKILL of the writer at any moment (only a power loss may drop the last transactions).
#include "executor/run_log.h"

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/embedded_file.h"
#include "common/error.h"
#include "common/provenance.h"
#include "model/prediction.h"

namespace slidedp {
std::span<const EmbeddedFile> embedded_run_log_schema();  // generated from run_log_schema.sql
}

namespace slidedp::exec {
namespace fs = std::filesystem;

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

// How long a write waits for another process's transaction before failing with "database is locked".
constexpr int kBusyTimeoutMs = 10000;

// "2026-11-29T21:45:03.125Z": sortable as text, read by SQLite's julianday().
std::string utc_now_ms() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(ms));
  return buf;
}

// ---------------------------------------------------------------------------------------------------
// Process identity: a pid alone is recycled, so a run records the process's start time (clock ticks
// after boot, /proc/<pid>/stat field 22) and the boot id, and liveness compares all three.

struct ProcStat {
  char state = '?';
  int64_t start_ticks = 0;
};

std::optional<ProcStat> read_proc_stat(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  ProcStat st;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) st.state = field.empty() ? '?' : field[0];
    if (i == 22) {
      st.start_ticks = std::stoll(field);
      return st;
    }
  }
  return std::nullopt;
}

std::string current_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

bool recorded_process_alive(const RunRecord& r) {
  if (r.pid <= 0 || r.host != provenance().host) return false;
  const std::string boot = current_boot_id();
  if (!r.boot_id.empty() && !boot.empty() && r.boot_id != boot) return false;
  if (auto st = read_proc_stat(r.pid)) {
    if (st->state == 'Z' || st->state == 'X') return false;  // exited, waiting to be reaped
    return !r.pid_start_ticks || *r.pid_start_ticks == st->start_ticks;
  }
  std::error_code ec;
  if (fs::exists("/proc/self/stat", ec)) return false;  // procfs works and has no such process
  // No procfs at all: the kernel can still say whether the pid exists (EPERM: it does, not ours).
  return ::kill(static_cast<pid_t>(r.pid), 0) == 0 || errno == EPERM;
}

// ---------------------------------------------------------------------------------------------------
// A thin RAII layer over sqlite3 / sqlite3_stmt. Every failure becomes an exception naming the file:
// a constraint violation is the caller's bad value (InputError), anything else is IoError.

class Connection {
 public:
  Connection() = default;
  Connection(const std::string& path, int flags) : path_(path) {
    int rc = sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) {
      std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
      sqlite3_close_v2(db_);
      db_ = nullptr;
      throw IoError(path, "cannot open the run log: " + msg);
    }
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  // close_v2: statements still alive (destroyed later by their owner) do not block closing.
  ~Connection() { sqlite3_close_v2(db_); }

  sqlite3* db() const { return db_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(int rc, const std::string& what) const {
    std::string msg = what + ": " + (db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc));
    switch (rc & 0xff) {
      case SQLITE_CONSTRAINT:
        throw InputError(path_, msg);
      case SQLITE_NOTADB:
        throw IoError(path_, "not an SQLite database (" + msg + ")");
      default:
        throw IoError(path_, msg);
    }
  }

  // Runs SQL text with no results (several statements allowed).
  void exec(const std::string& sql, const std::string& what) const {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    sqlite3_free(err);
    if (rc != SQLITE_OK) fail(rc, what);
  }

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

class Statement {
 public:
  Statement(const Connection& c, const char* sql) : c_(&c) {
    int rc = sqlite3_prepare_v3(c.db(), sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
    if (rc != SQLITE_OK) c.fail(rc, std::string("preparing ") + sql);
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  // Parameters are 1-based, as in SQLite.
  Statement& bind(int i, int64_t v) {
    check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  Statement& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  Statement& bind(int i, double v) {  // non-finite -> NULL (SQLite would turn NaN into NULL anyway)
    check(std::isfinite(v) ? sqlite3_bind_double(stmt_, i, v) : sqlite3_bind_null(stmt_, i));
    return *this;
  }
  Statement& bind(int i, const std::string& v) {
    check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Statement& bind_text_or_null(int i, const std::string& v) {  // "" -> NULL
    return v.empty() ? bind_null(i) : bind(i, v);
  }
  template <class T>
  Statement& bind(int i, const std::optional<T>& v) {
    return v ? bind(i, *v) : bind_null(i);
  }
  Statement& bind_null(int i) {
    check(sqlite3_bind_null(stmt_, i));
    return *this;
  }

  // Advances; true when a row is available. On failure the statement is reset before throwing, so
  // the enclosing transaction can roll back.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    std::string sql = sqlite3_sql(stmt_);
    // sqlite3_reset returns the same error; read the message first, it is cleared by the reset.
    std::string msg = sqlite3_errmsg(c_->db());
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    int primary = rc & 0xff;
    if (primary == SQLITE_CONSTRAINT) throw InputError(c_->path(), msg);
    if (primary == SQLITE_NOTADB) throw IoError(c_->path(), "not an SQLite database (" + msg + ")");
    throw IoError(c_->path(), msg + " (in: " + sql + ")");
  }
  // Runs a statement that returns no rows, then makes it ready for reuse.
  void run() {
    step();
    reset();
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const {
    return is_null(col) ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(stmt_, col);
  }
  std::string text(int col) const {  // NULL -> ""
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  std::optional<int64_t> opt_integer(int col) const {
    return is_null(col) ? std::nullopt : std::optional<int64_t>(integer(col));
  }
  std::optional<double> opt_real(int col) const {
    return is_null(col) ? std::nullopt : std::optional<double>(real(col));
  }

 private:
  void check(int rc) {
    if (rc != SQLITE_OK) c_->fail(rc, "binding a parameter");
  }
  const Connection* c_;
  sqlite3_stmt* stmt_ = nullptr;
};

int64_t query_int(const Connection& c, const char* sql) {
  Statement s(c, sql);
  if (!s.step()) c.fail(SQLITE_ERROR, std::string("no result from ") + sql);
  return s.integer(0);
}

std::string run_log_schema_sql() {
  auto files = embedded_run_log_schema();
  auto text = find_embedded(files, "run_log_schema.sql");
  SLIDEDP_CHECK(text.has_value(), "run_log_schema.sql is not embedded");
  return std::string(*text);
}

// Opens `path` and makes sure it is a run log of this schema version; `create` makes an empty or
// missing file into one (the writer), otherwise the file must already be one (readers).
// PRAGMA journal_mode=WAL needs the file to itself for a moment, and SQLite answers SQLITE_BUSY at once
// (its busy handler does not wait for this) while another starting writer holds a lock: wait for it
// like any write, retrying within the busy timeout. Returns the mode SQLite reports.
std::string switch_to_wal(const Connection& c) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  std::minstd_rand jitter(static_cast<unsigned>(::getpid()));
  for (;;) {
    sqlite3_stmt* st = nullptr;
    std::string mode;
    int rc = sqlite3_prepare_v2(c.db(), "PRAGMA journal_mode=WAL", -1, &st, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        const unsigned char* text = sqlite3_column_text(st, 0);
        mode = text ? reinterpret_cast<const char*>(text) : "";
        rc = SQLITE_OK;
      }
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_OK) return mode;
    const int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || clock::now() > deadline) c.fail(rc, "switching to WAL");
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + jitter() % 10));
  }
}

std::unique_ptr<Connection> open_run_log(const std::string& path, bool create) {
  if (path.empty()) throw IoError(path, "the run log path is empty");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw IoError(path, "is a folder, not a run log file");
  if (create) {
    fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      fs::create_directories(parent, ec);
      if (ec) throw IoError(path, "cannot create the folder " + parent.string() + ": " + ec.message());
    }
  } else if (!fs::exists(path, ec)) {
    throw IoError(path, "no such run log");
  }
  auto c = std::make_unique<Connection>(
      path, create ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READWRITE);

  // The first read of the file: a non-SQLite file fails here with SQLITE_NOTADB.
  auto is_blank = [&] {
    return query_int(*c, "SELECT count(*) FROM sqlite_master") == 0 &&
           query_int(*c, "PRAGMA application_id") == 0 && query_int(*c, "PRAGMA user_version") == 0;
  };
  if (is_blank()) {
    if (!create) throw IoError(path, "an empty database, not a SlideDP run log");
    // journal_mode cannot change inside a transaction; it is stored in the file, so once is enough.
    switch_to_wal(*c);
    c->exec("BEGIN IMMEDIATE", "starting the schema transaction");
    try {
      if (is_blank()) c->exec(run_log_schema_sql(), "creating the run log schema");  // else: a racer did
      c->exec("COMMIT", "committing the run log schema");
    } catch (...) {
      sqlite3_exec(c->db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    // The SQL file and this build must agree on what they just wrote.
    SLIDEDP_CHECK(query_int(*c, "PRAGMA user_version") == kRunLogSchemaVersion &&
                      query_int(*c, "PRAGMA application_id") == kRunLogApplicationId,
                  "run_log_schema.sql and kRunLogSchemaVersion / kRunLogApplicationId disagree");
  }

  const int64_t app_id = query_int(*c, "PRAGMA application_id");
  if (app_id != kRunLogApplicationId) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%08llx", static_cast<unsigned long long>(app_id) & 0xffffffffULL);
    throw IoError(path, app_id == 0
                            ? "an SQLite database, but not a SlideDP run log (no run-log application id)"
                            : std::string("not a SlideDP run log (application_id ") + hex + ")");
  }
  int64_t version = query_int(*c, "PRAGMA user_version");
  if (version == 1) {
    // Version 2 added the node of multi-node runs' phases: appended columns, the totals' key.
    c->exec("BEGIN IMMEDIATE", "starting the migration to run log schema 2");
    try {
      if (query_int(*c, "PRAGMA user_version") == 1)  // else: another process migrated it meanwhile
        c->exec(
            "ALTER TABLE phases ADD COLUMN node INTEGER CHECK (node IS NULL OR node >= 0);"
            "ALTER TABLE phase_totals ADD COLUMN node INTEGER CHECK (node IS NULL OR node >= 0);"
            "DROP INDEX phase_totals_unique;"
            "CREATE UNIQUE INDEX phase_totals_unique ON phase_totals "
            "(run_id, step, ifnull(node, 0), ifnull(rank, -1), category);"
            "PRAGMA user_version = 2;",
            "migrating the run log from schema 1 to 2");
      c->exec("COMMIT", "committing the migration to run log schema 2");
    } catch (...) {
      sqlite3_exec(c->db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    version = query_int(*c, "PRAGMA user_version");
  }
  if (version > kRunLogSchemaVersion)
    throw IoError(path, "run log schema version " + std::to_string(version) +
                            " was written by a newer SlideDP; "
                            "this build reads version " +
                            std::to_string(kRunLogSchemaVersion));
  if (version != kRunLogSchemaVersion)
    throw IoError(path, "unknown run log schema version " + std::to_string(version) +
                            " (this build reads version " + std::to_string(kRunLogSchemaVersion) + ")");

  if (create) {
    // Re-assert WAL: a tool may have switched the file back to a rollback journal.
    const std::string got = switch_to_wal(*c);
    if (got != "wal") throw IoError(path, "cannot use WAL journal mode (SQLite kept '" + got + "')");
    // NORMAL in WAL mode: durable against a crash of the process, fsync only at checkpoints.
    c->exec("PRAGMA synchronous=NORMAL", "setting synchronous");
  }
  c->exec("PRAGMA foreign_keys=ON", "enabling foreign keys");
  return c;
}

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
                     "INSERT INTO phase_totals (run_id, step, rank, category, busy_s, count, node) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        insert_span(*conn,
                    "INSERT INTO phases (run_id, step, rank, category, name, unit, chunk, start_s, end_s, node) "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
        insert_error(
            *conn,
            "INSERT INTO errors (run_id, at, step, rank, kind, message) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
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
      insert_total.bind(6, t.count).bind(7, t.node).run();
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
      insert_prediction, insert_sample, end, status_of;
  // When each run this writer began started, on the steady clock (elapsed_s is immune to clock steps).
  std::map<int64_t, std::chrono::steady_clock::time_point> started;
};

RunLog::RunLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunLog::RunLog(RunLog&&) noexcept = default;
RunLog& RunLog::operator=(RunLog&&) noexcept = default;
RunLog::~RunLog() = default;

RunLog RunLog::open(const std::string& path) { return RunLog(std::make_unique<Impl>(path)); }

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
}

// ---------------------------------------------------------------------------------------------------
// Reading.

RunState run_state(const RunRecord& run) {
  switch (run.status) {
    case RunStatus::kFinished:
      return RunState::kFinished;
    case RunStatus::kFailed:
      return RunState::kFailed;
    case RunStatus::kInterrupted:
      return RunState::kInterrupted;
    case RunStatus::kRunning:
      return recorded_process_alive(run) ? RunState::kRunning : RunState::kDidNotFinish;
  }
  return RunState::kDidNotFinish;
}

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

std::vector<PhaseTotal> RunLogReader::phase_totals(int64_t run_id) const {
  // NULL ranks sort first in SQLite: the host's totals precede rank 0's.
  Statement s(*impl_->conn,
              "SELECT step, rank, category, busy_s, count, node FROM phase_totals WHERE run_id = ?1 "
              "ORDER BY step, node, rank, category");
  s.bind(1, run_id);
  std::vector<PhaseTotal> out;
  while (s.step())
    out.push_back(PhaseTotal{s.integer(0), opt_int(s.opt_integer(1)), s.text(2), s.real(3), s.integer(4),
                             opt_int(s.opt_integer(5))});
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

}  // namespace slidedp::exec
