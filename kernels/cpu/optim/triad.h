// STREAM-like triad a[i] = fma(q, c[i], b[i]) in fp32, dispatched like the optimizer kernels: the
// host-memory roofline the optimizer benchmarks compare against, measured by the same binary in the
// same run. Bytes per element as STREAM counts them: read 4 + 4, write 4 = 12 (the write-allocate
// read of `a` is not counted, as in STREAM).
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/cpu/optim/tiling.h"

namespace slidedp::kernels {

// a, b, c: (n,) fp32 host buffers; a must not overlap b or c.
void stream_triad(float* a, const float* b, const float* c, float q, int64_t n);
void stream_triad(ThreadPool& pool, float* a, const float* b, const float* c, float q, int64_t n,
                  int64_t tile_numel = kTileNumel);

}  // namespace slidedp::kernels
