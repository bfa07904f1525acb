// Collects provenance once per process. The git revision is captured at configure time
// (common/CMakeLists.txt) because binaries may run outside the source tree.
#include "common/provenance.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>

#include "common/build_info.h"

namespace slidedp {
namespace {

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown";
}

}  // namespace

const Provenance& provenance() {
  static const Provenance p = [] {
    Provenance out;
    out.git_revision = kBuildGitRevision;
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) out.host = host;
    out.cpu_model = read_cpu_model();
    out.cpu_count = static_cast<int>(std::thread::hardware_concurrency());
    out.build_type = kBuildType;
    out.compiler = kBuildCompiler;
    out.version = kBuildVersion;
    return out;
  }();
  return p;
}

std::string utc_timestamp() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace slidedp
