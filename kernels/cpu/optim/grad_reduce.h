// N-way gradient reduction on the host: the per-rank gradient buffers of one chunk (bf16 or fp32
// staging slots) are summed into fp32 in fixed slot order, so the result never depends on which
// rank's copy landed first or on thread timing. Per element, in fp32:
//   sum = ((slot[0] + slot[1]) + slot[2]) + ...       (bf16 slots are widened exactly first)
//   out = accum ? fma(sum, scale, accum) : sum * scale
// Bytes per element: read N * sizeof(slot) (+4 with accum), write 4.
#pragma once

#include <cstdint>
#include <span>

#include "common/bf16.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels {

// The N per-rank gradient buffers of one chunk, summed in slot order.
template <class T>  // T = float or bf16_bits
struct GradSlots {
  std::span<const T* const> slots;  // N >= 1 pointers, each a (numel,) host buffer of the chunk
  float scale = 1.0f;               // multiplies the slot sum (averaging over ranks and tokens)
  const float* accum = nullptr;     // optional (numel,) fp32 running sum of earlier micro-batches
};

// Range forms over [begin, end) of the chunk, on the calling thread. out is (numel,) fp32; it may be
// slots.accum itself (accumulate in place) but must not otherwise overlap an input.
void reduce_grads(const GradSlots<float>& slots, float* out, int64_t begin, int64_t end);
void reduce_grads(const GradSlots<bf16_bits>& slots, float* out, int64_t begin, int64_t end);

// Gradient accumulation over micro-batches: inout[i] = fma(sum_i, scale, inout[i]).
void reduce_grads_accumulate(std::span<const float* const> slots, float scale, float* inout, int64_t begin,
                             int64_t end);
void reduce_grads_accumulate(std::span<const bf16_bits* const> slots, float scale, float* inout,
                             int64_t begin, int64_t end);

// Sum of squares of what reduce_grads would write, without writing it (for global-norm clipping
// before a fused reduce + AdamW). Bitwise equal to sum_squares(out + begin, end - begin) after
// reduce_grads(slots, out, begin, end): blocks of kSumSquaresBlock from begin, 16 double lanes each.
double reduce_grads_sum_squares(const GradSlots<float>& slots, int64_t begin, int64_t end);
double reduce_grads_sum_squares(const GradSlots<bf16_bits>& slots, int64_t begin, int64_t end);

// Parallel forms: same bits as the range forms for any pool size (and any tile_numel).
void reduce_grads(ThreadPool& pool, const GradSlots<float>& slots, float* out, int64_t begin, int64_t end,
                  int64_t tile_numel = kTileNumel);
void reduce_grads(ThreadPool& pool, const GradSlots<bf16_bits>& slots, float* out, int64_t begin, int64_t end,
                  int64_t tile_numel = kTileNumel);
double reduce_grads_sum_squares(ThreadPool& pool, const GradSlots<float>& slots, int64_t begin, int64_t end);
double reduce_grads_sum_squares(ThreadPool& pool, const GradSlots<bf16_bits>& slots, int64_t begin,
                                int64_t end);

}  // namespace slidedp::kernels
