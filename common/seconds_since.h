// Seconds of the steady clock since t0: how the tools time what they measure and report.
#pragma once

#include <chrono>

namespace slidedp {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace slidedp
