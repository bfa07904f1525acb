// First-error-wins abort; see run_control.h.
#include "executor/run_control.h"

#include <fmt/format.h>

#include <optional>

namespace slidedp::exec {

void RunControl::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_) first_ = error;
  aborted_.store(true, std::memory_order_release);
}

void RunControl::rethrow_if_failed() const {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    e = first_;
  }
  if (e) std::rethrow_exception(e);
}

InterruptWatch::InterruptWatch(RunControl& control, const std::atomic<bool>* stop, const std::atomic<bool>* interrupt,
                               const std::atomic<int>* signal, double grace_s)
    : control_(control), stop_(stop), interrupt_(interrupt), signal_(signal), grace_s_(grace_s) {
  if (stop_ || interrupt_) thread_ = std::thread([this] { watch(); });
}

InterruptWatch::~InterruptWatch() {
  done_.store(true);
  if (thread_.joinable()) thread_.join();
}

void InterruptWatch::watch() {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> stop_seen;
  while (!done_.load() && !control_.aborted()) {
    const int sig = signal_ ? signal_->load() : 0;
    if (interrupt_ && interrupt_->load()) {
      control_.fail(std::make_exception_ptr(
          Interrupted(sig, fmt::format("interrupted by a second {}: the run stopped without finishing its step",
                                       sig == 2 ? "SIGINT" : sig == 15 ? "SIGTERM" : "stop request"))));
      return;
    }
    if (stop_ && stop_->load() && !stop_taken_.load() && grace_s_ > 0) {
      if (!stop_seen) stop_seen = Clock::now();
      if (std::chrono::duration<double>(Clock::now() - *stop_seen).count() > grace_s_) {
        control_.fail(std::make_exception_ptr(
            Interrupted(sig, fmt::format("interrupted: the step did not end within {:g} s of the stop request "
                                         "(--stop-grace)",
                                         grace_s_))));
        return;
      }
    }
    std::this_thread::sleep_for(RunControl::kPollInterval);
  }
}

}  // namespace slidedp::exec
