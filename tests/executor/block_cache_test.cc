// The CUDA backend's block cache (executor/block_cache.h) under the device budget, with a fake
// driver that owns a fixed amount of "device" memory: what the device physically holds (blocks in
// use plus idle cached ones) never exceeds the budget, the budget counts each block's capacity, a
// repeated pattern of sizes reaches the driver only in its first round, and a driver out of memory
// makes the cache give back its idle blocks and retry before the clear error.
#include "executor/block_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"

namespace slidedp::exec {
namespace {

// Device memory of `capacity` bytes; every allocation and free is checked.
struct FakeDevice {
  int64_t capacity = 0, used = 0, peak = 0, frees = 0;
  std::set<std::byte*> live;
  std::vector<std::unique_ptr<std::byte[]>> storage;
  BlockCache::Driver driver() {
    BlockCache::Driver d;
    d.allocate = [this](int64_t bytes) -> std::byte* {
      if (used + bytes > capacity) return nullptr;
      storage.push_back(std::make_unique<std::byte[]>(static_cast<size_t>(bytes)));
      used += bytes;
      peak = std::max(peak, used);
      sizes[storage.back().get()] = bytes;
      live.insert(storage.back().get());
      return storage.back().get();
    };
    d.free = [this](std::byte* p) {
      EXPECT_TRUE(live.erase(p)) << "free of a block never allocated or freed twice";
      used -= sizes[p];
      ++frees;
    };
    d.describe = [] { return std::string("fake device"); };
    return d;
  }
  std::map<std::byte*, int64_t> sizes;
};

TEST(BlockCache, PhysicalMemoryStaysWithinTheBudgetAndTheBudgetCountsCapacity) {
  FakeDevice dev;
  dev.capacity = int64_t{1} << 40;  // the driver never refuses: only the budget limits
  const int64_t budget = 40 << 20;
  BlockCache cache(0, dev.driver());
  {
    DeviceBudget b(0, budget, cache);
    std::mt19937_64 rng(7);
    std::vector<DeviceBuffer> live;
    for (int i = 0; i < 4000; ++i) {
      if (!live.empty() && (rng() % 2 == 0 || b.in_use_bytes() > budget / 2)) {
        const size_t k = rng() % live.size();
        b.release(live[k], nullptr);
        live.erase(live.begin() + static_cast<long>(k));
      } else {
        const int64_t bytes = (int64_t{1} << (10 + rng() % 12)) + static_cast<int64_t>(rng() % 4096) * 256;
        if (b.in_use_bytes() + bytes <= budget) live.push_back(b.alloc(bytes, bytes, "buffer"));
      }
      ASSERT_LE(cache.physical_bytes(), budget) << "step " << i;
      ASSERT_LE(b.in_use_bytes(), budget);
      ASSERT_EQ(cache.physical_bytes(), b.in_use_bytes() + cache.idle_bytes()) << "the budget counts capacities";
      ASSERT_EQ(dev.used, cache.physical_bytes());
    }
    for (const DeviceBuffer& d : live) b.release(d, nullptr);
    EXPECT_GT(dev.frees, 0) << "the random pattern must have needed evictions";
  }
  EXPECT_GT(dev.used, 0) << "idle blocks stay cached while the cache lives";
}

TEST(BlockCache, ARepeatedStepReachesTheDriverOnlyInItsFirstRound) {
  FakeDevice dev;
  dev.capacity = int64_t{1} << 30;
  BlockCache cache(0, dev.driver());
  DeviceBudget b(0, 64 << 20, cache);
  const std::vector<int64_t> step = {4 << 20, 1 << 20, 3 << 20, 4 << 20, 256 << 10};
  for (int round = 0; round < 5; ++round) {
    std::vector<DeviceBuffer> bufs;
    for (int64_t s : step) bufs.push_back(b.alloc(s, s, "x"));
    for (const DeviceBuffer& d : bufs) b.release(d, nullptr);
    EXPECT_EQ(cache.driver_allocations(), static_cast<int64_t>(step.size())) << "round " << round;
  }
  EXPECT_EQ(dev.frees, 0);
}

TEST(BlockCache, ALargerCachedBlockIsUsedOnlyWithinTheRoomAndIdleBlocksMakeWay) {
  FakeDevice dev;
  dev.capacity = int64_t{1} << 30;
  BlockCache cache(0, dev.driver());
  DeviceBudget b(0, 10 << 20, cache);
  // an idle 5 MiB block; a 4.5 MiB request fits it (within 25%) when the room allows
  b.release(b.alloc(5 << 20, 5 << 20, "a"), nullptr);
  DeviceBuffer x = b.alloc(9 << 19, 9 << 19, "b");
  EXPECT_EQ(cache.driver_allocations(), 1);
  EXPECT_EQ(b.in_use_bytes(), 5 << 20) << "the budget counts the 5 MiB block, not the 4.5 MiB asked for";
  b.release(x, nullptr);
  // 5.5 MiB in use (new), the 5 MiB block idle: 10.5 MiB physical would cross the budget, so the
  // idle block is freed first
  DeviceBuffer y = b.alloc(11 << 19, 11 << 19, "c");
  EXPECT_EQ(dev.frees, 1);
  b.release(b.alloc(4 << 20, 4 << 20, "d"), nullptr);  // an idle 4 MiB block, 9.5 MiB physical
  // 3.5 MiB more with 4.5 MiB of room: the idle 4 MiB block (within 25%) fits the room and is reused
  DeviceBuffer z = b.alloc(7 << 19, 7 << 19, "e");
  EXPECT_EQ(b.in_use_bytes(), (11 << 19) + (4 << 20)) << "the budget counts the reused 4 MiB block";
  EXPECT_LE(cache.physical_bytes(), 10 << 20);
  b.release(z, nullptr);
  b.release(y, nullptr);
  // the same request with only 3.75 MiB of room must not get the 4 MiB block
  const DeviceBlocks::Block fresh = cache.take({7 << 19, "f", 0, int64_t{1} << 30, 15 << 18});
  EXPECT_EQ(fresh.capacity, 7 << 19);
  cache.give(fresh);
}

TEST(BlockCache, ADriverOutOfMemoryGivesBackIdleBlocksThenFailsClearly) {
  FakeDevice dev;
  dev.capacity = 8 << 20;  // less than the budget: the driver refuses first
  BlockCache cache(3, dev.driver());
  DeviceBudget b(3, 64 << 20, cache);
  b.release(b.alloc(6 << 20, 6 << 20, "old"), nullptr);  // idle, of a size nobody asks for again
  DeviceBuffer x = b.alloc(7 << 20, 7 << 20, "new");       // needs the idle block freed
  EXPECT_EQ(dev.frees, 1);
  try {
    b.alloc(2 << 20, 2 << 20, "too much");
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 3"), std::string::npos) << m;
    EXPECT_NE(m.find("too much"), std::string::npos) << m;
    EXPECT_NE(m.find("fake device"), std::string::npos) << m;
  }
  b.release(x, nullptr);
}

}  // namespace
}  // namespace slidedp::exec
