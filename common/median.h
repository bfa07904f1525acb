// The median of a sample (0 for an empty one): what measured step times are reported as, since on
// a shared host one step stretched by the OS would carry a mean.
#pragma once

#include <algorithm>
#include <vector>

namespace slidedp {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace slidedp
