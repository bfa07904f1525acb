// Logged interrupts for tools without their own stop handling; see interrupt.h.
#include "runlog/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "runlog/run_log.h"

namespace slidedp::runlog {
namespace {

std::mutex g_mutex;
std::set<std::pair<std::string, int64_t>> g_open;

}  // namespace

void note_run_opened(const std::string& db_path, int64_t run_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_open.insert({db_path, run_id});
}

void note_run_closed(const std::string& db_path, int64_t run_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_open.erase({db_path, run_id});
}

namespace {

// The handler runs on whichever thread the signal lands on (libraries start threads before main, so
// blocking it everywhere is not possible): it only writes the signal's number to a pipe.
int g_pipe[2] = {-1, -1};

extern "C" void slidedp_runlog_on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &b, 1);
}

}  // namespace

void end_runs_on_stop_signal() {
  if (::pipe(g_pipe) != 0) return;  // no pipe: the signals keep their default action
  std::thread([] {
    unsigned char b = 0;
    while (::read(g_pipe[0], &b, 1) != 1) {
    }
    const int sig = b;
    std::set<std::pair<std::string, int64_t>> open;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      open = g_open;
    }
    for (const auto& [path, id] : open) {
      try {
        RunLog log = RunLog::open(path);
        log.log_error(id, {"interrupted", sig == SIGINT ? "interrupted by SIGINT" : "interrupted by SIGTERM",
                           std::nullopt, std::nullopt});
        log.end_run(id, RunStatus::kInterrupted);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: %s: run %lld not marked interrupted: %s\n", path.c_str(),
                     static_cast<long long>(id), e.what());
      }
    }
    std::fprintf(stderr, "interrupted by %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    std::fflush(stderr);
    ::_exit(128 + sig);
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = slidedp_runlog_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace slidedp::runlog
