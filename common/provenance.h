// Where a result came from (STYLE habit 8): git revision, host, CPU, build type, compiler. Every
// benchmark row, sweep file and run-log entry carries one.
#pragma once

#include <string>

namespace slidedp {

struct Provenance {
  std::string git_revision;  // short hash, "+dirty" when built from a modified tree
  std::string host;
  std::string cpu_model;
  int cpu_count = 0;
  std::string build_type;
  std::string compiler;
  std::string version;  // SlideDP version
};

const Provenance& provenance();

// "2026-11-29T21:45:03Z"
std::string utc_timestamp();

}  // namespace slidedp
