// The CUDA backend's device blocks, with the driver calls injected so the policy is tested on the
// CPU (tests/executor/block_cache_test.cc). Blocks are allocated once and cached when given back,
// because cudaFree synchronizes the whole device; a request reuses the smallest cached block that is
// at most 25% (or 1 MiB) larger and still fits the budget's room. What the device physically holds,
// the blocks in use plus the idle cached ones, never exceeds the budget: before a new allocation
// that would cross it, idle blocks are freed, largest first. The pipeline asks for the same sizes
// every step, so after the first step nothing reaches the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "executor/device_budget.h"

namespace slidedp::exec {

class BlockCache final : public DeviceBlocks {
 public:
  struct Driver {
    std::function<std::byte*(int64_t bytes)> allocate;  // nullptr when the device is out of memory
    std::function<void(std::byte*)> free;
    std::function<std::string()> describe;               // for the out-of-memory message
  };
  BlockCache(int rank, Driver driver) : rank_(rank), driver_(std::move(driver)) {}
  ~BlockCache() override;  // frees every cached block (the budget gives its live ones back first)
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  Block take(const Request& request) override;
  void give(const Block& block) override;

  int64_t physical_bytes() const { return physical_; }  // blocks in use + idle
  int64_t idle_bytes() const { return idle_; }
  int64_t driver_allocations() const { return allocations_; }

 private:
  void free_idle_largest();

  int rank_;
  Driver driver_;
  std::multimap<int64_t, std::byte*> cache_;  // capacity -> idle block
  int64_t physical_ = 0, idle_ = 0, allocations_ = 0;
};

}  // namespace slidedp::exec
