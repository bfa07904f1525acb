// Whether the process that wrote a 'running' run is still alive (a pid alone is recycled, so a run
// records the process's start time and the boot id too), and the run log's time stamps. Internal to
// runlog/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runlog/run_log.h"

namespace slidedp::runlog {

// "2026-11-29T21:45:03.125Z": sortable as text, read by SQLite's julianday().
std::string utc_now_ms();

struct ProcStat {
  char state = '?';
  int64_t start_ticks = 0;
};
// /proc/<pid>/stat's state and start time (clock ticks after boot); nullopt when unreadable.
std::optional<ProcStat> read_proc_stat(int64_t pid);
std::string current_boot_id();
// The run's recorded process (pid, start ticks, boot id, host) is alive now.
bool recorded_process_alive(const RunRecord& r);

}  // namespace slidedp::runlog
