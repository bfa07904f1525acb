// Host-memory bandwidth probes: the three ways a kernel can touch DRAM, each as fast as this code can
// make it, so a kernel's roofline is built from what the memory delivers, not from another kernel:
//   read  -- the XOR of every byte of a buffer (returned, so no load can be skipped), four streams of
//            64 bytes a step per thread (as many as the optimizer kernels read at once);
//   write -- a buffer filled with non-temporal stores (no read-for-ownership of the destination);
//   copy  -- memcpy (its read plus its write, counted 2x the bytes).
// SSE2 on x86-64 (part of the baseline ISA, so no dispatch), plain C++ elsewhere. Buffers are cut into
// tiles over the pool, as the optimizer kernels are.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"

namespace slidedp::kernels {

// Tile of the probes: large enough that the pool's hand-off is noise, small enough to balance.
inline constexpr int64_t kStreamTileBytes = int64_t{1} << 20;

unsigned char stream_read(ThreadPool& pool, const void* src, int64_t bytes);
// Every byte of dst[0, bytes) becomes `value`.
void stream_write_nontemporal(ThreadPool& pool, void* dst, int64_t bytes, unsigned char value);
void stream_copy(ThreadPool& pool, void* dst, const void* src, int64_t bytes);

}  // namespace slidedp::kernels
