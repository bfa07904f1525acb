// See block_cache.h.
#include "executor/block_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/units.h"

namespace slidedp::exec {

BlockCache::~BlockCache() {
  for (auto& [capacity, ptr] : cache_) driver_.free(ptr);
}

DeviceBlocks::Block BlockCache::take(const Request& r) {
  const int64_t need = r.bytes;
  const int64_t limit = std::min(std::max(need + need / 4, need + (int64_t{1} << 20)), r.room);
  auto it = cache_.lower_bound(need);
  if (it != cache_.end() && it->first <= limit) {
    Block b{it->second, it->first};
    idle_ -= it->first;
    cache_.erase(it);
    return b;
  }
  // A new block: first make physical room, so blocks in use plus idle ones stay within the budget.
  while (physical_ + need > r.budget && !cache_.empty()) free_idle_largest();
  std::byte* p = driver_.allocate(need);
  if (p == nullptr) {  // cached blocks of other sizes may be what is missing: give them all back
    while (!cache_.empty()) free_idle_largest();
    p = driver_.allocate(need);
  }
  if (p == nullptr)
    throw InfeasibleError(fmt::format(
        "rank {}: out of device memory allocating {} for {}: {} in use of the budget {}{} (lower the device budget "
        "or the plan's memory)",
        rank_, format_bytes(static_cast<double>(need)), r.what, format_bytes(static_cast<double>(r.in_use)),
        format_bytes(static_cast<double>(r.budget)), driver_.describe ? ", " + driver_.describe() : std::string()));
  ++allocations_;
  physical_ += need;
  return Block{p, need};
}

void BlockCache::give(const Block& block) {
  cache_.emplace(block.capacity, block.ptr);
  idle_ += block.capacity;
}

void BlockCache::free_idle_largest() {
  auto last = std::prev(cache_.end());
  driver_.free(last->second);
  physical_ -= last->first;
  idle_ -= last->first;
  cache_.erase(last);
}

}  // namespace slidedp::exec
