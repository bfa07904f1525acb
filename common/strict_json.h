// The one JSON parse for files users hand us (config.json, trainer_state.json, safetensors headers and
// indexes, JSON-lines records). nlohmann accepts what we must not: a repeated key keeps the last value
// silently, and a number beyond double range ("1e400") throws out_of_range, which the tools would
// report as an internal error. Here both are bad input naming the file: InputError, exit code 2.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace slidedp {

// Parses `text` (from `origin`, a path or "path:line"); throws InputError naming origin for malformed
// JSON, a number out of double range, or a key repeated within one object.
template <typename Json = nlohmann::json>
Json parse_json_strict(std::string_view text, const std::string& origin) {
  std::vector<std::set<std::string>> open_objects;  // keys seen, per object being parsed
  std::string duplicate;
  typename Json::parser_callback_t on_event = [&](int, typename Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.template get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw InputError(origin, fmt::format("malformed JSON: {}", e.what()));
  }
  if (!duplicate.empty()) throw InputError(origin, fmt::format("repeats the key '{}' within one object", duplicate));
  return j;
}

}  // namespace slidedp
