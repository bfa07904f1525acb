// First-error-wins abort; see run_control.h.
#include "executor/run_control.h"

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

}  // namespace slidedp::exec
