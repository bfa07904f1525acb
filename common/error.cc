// Abort path of SLIDEDP_CHECK: print where and why, then abort so a debugger or core dump sees it.
#include "common/error.h"

#include <cstdio>
#include <cstdlib>

namespace slidedp {

void check_failed(const char* expr, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "slidedp: internal check failed: %s at %s:%d%s%s\n", expr, file, line,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace slidedp
