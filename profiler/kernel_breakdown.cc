// See kernel_breakdown.h.
#include "profiler/kernel_breakdown.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace slidedp::profiler {

std::vector<KernelTotal> sum_kernels(const std::vector<exec::MeasuredSpan>& spans, int rank) {
  std::map<std::string, KernelTotal> by_name;
  for (const exec::MeasuredSpan& s : spans) {
    if (s.rank != rank || std::strcmp(s.tag.category, "kernel") != 0) continue;
    std::string name = s.tag.what;
    const std::size_t colon = name.find(": ");
    if (colon != std::string::npos) name.erase(0, colon + 2);
    KernelTotal& t = by_name[name];
    t.kernel = name;
    ++t.calls;
    t.seconds += s.end_s - s.start_s;
  }
  std::vector<KernelTotal> out;
  for (auto& [name, t] : by_name) out.push_back(t);
  std::stable_sort(out.begin(), out.end(), [](const KernelTotal& a, const KernelTotal& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace slidedp::profiler
