// The run log's thin RAII layer over sqlite3 / sqlite3_stmt (internal to runlog/). Every failure
// becomes an exception naming the file: a constraint violation is the caller's bad value
// (InputError), anything else is IoError.
#pragma once

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "common/error.h"
#include "runlog/run_log.h"

namespace slidedp::runlog {

inline constexpr int kBusyTimeoutMs = kDefaultBusyTimeoutMs;


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
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        throw LogLocked(path_, msg);
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
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) throw LogLocked(c_->path(), msg + " (in: " + sql + ")");
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

inline int64_t query_int(const Connection& c, const char* sql) {
  Statement s(c, sql);
  if (!s.step()) c.fail(SQLITE_ERROR, std::string("no result from ") + sql);
  return s.integer(0);
}

}  // namespace slidedp::runlog
