// A tool without its own stop handling (slidedp-profile, slidedp-plan) ends on SIGINT / SIGTERM with
// every run it has open logged `interrupted`, exit 128 + signal, instead of dying by the signal with
// its runs left `running`. slidedp-run finishes its step or stops at once by its own rules
// (executor/cli/run_main.cc); it does not use this.
#pragma once

#include <cstdint>
#include <string>

namespace slidedp::runlog {

// Call first in main: a SIGINT or SIGTERM is handed (through a pipe) to a thread of its own, which ends
// the open runs (a connection of its own to each log) and the process.
void end_runs_on_stop_signal();

// RunLog::begin_run / end_run report the runs this process has open (used only when the above runs).
void note_run_opened(const std::string& db_path, int64_t run_id);
void note_run_closed(const std::string& db_path, int64_t run_id);

}  // namespace slidedp::runlog
