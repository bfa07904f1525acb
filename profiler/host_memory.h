// Host-memory bandwidth, STREAM style: copy (memcpy, counted as read + write) and triad
// (a = b + q c with the project's kernel, 12 bytes per element) by thread count on the working set
// the profile is for (DRAM-sized, or a small model's host state, which may live in the cache); then
// the triad again while DMA-like copies run on their own threads (memcpy threads here: on the CPU
// backend a "DMA" is a memcpy, and on a GPU host they stand in for the copy engines' host-memory
// traffic), to see how much the two take from each other. And always in DRAM (buffers of at least
// 8x the last-level cache): read, non-temporal write and copy (kernels/cpu/optim/stream_bandwidth.h),
// the bounds a kernel's roofline is made of.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/stage.h"

namespace slidedp::profiler {

struct HostMemoryOptions {
  int64_t array_bytes = int64_t{256} << 20;  // per array
  int64_t dram_bytes = int64_t{256} << 20;   // per buffer of the DRAM cases (0: none)
  std::vector<int> threads{1};               // copy and triad thread counts
  // Contention cases: memcpy threads running alongside a triad of this many threads.
  struct Mix {
    int dma_threads = 1;
    int triad_threads = 1;
  };
  std::vector<Mix> contention{{1, 1}};
};

struct HostMemoryResult {
  struct ByThreads {
    int threads = 1;
    Spread copy_gbps;   // read + write bytes per second
    Spread triad_gbps;  // STREAM's 12 bytes per element per second
    // In DRAM (dram_bytes per buffer): bytes read, bytes written with non-temporal stores, and a
    // memcpy's read + write bytes, per second.
    Spread dram_read_gbps, dram_write_gbps, dram_copy_gbps;
  };
  struct Contention {
    int dma_threads = 0, triad_threads = 0;
    Spread triad_gbps;  // the triad while the copies run
    Spread dma_gbps;    // bytes copied per second, all copy threads together
    Spread total_gbps;  // triad + 2 x dma (copies read and write host memory)
  };
  std::vector<ByThreads> by_threads;
  std::vector<Contention> contention;
  double best_gbps = 0;   // the highest total host-memory rate of any case: the shared capacity
  std::string best_case;  // which case gave it
  int64_t dram_bytes = 0;
};

// Allocates and fills the arrays (3 x array_bytes, held until the stage's cases are destroyed) and
// builds the cases; finish() records every case in ctx.out (which must outlive the stage).
PreparedStage<HostMemoryResult> prepare_host_memory(const HostMemoryOptions& options, StageContext& ctx);

// Seconds the stage should take at `copy_gbps` single-thread memcpy speed (for the up-front estimate).
double estimate_host_memory_s(const HostMemoryOptions& options, const RepeatPolicy& repeat, double copy_gbps);

}  // namespace slidedp::profiler
