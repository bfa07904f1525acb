#include "executor/device_budget.h"

#include <fmt/format.h>

#include <string>

#include "common/error.h"
#include "common/units.h"

namespace slidedp::exec {

int64_t default_gpu_budget_bytes(int64_t gpu_total_bytes, int64_t reserve_bytes, int ranks_on_gpu) {
  SLIDEDP_CHECK(ranks_on_gpu >= 1);
  if (reserve_bytes < 0 || gpu_total_bytes - reserve_bytes <= 0)
    throw InputError("plan: gpu_mem_reserve_bytes",
                     fmt::format("a reserve of {} bytes leaves nothing of the GPU's {} bytes; lower it or pass "
                                 "--device-budget",
                                 reserve_bytes, gpu_total_bytes));
  return (gpu_total_bytes - reserve_bytes) / ranks_on_gpu;
}

DeviceBudget::~DeviceBudget() {
  for (auto& [id, live] : live_) blocks_.give(live.block);
}

DeviceBuffer DeviceBudget::alloc(int64_t need, int64_t bytes, const char* what) {
  SLIDEDP_CHECK(need >= bytes && bytes >= 0);
  if (need > budget_)
    throw InfeasibleError(fmt::format("rank {}: {} needs {} but the device budget is {}", rank_, what,
                                      format_bytes(static_cast<double>(need)), format_bytes(static_cast<double>(budget_))));
  for (;;) {
    EventPtr wait_for;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reap_locked();
      if (in_use_ + need <= budget_) {
        const DeviceBlocks::Block block = blocks_.take({need, what, in_use_, budget_, budget_ - in_use_});
        SLIDEDP_CHECK(block.capacity >= need && block.capacity <= budget_ - in_use_,
                      "device blocks returned a block outside [need, room]");
        const int64_t id = next_id_++;
        live_[id] = Live{block, block.capacity};
        in_use_ += block.capacity;
        high_water_ = std::max(high_water_, in_use_);
        held_ += block.capacity;
        held_high_water_ = std::max(held_high_water_, held_);
        return DeviceBuffer{block.ptr, bytes, id};
      }
      if (deferred_.empty())
        throw InfeasibleError(fmt::format("rank {}: device memory budget {} exceeded: {} in use, {} more needed for {}", rank_,
                                          format_bytes(static_cast<double>(budget_)), format_bytes(static_cast<double>(in_use_)),
                                          format_bytes(static_cast<double>(need)), what));
      wait_for = deferred_.front().after;  // frees happen in stream order: wait for the oldest
    }
    wait_for->wait_host();
  }
}

void DeviceBudget::release(const DeviceBuffer& buffer, const EventPtr& after) {
  if (buffer.id < 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(buffer.id);
  SLIDEDP_CHECK(it != live_.end(), "release of unknown device buffer " + std::to_string(buffer.id));
  held_ -= it->second.accounted;
  if (!after) {
    free_locked(buffer.id);
    return;
  }
  deferred_.push_back({buffer.id, after});
  reap_locked();
}

int64_t DeviceBudget::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

int64_t DeviceBudget::high_water_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return high_water_;
}

int64_t DeviceBudget::held_high_water_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_high_water_;
}

void DeviceBudget::free_locked(int64_t id) {
  auto it = live_.find(id);
  SLIDEDP_CHECK(it != live_.end(), "double free of device buffer " + std::to_string(id));
  blocks_.give(it->second.block);
  in_use_ -= it->second.accounted;
  live_.erase(it);
}

void DeviceBudget::reap_locked() {
  // Entries may complete out of order (different streams): give back every one that is done.
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (it->after->done()) {
      free_locked(it->id);
      it = deferred_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace slidedp::exec
