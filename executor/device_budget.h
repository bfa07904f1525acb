// One device's memory budget, shared by the backends. The budget counts the bytes of the block
// each allocation holds (at least what it asks for; a cached block may be larger, never larger than
// the budget's room); a buffer released "after" an event is given back once that event has completed (frees
// happen in stream order, as the streams consume the buffer); an allocation that does not fit waits
// for the oldest pending free, and fails with the numbers when nothing is pending. Where the bytes
// come from is the backend's: aligned host memory on the CPU backend, cached cudaMalloc blocks on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>

#include "executor/backend.h"

namespace slidedp::exec {

// The backend's raw blocks. Both calls run with the budget's lock held.
class DeviceBlocks {
 public:
  struct Block {
    std::byte* ptr = nullptr;
    int64_t capacity = 0;  // bytes of the block (at least the bytes asked for)
  };
  struct Request {
    int64_t bytes = 0;          // what the allocation asks for (aligned)
    const char* what = "";      // for messages
    int64_t in_use = 0, budget = 0;  // the budget's state
    int64_t room = 0;           // budget - in_use: the largest block the budget can count
  };
  virtual ~DeviceBlocks() = default;
  virtual Block take(const Request& request) = 0;  // throws when it cannot
  virtual void give(const Block& block) = 0;
};

// The budget per rank when the run names none: the GPU's memory minus the plan's reserve (what
// slidedp-plan assumes of a GPU), shared evenly by the ranks placed on that GPU. InputError when the
// reserve leaves nothing.
int64_t default_gpu_budget_bytes(int64_t gpu_total_bytes, int64_t reserve_bytes, int ranks_on_gpu);

// The CPU backend's emulated devices have no memory of their own to ask: 16 GiB each unless told.
inline constexpr int64_t kDefaultEmulatedBudgetBytes = int64_t{16} << 30;

class DeviceBudget {
 public:
  // `blocks` must outlive the budget (declare it before the budget in the owning class).
  DeviceBudget(int rank, int64_t budget_bytes, DeviceBlocks& blocks) : rank_(rank), budget_(budget_bytes), blocks_(blocks) {}
  ~DeviceBudget();  // gives every block still allocated back to `blocks`
  DeviceBudget(const DeviceBudget&) = delete;
  DeviceBudget& operator=(const DeviceBudget&) = delete;

  // `need` is what the budget counts (the backend's aligned size of `bytes`); the buffer reports `bytes`.
  DeviceBuffer alloc(int64_t need, int64_t bytes, const char* what);
  // Without `after` the block is given back now; with it, once `after` has completed.
  void release(const DeviceBuffer& buffer, const EventPtr& after);

  int64_t budget_bytes() const { return budget_; }
  int64_t in_use_bytes() const;
  int64_t high_water_bytes() const;
  // High-water mark of the bytes allocated and not yet released, a deferred free counting as given
  // back at its release() call (Device::held_high_water_bytes).
  int64_t held_high_water_bytes() const;

 private:
  struct Live {
    DeviceBlocks::Block block;
    int64_t accounted = 0;  // bytes counted against the budget
  };
  struct Deferred {
    int64_t id;
    EventPtr after;
  };
  void free_locked(int64_t id);
  void reap_locked();  // gives back every deferred block whose event has completed

  int rank_;
  int64_t budget_;
  DeviceBlocks& blocks_;
  mutable std::mutex mutex_;
  std::map<int64_t, Live> live_;
  std::deque<Deferred> deferred_;
  int64_t in_use_ = 0, high_water_ = 0, next_id_ = 0;
  int64_t held_ = 0, held_high_water_ = 0;
};

}  // namespace slidedp::exec
