// Deterministic sum of squares, the partial of a global gradient norm. Squares of fp32 values are
// exact in double; they are summed in a fixed order that depends only on n, never on threads:
// x is cut into blocks of kSumSquaresBlock elements; in a block, element j goes to double lane
// j % 16 (summed in increasing j), the 16 lanes are combined by a fixed pairwise tree (lane i += lane
// i+8, then +4, +2, +1), and block sums are added in block order. Bytes per element: 4 or 2.
#pragma once

#include <cstdint>

#include "common/bf16.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels {

double sum_squares(const float* x, int64_t n);      // x: (n,) fp32 host buffer
double sum_squares(const bf16_bits* x, int64_t n);  // x: (n,) bf16 host buffer

// One block per tile; bitwise equal to the range forms for any pool size.
double sum_squares(ThreadPool& pool, const float* x, int64_t n);
double sum_squares(ThreadPool& pool, const bf16_bits* x, int64_t n);

}  // namespace slidedp::kernels
