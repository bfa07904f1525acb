// Host-memory bandwidth probes: the four ways a kernel can touch DRAM, each as fast as this code can
// make it, so a kernel's roofline is built from what the memory delivers, not from another kernel:
//   read  -- the XOR of every byte of a buffer (returned, so no load can be skipped), eight streams
//            of 64 bytes a step per thread (the optimizer kernels read up to seven arrays at once);
//   write -- a buffer filled with non-temporal stores (no read-for-ownership of the destination);
//   copy  -- the read's streams stored with the write's non-temporal stores (its read plus its
//            write, counted 2x the bytes): reads and writes to separate buffers;
//   update -- every line read and written back in place with ordinary stores (counted 2x the bytes):
//            AdamW's pattern (p, m and v rewritten where they were read), which on some machines
//            moves more than a copy does.
// A kernel's combined read + write bound is the faster of copy and update.
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
// Every byte of data[0, bytes) XORed with `value`.
void stream_update(ThreadPool& pool, void* data, int64_t bytes, unsigned char value);

}  // namespace slidedp::kernels
