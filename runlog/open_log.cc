// Opening, creating and migrating a run log file; see open_log.h.
#include "runlog/open_log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <thread>

#include "common/embedded_file.h"
#include "runlog/run_log.h"

namespace slidedp {
std::span<const EmbeddedFile> embedded_run_log_schema();  // generated from run_log_schema.sql
}

namespace slidedp::runlog {
namespace fs = std::filesystem;

std::string run_log_schema_sql() {
  auto files = embedded_run_log_schema();
  auto text = find_embedded(files, "run_log_schema.sql");
  SLIDEDP_CHECK(text.has_value(), "run_log_schema.sql is not embedded");
  return std::string(*text);
}

// The statement of run_log_schema.sql that starts with `head`, through its terminating ';' (a
// migration that adds a table or replaces a view runs the same text as a new file).
std::string schema_statement(const std::string& head) {
  const std::string& schema = run_log_schema_sql();
  const std::size_t begin = schema.find(head);
  const std::size_t end = begin == std::string::npos ? begin : schema.find(";\n", begin);
  SLIDEDP_CHECK(end != std::string::npos, "run_log_schema.sql has no statement " + head);
  return schema.substr(begin, end + 2 - begin);
}

std::string create_table_sql(const std::string& table) {
  return schema_statement("CREATE TABLE " + table + " (");
}

// Drops `view` and creates it as the schema file defines it now.
std::string replace_view_sql(const std::string& view) {
  return "DROP VIEW " + view + ";" + schema_statement("CREATE VIEW " + view + " AS");
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
  // Each migration runs in one transaction and only if no other process did it meanwhile.
  auto migrate = [&](int64_t from, const std::string& sql) {
    if (version != from) return;
    const std::string what = "the migration of the run log from schema " + std::to_string(from) + " to " +
                             std::to_string(from + 1);
    c->exec("BEGIN IMMEDIATE", "starting " + what);
    try {
      if (query_int(*c, "PRAGMA user_version") == from)
        c->exec(sql + "PRAGMA user_version = " + std::to_string(from + 1) + ";", what);
      c->exec("COMMIT", "committing " + what);
    } catch (...) {
      sqlite3_exec(c->db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    version = query_int(*c, "PRAGMA user_version");
  };
  // Version 2 added the node of multi-node runs' phases: appended columns, the totals' key.
  migrate(1,
          "ALTER TABLE phases ADD COLUMN node INTEGER CHECK (node IS NULL OR node >= 0);"
          "ALTER TABLE phase_totals ADD COLUMN node INTEGER CHECK (node IS NULL OR node >= 0);"
          "DROP INDEX phase_totals_unique;"
          "CREATE UNIQUE INDEX phase_totals_unique ON phase_totals "
          "(run_id, step, ifnull(node, 0), ifnull(rank, -1), category);");
  // Version 3 added the evaluations' table, created from the schema file's one definition.
  migrate(2, create_table_sql("evals"));
  // Version 4 added the bytes the copies among a step's spans moved (NULL in the rows before).
  migrate(3, "ALTER TABLE phase_totals ADD COLUMN bytes REAL CHECK (bytes IS NULL OR bytes >= 0);");
  // Version 5 added the bytes to the busy views (views hold no rows: dropped and created afresh).
  migrate(4, replace_view_sql("step_busy") + replace_view_sql("run_busy"));
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

}  // namespace slidedp::runlog
