// The global gradient norm of a clipped (or skip-checked) step, summed while the gradient is reduced
// instead of by a pass over it after the backward. The sum is the one a pass would give, bit for bit:
// each unit's accumulator is cut into blocks of kSumSquaresBlock (from the unit's first held
// element), a block is summed (kernels::sum_squares) once its last contribution of the step has been
// added, and blocks are added in block order per unit, then units in unit order -- exactly
// kernels::sum_squares(pool, accumulator, own_numel) summed over units. Which job finishes a block
// depends on chunking, routes and arrival order; what is summed and in what order does not.
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"

namespace slidedp::exec {

class GradNormBlocks {
 public:
  // `held`: elements of each unit's accumulator (UnitState::own_numel); `writes`: contributions every
  // element of the unit receives in a step (micro-steps x parts x serial ranks).
  GradNormBlocks(const std::vector<int64_t>& held, const std::vector<int64_t>& writes);

  // Elements [begin, end) of `unit`'s accumulator `acc` received one more contribution: sums every
  // block this completes (over the pool). Called by one thread at a time (the updater's).
  void added(ThreadPool& pool, int unit, const float* acc, int64_t begin, int64_t end);
  // Every block of the step complete.
  bool complete() const { return blocks_left_ == 0; }
  // The step's sum of squares (complete() required); clears the counts for the next step.
  double take_sum();

 private:
  struct Unit {
    int64_t held = 0, writes = 0;
    std::vector<int64_t> received;  // per block: element contributions so far this step
    std::vector<double> sums;       // per block, once complete
  };
  std::vector<Unit> units_;
  int64_t blocks_total_ = 0, blocks_left_ = 0;
  std::vector<int64_t> done_;  // scratch: blocks completed by one call
};

}  // namespace slidedp::exec
