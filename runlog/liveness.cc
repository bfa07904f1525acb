// Process liveness and time stamps of the run log; see liveness.h.
#include "runlog/liveness.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/provenance.h"

namespace slidedp::runlog {
namespace fs = std::filesystem;

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

}  // namespace slidedp::runlog
