// Writes of a running job that must never stop it. A write is tried at once, so in the usual case it
// commits before submit() returns (a step's row is in the log before its checkpoint is published).
// When another process holds the log past the busy timeout, that write and every later one wait in
// a bounded queue, in order, which a background thread retries until they commit; the job goes on
// with one warning per stall. Other failures (a value out of range, a full disk) are not retried:
// the next submit() or flush() throws them, as the RunLog call would have.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "runlog/run_log.h"

namespace slidedp::runlog {

class PatientLog {
 public:
  using Write = std::function<void(RunLog&)>;
  // `warn` receives the one-line warnings (default: standard error). Writes beyond `max_queued`
  // while the log is locked are dropped and counted (a stall of hours must not grow memory without
  // bound); flush() reports them.
  explicit PatientLog(RunLog& log, std::size_t max_queued = 4096,
                      std::function<void(const std::string&)> warn = nullptr);
  PatientLog(const PatientLog&) = delete;
  PatientLog& operator=(const PatientLog&) = delete;
  ~PatientLog();

  // One write (a single RunLog call), from one thread (the job's). Throws what an earlier write
  // failed with, other than a lock.
  void submit(Write write);

  struct Outcome {
    std::size_t uncommitted = 0;  // still queued when the patience ran out
    std::size_t dropped = 0;      // never queued: the queue was full
  };
  // Waits up to `patience` for every queued write to commit; then nothing more is retried or
  // written through this object, and the caller may use the RunLog directly again (end_run).
  Outcome flush(std::chrono::milliseconds patience);

 private:
  void retry_loop();
  void rethrow_failure_locked();

  RunLog& log_;
  const std::size_t max_queued_;
  std::function<void(const std::string&)> warn_;
  std::mutex mutex_;            // queue state
  std::mutex log_mutex_;        // the connection: one write at a time
  std::condition_variable cv_;
  std::deque<Write> queue_;
  std::size_t dropped_ = 0;
  std::exception_ptr failure_;  // a retried write's non-lock error, for the caller
  bool stopping_ = false;
  std::thread retry_thread_;
};

}  // namespace slidedp::runlog
