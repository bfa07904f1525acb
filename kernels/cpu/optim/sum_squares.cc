// Sum-of-squares entry points: fixed blocks of kSumSquaresBlock, each summed by the active level's
// kernel with 16 double lanes, added in block order (one block per tile in the parallel forms).
#include "kernels/cpu/optim/sum_squares.h"

#include <type_traits>

#include "kernels/cpu/optim/dispatch_util.h"
#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels {
namespace {

template <class T>
double sum_sq(ThreadPool* pool, const T* x, int64_t n) {
  detail::check_range(0, n);
  SLIDEDP_CHECK(x != nullptr || n == 0, "null sum-of-squares input");
  const detail::KernelTable& t = detail::active_kernel_table();
  const auto block = [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      return t.sum_squares_block_f32(x + b, e - b);
    } else {
      return t.sum_squares_block_bf16(x + b, e - b);
    }
  };
  return pool ? detail::sum_blocks(*pool, n, block) : detail::sum_blocks(n, block);
}

}  // namespace

double sum_squares(const float* x, int64_t n) { return sum_sq(nullptr, x, n); }
double sum_squares(const bf16_bits* x, int64_t n) { return sum_sq(nullptr, x, n); }
double sum_squares(ThreadPool& pool, const float* x, int64_t n) { return sum_sq(&pool, x, n); }
double sum_squares(ThreadPool& pool, const bf16_bits* x, int64_t n) { return sum_sq(&pool, x, n); }

}  // namespace slidedp::kernels
