// common/thread_pool: every tile exactly once, the caller participates, exceptions reach the caller
// and leave the pool usable, concurrent and nested callers make progress, bad sizes are input errors.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"

namespace slidedp {
namespace {

TEST(ThreadPool, EveryTileRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t tiles : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> count(static_cast<size_t>(tiles));
      pool.parallel_for(tiles, [&](int64_t t) { count[static_cast<size_t>(t)].fetch_add(1); });
      for (const auto& c : count) EXPECT_EQ(c.load(), 1) << "threads=" << threads << " tiles=" << tiles;
    }
  }
}

TEST(ThreadPool, RangeTilesCoverTheRangeExactly) {
  ThreadPool pool(3);
  const int64_t begin = 7, end = 1007;
  std::vector<std::atomic<int>> hit(static_cast<size_t>(end));
  std::atomic<int64_t> tiles{0};
  pool.parallel_for_range(begin, end, 64, [&](int64_t b, int64_t e) {
    EXPECT_LE(e - b, 64);
    EXPECT_GT(e, b);
    tiles.fetch_add(1);
    for (int64_t i = b; i < e; ++i) hit[static_cast<size_t>(i)].fetch_add(1);
  });
  EXPECT_EQ(tiles.load(), (end - begin + 63) / 64);
  for (int64_t i = 0; i < end; ++i) EXPECT_EQ(hit[static_cast<size_t>(i)].load(), i >= begin ? 1 : 0) << i;
}

TEST(ThreadPool, CallerParticipates) {
  ThreadPool pool(1);  // no workers: everything runs on the caller
  std::set<std::thread::id> ids;
  pool.parallel_for(10, [&](int64_t) { ids.insert(std::this_thread::get_id()); });
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

TEST(ThreadPool, ExceptionsPropagateAndPoolStaysUsable) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(1000,
                                 [&](int64_t t) {
                                   ran.fetch_add(1);
                                   if (t == 37) throw std::runtime_error("tile 37");
                                 }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t t) { sum.fetch_add(t); });
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

TEST(ThreadPool, ConcurrentCallersShareOnePool) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<int64_t> s{0};
        pool.parallel_for(64, [&](int64_t t) { s.fetch_add(t + c); });
        sums[static_cast<size_t>(c)] += s.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(sums[static_cast<size_t>(c)], 50 * (63 * 64 / 2 + 64 * c)) << c;
}

TEST(ThreadPool, NestedCallsDoNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, [&](int64_t) { pool.parallel_for(16, [&](int64_t t) { total.fetch_add(t); }); });
  EXPECT_EQ(total.load(), 8 * (15 * 16 / 2));
}

TEST(ThreadPool, BadSizesAreInputErrors) {
  EXPECT_THROW(ThreadPool(0), InputError);
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), InputError);
  EXPECT_GE(ThreadPool::available_cpus(), 1);
}

}  // namespace
}  // namespace slidedp
