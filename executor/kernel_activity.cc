// See kernel_activity.h.
#include "executor/kernel_activity.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

namespace slidedp::exec {

AttributedActivities attribute_activities(const std::vector<DeviceActivity>& activities,
                                          const std::vector<ActivityStream>& streams, const ActivityClock& clock,
                                          const std::vector<MeasuredSpan>& measured, std::set<std::string>& names) {
  std::map<std::pair<uint32_t, uint32_t>, const ActivityStream*> by_id;
  for (const ActivityStream& s : streams) by_id[{s.device, s.stream}] = &s;
  // The measured spans of each (rank, stream), by start: a stream runs its work in order, so they do
  // not overlap and the one holding a time is the last that starts at or before it.
  std::map<std::pair<int, std::string>, std::vector<const MeasuredSpan*>> tracks;
  for (const MeasuredSpan& m : measured) tracks[{m.rank, m.stream}].push_back(&m);
  for (auto& [key, v] : tracks)
    std::sort(v.begin(), v.end(), [](const MeasuredSpan* a, const MeasuredSpan* b) { return a->start_s < b->start_s; });

  AttributedActivities out;
  for (const DeviceActivity& a : activities) {
    auto it = by_id.find({a.device, a.stream});
    if (it == by_id.end()) {
      ++out.unknown_stream;
      continue;
    }
    const ActivityStream& s = *it->second;
    MeasuredSpan span;
    span.rank = s.rank;
    span.stream = s.name + ".kernels";
    span.start_s = clock.to_trace_s(a.start_ns);
    span.end_s = clock.to_trace_s(a.end_ns);
    span.tag.category = "kernel";
    const double mid = 0.5 * (span.start_s + span.end_s);
    const MeasuredSpan* holder = nullptr;
    auto t = tracks.find({s.rank, s.name});
    if (t != tracks.end()) {
      const auto& v = t->second;
      auto after = std::upper_bound(v.begin(), v.end(), mid,
                                    [](double x, const MeasuredSpan* m) { return x < m->start_s; });
      if (after != v.begin() && mid <= (*std::prev(after))->end_s) holder = *std::prev(after);
    }
    if (holder != nullptr) {
      span.tag.unit = holder->tag.unit;
      span.tag.chunk = holder->tag.chunk;
      span.tag.step = holder->tag.step;
    } else {
      ++out.outside_spans;
    }
    // "<phase>: <kernel>", e.g. "bwd: rmsnorm_backward_kernel"
    span.tag.what = names.insert(holder != nullptr ? std::string(holder->tag.what) + ": " + a.name : a.name).first->c_str();
    out.spans.push_back(span);
  }
  return out;
}

std::vector<KernelTotal> sum_kernels(const std::vector<MeasuredSpan>& spans, int rank) {
  std::map<std::string, KernelTotal> by_name;
  for (const MeasuredSpan& s : spans) {
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

}  // namespace slidedp::exec
