// Chrome trace JSON (the "traceEvents" format Perfetto and chrome://tracing open): one track per
// rank and resource, complete ("X") events in microseconds. Used for predicted timelines (simulator)
// and measured ones (executor), so both read the same way.
#pragma once

#include <string>
#include <vector>

#include "model/simulator.h"

namespace slidedp {

// Returns the JSON text. `process_name` labels the process row (e.g. "predicted: slidedp").
std::string chrome_trace_json(const std::vector<TimelineSpan>& spans, const std::string& process_name);
// Writes it atomically to `path` (throws IoError).
void write_chrome_trace(const std::string& path, const std::vector<TimelineSpan>& spans,
                        const std::string& process_name);

}  // namespace slidedp
