// Union length of time intervals: the busy time of a resource whose spans may overlap (a rank's
// concurrent collectives, a simulated resource's tasks), each moment counted once.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

namespace slidedp {

inline double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, s0 = 0, e0 = -1;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (!open || s > e0) {
      if (open) total += e0 - s0;
      s0 = s, e0 = e, open = true;
    } else {
      e0 = std::max(e0, e);
    }
  }
  return open ? total + (e0 - s0) : 0.0;
}

}  // namespace slidedp
