// Cooperative failure handling for the executor's many threads (rank drivers, stream workers, the
// updater, collectives). The first error wins and is kept; every blocking wait in the executor and
// its backends checks aborted() at least every kPollInterval, so one failure stops every thread
// promptly and run() rethrows the ORIGINAL error, never a secondary one and never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace slidedp::exec {

// Thrown inside worker threads to unwind once the run is aborted; never escapes run().
struct Aborted {};

class RunControl {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{20};

  // Records `error` if it is the first; marks the run aborted. Thread-safe.
  void fail(std::exception_ptr error);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Throws Aborted if the run was aborted.
  void check() const {
    if (aborted()) throw Aborted{};
  }
  // Rethrows the first recorded error (no-op when none).
  void rethrow_if_failed() const;

  // cv.wait with the predicate, waking every kPollInterval to honour an abort (throws Aborted).
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Pred pred) const {
    while (!pred()) {
      check();
      cv.wait_for(lock, kPollInterval);
    }
  }

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::exception_ptr first_;
};

// A run ended from outside before it could stop cleanly: a second SIGINT / SIGTERM, or a stop request
// the run did not reach within its grace period (a stuck or very slow step). The process exits with
// 128 + signal, as a shell reports a process the signal killed; published checkpoints stay.
class Interrupted : public RuntimeError {
 public:
  Interrupted(int signal, const std::string& why) : RuntimeError(why), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Watches a run's stop and interrupt requests from a thread of its own and aborts the run with
// Interrupted when `interrupt` is set, or when `stop` has been set for `grace_s` seconds (> 0) without
// the run taking it up (stop_taken). `signal`: the number of the signal that asked (0: none given).
class InterruptWatch {
 public:
  InterruptWatch(RunControl& control, const std::atomic<bool>* stop, const std::atomic<bool>* interrupt,
                 const std::atomic<int>* signal, double grace_s);
  ~InterruptWatch();
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;
  // The run has reached the point where it stops cleanly (after a step, checkpointing): from here only
  // `interrupt` aborts it.
  void stop_taken() { stop_taken_.store(true); }

 private:
  void watch();
  RunControl& control_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* interrupt_;
  const std::atomic<int>* signal_;
  double grace_s_;
  std::atomic<bool> stop_taken_{false}, done_{false};
  std::thread thread_;
};

}  // namespace slidedp::exec
