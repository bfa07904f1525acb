// Values parsed once per process: the embedded presets (hardware profiles, model cards), which the
// planner, the sweeps and every spec that names one ask for again and again.
#pragma once

#include <map>
#include <mutex>
#include <string>

namespace slidedp {

// parse() the first time `key` is asked for at this call site, a copy of that value afterwards
// (thread-safe). An exception from parse() is passed on and nothing is kept.
template <class Value, class Parse>
Value parsed_once(const std::string& key, Parse&& parse) {
  static std::mutex mutex;
  static std::map<std::string, Value> values;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = values.find(key); it != values.end()) return it->second;
  }
  Value v = parse();
  std::lock_guard<std::mutex> lock(mutex);
  return values.emplace(key, std::move(v)).first->second;
}

}  // namespace slidedp
