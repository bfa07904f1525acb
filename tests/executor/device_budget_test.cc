// The device memory budget both backends share (executor/device_budget.h), against a hand-kept
// ledger: counting, stream-ordered frees, out-of-order completion, waiting for the oldest pending
// free, the errors' numbers, and every block given back.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "common/error.h"
#include "executor/device_budget.h"

namespace slidedp::exec {
namespace {

// Blocks from a ledger: every take and give is recorded, so leaks and double gives show.
class LedgerBlocks final : public DeviceBlocks {
 public:
  Block take(const Request& r) override {
    storage_[next_] = std::make_unique<std::byte[]>(static_cast<size_t>(std::max<int64_t>(r.bytes, 1)));
    Block b{storage_[next_].get(), r.bytes};
    owner_[b.ptr] = next_++;
    ++taken;
    return b;
  }
  void give(const Block& b) override {
    ASSERT_TRUE(owner_.count(b.ptr)) << "give of a block never taken or given twice";
    storage_.erase(owner_[b.ptr]);
    owner_.erase(b.ptr);
    ++given;
  }
  int outstanding() const { return static_cast<int>(owner_.size()); }
  int taken = 0, given = 0;

 private:
  int next_ = 0;
  std::map<int, std::unique_ptr<std::byte[]>> storage_;
  std::map<std::byte*, int> owner_;
};

// An event the test completes by hand.
class ManualEvent final : public Event {
 public:
  bool done() const override { return done_.load(); }
  void wait_host() const override {
    while (!done_.load()) std::this_thread::yield();
  }
  void complete() { done_.store(true); }

 private:
  std::atomic<bool> done_{false};
};

TEST(DeviceBudget, CountsWhatItGrantsAndGivesBackAtOnceWithoutAnEvent) {
  LedgerBlocks blocks;
  DeviceBudget budget(0, 1000, blocks);
  DeviceBuffer a = budget.alloc(512, 500, "a");
  DeviceBuffer b = budget.alloc(256, 256, "b");
  EXPECT_EQ(a.bytes, 500);
  EXPECT_EQ(budget.in_use_bytes(), 768);
  budget.release(a, nullptr);
  EXPECT_EQ(budget.in_use_bytes(), 256);
  EXPECT_EQ(budget.high_water_bytes(), 768);
  EXPECT_EQ(blocks.outstanding(), 1);
  budget.release(b, nullptr);
  EXPECT_EQ(budget.in_use_bytes(), 0);
  EXPECT_EQ(blocks.outstanding(), 0);
}

TEST(DeviceBudget, ReleasesAfterAnEventOnlyOnceItCompletesInAnyOrder) {
  LedgerBlocks blocks;
  DeviceBudget budget(0, 1000, blocks);
  DeviceBuffer a = budget.alloc(300, 300, "a"), b = budget.alloc(300, 300, "b");
  auto ea = std::make_shared<ManualEvent>(), eb = std::make_shared<ManualEvent>();
  budget.release(a, ea);
  budget.release(b, eb);
  EXPECT_EQ(budget.in_use_bytes(), 600);  // nothing completed yet
  eb->complete();                         // the later one first (another stream)
  DeviceBuffer c = budget.alloc(100, 100, "c");  // an allocation reaps what is done
  EXPECT_EQ(budget.in_use_bytes(), 400);
  ea->complete();
  budget.release(c, nullptr);
  EXPECT_EQ(budget.in_use_bytes(), 300);  // `a` is done, but reclaimed only by the next allocation
  DeviceBuffer d = budget.alloc(1000, 1000, "d");  // the whole budget: fits once `a` is reaped
  EXPECT_EQ(budget.in_use_bytes(), 1000);
  budget.release(d, nullptr);
  EXPECT_EQ(blocks.outstanding(), 0);
  EXPECT_EQ(blocks.taken, blocks.given);
}

TEST(DeviceBudget, AnAllocationThatDoesNotFitWaitsForThePendingFree) {
  LedgerBlocks blocks;
  DeviceBudget budget(0, 1000, blocks);
  DeviceBuffer a = budget.alloc(800, 800, "a");
  auto ea = std::make_shared<ManualEvent>();
  budget.release(a, ea);
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ea->complete();
  });
  DeviceBuffer b = budget.alloc(800, 800, "b");  // blocks until `a` is freed
  completer.join();
  EXPECT_TRUE(ea->done());
  EXPECT_EQ(budget.in_use_bytes(), 800);
  EXPECT_EQ(budget.high_water_bytes(), 800);  // never both at once
  budget.release(b, nullptr);
}

TEST(DeviceBudget, OverBudgetIsInfeasibleWithTheNumbers) {
  LedgerBlocks blocks;
  DeviceBudget budget(3, 1000, blocks);
  try {
    budget.alloc(2048, 2000, "the whole model");
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3: the whole model needs 2.00 KiB but the device budget is 1000"), std::string::npos)
        << e.what();
  }
  DeviceBuffer a = budget.alloc(600, 600, "a");
  try {
    budget.alloc(600, 600, "activations");  // fits the budget alone, but nothing is pending
    FAIL() << "expected InfeasibleError";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("activations"), std::string::npos) << e.what();
  }
  budget.release(a, nullptr);
  EXPECT_EQ(blocks.taken, 1);  // the failed requests took nothing
}

TEST(DeviceBudget, GivesEveryLiveBlockBackWhenItGoes) {
  LedgerBlocks blocks;
  {
    DeviceBudget budget(0, 1000, blocks);
    budget.alloc(100, 100, "a");
    DeviceBuffer b = budget.alloc(100, 100, "b");
    budget.release(b, std::make_shared<ManualEvent>());  // never completes
  }
  EXPECT_EQ(blocks.taken, 2);
  EXPECT_EQ(blocks.given, 2);
  EXPECT_EQ(blocks.outstanding(), 0);
}

// Without --device-budget a CUDA run's budget is the GPU's memory minus the plan's reserve, shared by
// the ranks on that GPU, as slidedp-plan assumes (it was 16 GiB whatever the GPU). Closed form: an
// H200's 150,754,820,096 bytes (cudaDeviceProp::totalGlobalMem) minus 512 MiB.
TEST(DeviceBudget, TheDefaultGpuBudgetIsTheDeviceMemoryLessTheReserveSharedByItsRanks) {
  const int64_t h200 = 150'754'820'096, reserve = int64_t{512} << 20;
  EXPECT_EQ(default_gpu_budget_bytes(h200, reserve, 1), h200 - reserve);
  EXPECT_EQ(default_gpu_budget_bytes(h200, reserve, 2), (h200 - reserve) / 2);
  EXPECT_EQ(default_gpu_budget_bytes(h200, 0, 1), h200);
  try {
    default_gpu_budget_bytes(int64_t{1} << 30, int64_t{2} << 30, 1);
    ADD_FAILURE() << "a reserve above the GPU's memory was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gpu_mem_reserve_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slidedp::exec
