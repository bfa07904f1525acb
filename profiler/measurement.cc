// Measurement records; see measurement.h.
#include "profiler/measurement.h"

#include "common/error.h"

namespace slidedp::profiler {

const Measurement& Measurements::add(Measurement m) {
  SLIDEDP_CHECK(!m.values.empty(), "measurement " + m.key() + " without values");
  items_.push_back(std::move(m));
  return items_.back();
}

std::vector<runlog::ProfileSample> Measurements::samples() const {
  std::vector<runlog::ProfileSample> out;
  for (const Measurement& m : items_) {
    for (std::size_t i = 0; i < m.values.size(); ++i) {
      nlohmann::json p = m.params.is_object() ? m.params : nlohmann::json::object();
      p["rep"] = i;
      out.push_back({m.key(), p.dump(), m.values[i], m.unit});
    }
  }
  return out;
}

}  // namespace slidedp::profiler
