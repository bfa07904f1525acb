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

}  // namespace slidedp::exec
