// How the parallel forms of the optimizer kernels split a range over a ThreadPool.
// Element-wise kernels (AdamW, reduction, conversion) give the same bits for any tiling; the
// sum-of-squares kernels fix their tiling (kSumSquaresBlock) as part of their definition.
#pragma once

#include <cstdint>

namespace slidedp::kernels {

// Default tile of the element-wise parallel forms: 32768 elements = 128 KiB per fp32 stream, so a
// tile of AdamW (7 streams) is about 0.9 MiB. Large enough that claiming a tile (one atomic add)
// is noise, small enough that 2-64 threads balance well on chunks of a few million elements.
inline constexpr int64_t kTileNumel = int64_t{1} << 15;

// Block of the sum-of-squares kernels: each block of this many elements (counted from the start of
// the range) is summed on its own with 16 double lanes, then blocks are added in order. The
// parallel forms use one block per tile, so their result is bitwise the range form's.
inline constexpr int64_t kSumSquaresBlock = int64_t{1} << 15;

}  // namespace slidedp::kernels
