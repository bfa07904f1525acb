// Private to kernels/cpu/optim: argument checks and the sum-of-squares block loops shared by the
// public entry points (adamw.cc, grad_reduce.cc, sum_squares.cc). Built with baseline flags only.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/kernel_table.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels::detail {

// Ranges and pointers come from the executor, not from users: a bad one is a bug, so abort.
inline void check_range(int64_t begin, int64_t end) {
  SLIDEDP_CHECK(0 <= begin && begin <= end, "kernel range must satisfy 0 <= begin <= end");
}

template <class T>
SlotArgs<T> slot_args(const GradSlots<T>& s, int64_t begin, int64_t end) {
  check_range(begin, end);
  SLIDEDP_CHECK(!s.slots.empty(), "gradient reduction needs at least one slot");
  SLIDEDP_CHECK(s.slots.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), "too many slots");
  if (end > begin) {
    for (const T* p : s.slots) SLIDEDP_CHECK(p != nullptr, "null gradient slot");
  }
  return SlotArgs<T>{s.slots.data(), static_cast<int>(s.slots.size()), s.scale, s.accum};
}

// Runs fn(b, e) over [begin, end): on the calling thread when pool is null, else in tiles of
// tile_numel on the pool. The element-wise kernels give the same bits either way.
template <class Fn>
void run_tiled(ThreadPool* pool, int64_t begin, int64_t end, int64_t tile_numel, const Fn& fn) {
  if (end == begin) return;
  if (pool == nullptr) {
    fn(begin, end);
    return;
  }
  SLIDEDP_CHECK(tile_numel > 0, "tile_numel must be positive");
  pool->parallel_for_range(begin, end, tile_numel, fn);
}

// Sum of block sums over [0, n) in block order, blocks of kSumSquaresBlock (sum_squares.h).
template <class BlockSum>
double sum_blocks(int64_t n, const BlockSum& block_sum) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kSumSquaresBlock) {
    total += block_sum(b, (n - b < kSumSquaresBlock) ? n : b + kSumSquaresBlock);
  }
  return total;
}

// The same blocks computed one per tile on `pool`, then added in block order: the same bits as
// sum_blocks for any number of threads.
template <class BlockSum>
double sum_blocks(ThreadPool& pool, int64_t n, const BlockSum& block_sum) {
  if (n <= kSumSquaresBlock) return sum_blocks(n, block_sum);
  const int64_t num_blocks = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  std::vector<double> partial(static_cast<size_t>(num_blocks));
  pool.parallel_for(num_blocks, [&](int64_t t) {
    const int64_t b = t * kSumSquaresBlock;
    partial[static_cast<size_t>(t)] = block_sum(b, (n - b < kSumSquaresBlock) ? n : b + kSumSquaresBlock);
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace slidedp::kernels::detail
