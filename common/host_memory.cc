// See host_memory.h.
#include "common/host_memory.h"

#include <unistd.h>

namespace slidedp {

int64_t physical_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * static_cast<int64_t>(page) : 0;
}

}  // namespace slidedp
