// The run log's patient writer; see patient_log.h.
#include "runlog/patient_log.h"

#include <fmt/format.h>

#include <cstdio>

namespace slidedp::runlog {

PatientLog::PatientLog(RunLog& log, std::size_t max_queued, std::function<void(const std::string&)> warn)
    : log_(log), max_queued_(max_queued), warn_(std::move(warn)) {
  if (!warn_) warn_ = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  retry_thread_ = std::thread([this] { retry_loop(); });
}

PatientLog::~PatientLog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (retry_thread_.joinable()) retry_thread_.join();
}

void PatientLog::rethrow_failure_locked() {
  if (!failure_) return;
  std::exception_ptr e = failure_;
  failure_ = nullptr;
  std::rethrow_exception(e);
}

void PatientLog::submit(Write write) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rethrow_failure_locked();
    if (stopping_) return;
    if (!queue_.empty()) {
      // Behind a stall: in order, after what waits.
      if (queue_.size() >= max_queued_) {
        ++dropped_;
      } else {
        queue_.push_back(std::move(write));
      }
      return;
    }
  }
  {
    std::lock_guard<std::mutex> io(log_mutex_);
    try {
      write(log_);
      return;
    } catch (const LogLocked& e) {
      warn_(fmt::format("warning: {}; training goes on, this and later writes are queued and retried", e.what()));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(write));
  cv_.notify_all();
}

void PatientLog::retry_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    // A copy: the head stays queued (later writes keep their place behind it) until it commits.
    Write head = queue_.front();
    lock.unlock();
    bool committed = false;
    std::exception_ptr failed;
    {
      std::lock_guard<std::mutex> io(log_mutex_);
      try {
        head(log_);  // waits up to the busy timeout for the lock
        committed = true;
      } catch (const LogLocked&) {
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if ((committed || failed) && !queue_.empty()) {
      queue_.pop_front();
      if (failed && !failure_) failure_ = failed;
      if (queue_.empty()) {
        warn_(fmt::format("the run log {} took the queued writes again", log_.path()));
        cv_.notify_all();
      }
    }
  }
}

PatientLog::Outcome PatientLog::flush(std::chrono::milliseconds patience) {
  Outcome o;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, patience, [&] { return queue_.empty() || failure_; });
    o = {queue_.size(), dropped_};
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  // The retry thread finishes the write it is in (at most one busy timeout) before the caller uses
  // the log directly again.
  if (retry_thread_.joinable()) retry_thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  rethrow_failure_locked();
  return o;
}

}  // namespace slidedp::runlog
