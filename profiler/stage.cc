// Host arrays and the cache-size probe; see stage.h.
#include "profiler/stage.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/units.h"

namespace slidedp::profiler {

HostArray::HostArray(int64_t bytes, unsigned char fill) : bytes_(bytes) {
  SLIDEDP_CHECK(bytes >= 0);
  const std::size_t n = static_cast<std::size_t>((std::max<int64_t>(bytes, 1) + 4095) / 4096 * 4096);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, n));
  if (!p)
    throw RuntimeError(fmt::format("out of host memory allocating {}", format_bytes(static_cast<double>(n))));
  std::memset(p, fill, n);
  ptr_.reset(p);
}

void HostArray::Free::operator()(std::byte* p) const { std::free(p); }

int64_t last_level_cache_bytes() {
  // index3 is the L3 on x86 Linux; fall back through lower levels, then to a typical server L3.
  for (int idx : {3, 2}) {
    std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", idx));
    std::string s;
    if (!(in >> s) || s.empty()) continue;
    // sysfs writes binary units: "32768K" is 32 MiB.
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (v <= 0) continue;
    const char suffix = *end;
    return suffix == 'K' ? v << 10 : suffix == 'M' ? v << 20 : suffix == 'G' ? v << 30 : v;
  }
  return int64_t{32} << 20;
}

}  // namespace slidedp::profiler
