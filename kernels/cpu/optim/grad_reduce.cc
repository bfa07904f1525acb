// N-way gradient reduction entry points: check the slots, then run the active level's kernel on the
// calling thread or tiled over a ThreadPool. The sum-of-squares forms use the fixed blocks of
// sum_squares.h relative to `begin`, so they equal sum_squares() of what reduce_grads writes.
#include "kernels/cpu/optim/grad_reduce.h"

#include <type_traits>

#include "kernels/cpu/optim/dispatch_util.h"
#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels {
namespace {

template <class T>
void reduce(ThreadPool* pool, const GradSlots<T>& slots, float* out, int64_t begin, int64_t end,
            int64_t tile_numel) {
  const detail::SlotArgs<T> a = detail::slot_args(slots, begin, end);
  SLIDEDP_CHECK(out != nullptr || end == begin, "null reduction output");
  const detail::KernelTable& t = detail::active_kernel_table();
  detail::run_tiled(pool, begin, end, tile_numel, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      t.reduce_f32(a, out, b, e);
    } else {
      t.reduce_bf16(a, out, b, e);
    }
  });
}

template <class T>
double reduce_sum_squares(ThreadPool* pool, const GradSlots<T>& slots, int64_t begin, int64_t end) {
  const detail::SlotArgs<T> a = detail::slot_args(slots, begin, end);
  const detail::KernelTable& t = detail::active_kernel_table();
  const auto block = [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      return t.reduce_sum_squares_block_f32(a, begin + b, begin + e);
    } else {
      return t.reduce_sum_squares_block_bf16(a, begin + b, begin + e);
    }
  };
  return pool ? detail::sum_blocks(*pool, end - begin, block) : detail::sum_blocks(end - begin, block);
}

}  // namespace

void reduce_grads(const GradSlots<float>& slots, float* out, int64_t begin, int64_t end) {
  reduce(nullptr, slots, out, begin, end, kTileNumel);
}
void reduce_grads(const GradSlots<bf16_bits>& slots, float* out, int64_t begin, int64_t end) {
  reduce(nullptr, slots, out, begin, end, kTileNumel);
}

void reduce_grads_accumulate(std::span<const float* const> slots, float scale, float* inout, int64_t begin,
                             int64_t end) {
  reduce(nullptr, GradSlots<float>{slots, scale, inout}, inout, begin, end, kTileNumel);
}
void reduce_grads_accumulate(std::span<const bf16_bits* const> slots, float scale, float* inout,
                             int64_t begin, int64_t end) {
  reduce(nullptr, GradSlots<bf16_bits>{slots, scale, inout}, inout, begin, end, kTileNumel);
}

double reduce_grads_sum_squares(const GradSlots<float>& slots, int64_t begin, int64_t end) {
  return reduce_sum_squares(nullptr, slots, begin, end);
}
double reduce_grads_sum_squares(const GradSlots<bf16_bits>& slots, int64_t begin, int64_t end) {
  return reduce_sum_squares(nullptr, slots, begin, end);
}

void reduce_grads(ThreadPool& pool, const GradSlots<float>& slots, float* out, int64_t begin, int64_t end,
                  int64_t tile_numel) {
  reduce(&pool, slots, out, begin, end, tile_numel);
}
void reduce_grads(ThreadPool& pool, const GradSlots<bf16_bits>& slots, float* out, int64_t begin, int64_t end,
                  int64_t tile_numel) {
  reduce(&pool, slots, out, begin, end, tile_numel);
}

double reduce_grads_sum_squares(ThreadPool& pool, const GradSlots<float>& slots, int64_t begin, int64_t end) {
  return reduce_sum_squares(&pool, slots, begin, end);
}
double reduce_grads_sum_squares(ThreadPool& pool, const GradSlots<bf16_bits>& slots, int64_t begin,
                                int64_t end) {
  return reduce_sum_squares(&pool, slots, begin, end);
}

}  // namespace slidedp::kernels
