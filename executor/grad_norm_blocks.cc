#include "executor/grad_norm_blocks.h"

#include <algorithm>

#include "common/error.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::exec {

namespace {
constexpr int64_t kBlock = kernels::kSumSquaresBlock;
int64_t block_count(int64_t n) { return (n + kBlock - 1) / kBlock; }
}  // namespace

GradNormBlocks::GradNormBlocks(const std::vector<int64_t>& held, const std::vector<int64_t>& writes) {
  SLIDEDP_CHECK(held.size() == writes.size(), "norm blocks: one write count per unit");
  units_.resize(held.size());
  for (std::size_t u = 0; u < held.size(); ++u) {
    Unit& x = units_[u];
    x.held = held[u];
    x.writes = writes[u];
    x.received.assign(static_cast<std::size_t>(block_count(x.held)), 0);
    x.sums.assign(x.received.size(), 0.0);
    blocks_total_ += static_cast<int64_t>(x.received.size());
  }
  blocks_left_ = blocks_total_;
}

void GradNormBlocks::added(ThreadPool& pool, int unit, const float* acc, int64_t begin, int64_t end) {
  Unit& x = units_.at(static_cast<std::size_t>(unit));
  SLIDEDP_CHECK(0 <= begin && begin <= end && end <= x.held, "norm blocks: range outside the accumulator");
  done_.clear();
  for (int64_t k = begin / kBlock; k * kBlock < end; ++k) {
    const int64_t b = k * kBlock, e = std::min(b + kBlock, x.held);
    int64_t& got = x.received[static_cast<std::size_t>(k)];
    got += std::min(e, end) - std::max(b, begin);
    SLIDEDP_CHECK(got <= (e - b) * x.writes, "norm blocks: more contributions than the step has");
    if (got == (e - b) * x.writes) done_.push_back(k);
  }
  pool.parallel_for_range(0, static_cast<int64_t>(done_.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t k = done_[static_cast<std::size_t>(i)];
      const int64_t b = k * kBlock, e = std::min(b + kBlock, x.held);
      x.sums[static_cast<std::size_t>(k)] = kernels::sum_squares(acc + b, e - b);
    }
  });
  blocks_left_ -= static_cast<int64_t>(done_.size());
}

double GradNormBlocks::take_sum() {
  SLIDEDP_CHECK(complete(), "norm blocks: the step's gradient is not complete");
  double total = 0;
  for (Unit& x : units_) {
    double unit_sum = 0;  // as kernels::sum_squares(pool, acc, held): blocks in order, from 0
    for (double s : x.sums) unit_sum += s;
    total += unit_sum;
    std::fill(x.received.begin(), x.received.end(), 0);
  }
  blocks_left_ = blocks_total_;
  return total;
}

}  // namespace slidedp::exec
