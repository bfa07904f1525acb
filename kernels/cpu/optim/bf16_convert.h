// Bulk bf16 <-> fp32 conversion with the rounding of common/bf16.h, bit for bit: fp32 -> bf16 is
// round-to-nearest-even with NaN kept as a quiet NaN (sign and top payload bits kept), Inf and
// signed zero exact, subnormals rounded like any value (also where AVX512-BF16 instructions, which
// flush subnormal inputs, do the bulk of the work); bf16 -> fp32 is exact.
// Bytes per element: 4 + 2 = 6 either way.
#pragma once

#include <cstdint>

#include "common/bf16.h"
#include "common/thread_pool.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels {

// in and out are (n,) host buffers that must not overlap.
void f32_to_bf16(const float* in, bf16_bits* out, int64_t n);
void bf16_to_f32(const bf16_bits* in, float* out, int64_t n);

void f32_to_bf16(ThreadPool& pool, const float* in, bf16_bits* out, int64_t n,
                 int64_t tile_numel = kTileNumel);

// fp32 values split as common/split_master.h splits them: the mirror (rounded with ties toward zero)
// and, where `remainder` is not null, the low 16 bits. Bytes per element: 4 + 2 (+ 2).
void f32_to_split(const float* in, bf16_bits* mirror, uint16_t* remainder, int64_t n);
void bf16_to_f32(ThreadPool& pool, const bf16_bits* in, float* out, int64_t n,
                 int64_t tile_numel = kTileNumel);

}  // namespace slidedp::kernels
