// The host's share of a step, with the project's own kernels (kernels/cpu/optim) called exactly as
// the updater calls them: the fused reduce + AdamW over a unit cut into chunks (bf16 gradient slots,
// bf16 mirror written), by thread count, chunk size and number of slots; the standalone N-way
// reduction (gradient accumulation); fp32 -> bf16 conversion. The model charges
// n / adamw_rate + (slots - 1) x 2n / reduce_rate for the fused call, so the slot sweep is fitted to
// exactly that line: the intercept is the AdamW rate, the slope per extra slot the reduction rate.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/fit.h"
#include "profiler/stage.h"

namespace slidedp::profiler {

struct CpuUpdateOptions {
  int64_t numel = int64_t{32} << 20;                     // elements updated per repetition (one unit)
  std::vector<int64_t> chunk_numels{int64_t{32} << 20};  // the updater's grain, each measured
  int64_t table_chunk_numel = 0;  // the chunk of the written tables and the slot sweep; 0: the last above
  std::vector<int> threads{1};
  std::vector<int> slots{1, 2, 4};  // bf16 gradient slots of the fused call (ranks)
  int reduce_slots = 2;             // N of the standalone reduction
};

struct CpuUpdateResult {
  struct ByThreads {
    int threads = 1;
    Spread adamw_params_per_s;  // fused call with one slot, at the table chunk size
    double reduce_gbps = 0;     // fitted marginal input bytes/s of an extra slot (fused call)
    FitQuality slot_fit;
    Spread reduce_standalone_gbps;  // reduce_grads with reduce_slots slots: input bytes/s
  };
  std::vector<ByThreads> by_threads;
  int64_t table_chunk_numel = 0;
  int reduce_slots = 0;
  Spread convert_gbps_per_thread;  // f32_to_bf16 on one thread, fp32 input bytes/s
};

// Allocates the buffers (about (18 + 2 x max slots) bytes x numel, held until the stage's cases are
// destroyed) and builds the cases; finish() records every case in ctx.out (which must outlive it).
PreparedStage<CpuUpdateResult> prepare_cpu_update(const CpuUpdateOptions& options, StageContext& ctx);
double estimate_cpu_update_s(const CpuUpdateOptions& options, const RepeatPolicy& repeat, double copy_gbps);

}  // namespace slidedp::profiler
