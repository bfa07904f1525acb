// Opening a run log: creating the schema on an empty file (one IMMEDIATE transaction, so two
// processes opening a new file at once agree on it), migrating an older schema, refusing anything
// else, and the journal settings. Internal to runlog/.
#pragma once

#include <memory>
#include <string>

#include "runlog/sqlite_db.h"

namespace slidedp::runlog {

// The embedded run_log_schema.sql.
std::string run_log_schema_sql();
// PRAGMA journal_mode=WAL, retried within the busy timeout; returns the mode SQLite reports.
std::string switch_to_wal(const Connection& c);
// Opens `path` and makes sure it is a run log of this schema version (migrating an older one);
// `create` makes an empty or missing file into one (the writer), otherwise the file must already be
// one (readers).
std::unique_ptr<Connection> open_run_log(const std::string& path, bool create);

}  // namespace slidedp::runlog
