// Chrome trace writer; see chrome_trace.h. Tracks become threads of one process, named and sorted
// in first-seen order so ranks appear in order.
#include "model/chrome_trace.h"

#include <map>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace slidedp {

std::string chrome_trace_json(const std::vector<TimelineSpan>& spans, const std::string& process_name) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", 0}, {"name", "process_name"}, {"args", {{"name", process_name}}}});
  std::map<std::string, int> tids;
  for (const auto& s : spans) {
    auto [it, inserted] = tids.emplace(s.track, static_cast<int>(tids.size()) + 1);
    if (inserted) {
      events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", it->second}, {"name", "thread_name"}, {"args", {{"name", s.track}}}});
      events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", it->second}, {"name", "thread_sort_index"}, {"args", {{"sort_index", it->second}}}});
    }
    events.push_back({{"ph", "X"},
                      {"pid", 1},
                      {"tid", it->second},
                      {"name", s.name},
                      {"cat", s.category},
                      {"ts", s.start_s * 1e6},
                      {"dur", (s.end_s - s.start_s) * 1e6}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

void write_chrome_trace(const std::string& path, const std::vector<TimelineSpan>& spans,
                        const std::string& process_name) {
  write_file_atomic(path, chrome_trace_json(spans, process_name));
}

}  // namespace slidedp
