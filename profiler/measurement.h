// One measured case and the collection of them. A Measurement keeps every repetition's value (the
// raw samples the run log stores) with what was measured; its Spread is what the table, the JSON
// and the profile report. Stages append; nothing is dropped, so the SQLite file holds the full run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runlog/run_log.h"
#include "profiler/stats.h"

namespace slidedp::profiler {

struct Measurement {
  std::string stage;           // "host_memory" | "cpu_update" | "links" | "fabric" | "units" | "gpu"
  std::string name;            // what, with its unit in the name: "triad_gbps", "h2d_s", "fwd_s"
  nlohmann::json params;       // the case: {"threads": 2}, {"bytes": 1048576, "mode": "alone"}
  std::string unit;            // "GB/s", "s", "params/s"
  std::vector<double> values;  // one per repetition

  Spread spread() const { return summarize(values); }
  // "host_memory.triad_gbps"
  std::string key() const { return stage + "." + name; }
};

class Measurements {
 public:
  // Appends and returns the stored record (valid until the next add).
  const Measurement& add(Measurement m);
  const std::vector<Measurement>& all() const { return items_; }
  // One run-log sample per repetition: measurement = key(), params = the case plus {"rep": i}.
  std::vector<runlog::ProfileSample> samples() const;

 private:
  std::vector<Measurement> items_;
};

}  // namespace slidedp::profiler
