// Per-unit compute: forward, recompute and backward of each unit kind (embedding, decoder layer,
// head) for one model, at several sequence lengths and micro-batch sizes, measured through the
// Backend interface with the calls a rank driver makes for that unit in a micro-step: the same
// allocations (scratch and outputs per use, released in stream order), the gradient zeroing before a
// backward, the unit operation itself (on the CPU backend that includes widening the bf16 parameters
// to fp32), and the conversion of the fp32 gradient to the bf16 wire format after it. So the times
// are the compute stream's busy time per unit that the model schedules. The head's forward is the
// fused loss with its gradients (its backward is 0, as the executor runs it). A model whose decoder
// layers differ (Gemma 4's sliding and full attention, Qwen3.6's linear and full) has each layer type
// measured on its first layer and fitted on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "executor/backend.h"
#include "executor/kernel_activity.h"
#include "model/hardware.h"
#include "profiler/fit.h"
#include "profiler/stage.h"

namespace slidedp::profiler {

struct UnitComputeOptions {
  std::vector<int64_t> seq_lens{128};              // T; two or more also fit the per-token-per-context term
  std::vector<int64_t> micro_batches{1, 2, 4, 8};  // B
  // Devices computing the same unit at once (ranks of a data-parallel step share the host's memory
  // and caches); the written times are per device with this many running. 1: device 0 alone.
  int concurrent_devices = 1;
  bool also_alone = true;  // when concurrent_devices > 1, also measure device 0 alone (reported)
  uint64_t seed = 1;
  // After the timed rounds, run each operation once more on device 0 with tracing on and sum the
  // kernel spans (UnitCase::kernels). Needs a backend created with kernel activity (CUPTI).
  bool kernel_breakdown = false;
};

// The decoder layers the stage measures: each layer type's first layer, or layer 0 alone (no type)
// for a model whose layers are all alike.
struct DecoderKind {
  int layer = 0;
  std::optional<AttentionKind> layer_type;
};
std::vector<DecoderKind> decoder_kinds(const ModelCard& card);
// "decoder", or "decoder:sliding_attention" for one layer type (tables and fit keys).
std::string unit_label(UnitKind kind, const std::optional<AttentionKind>& layer_type);

struct UnitCase {
  UnitKind kind = UnitKind::kDecoder;
  int layer = 0;                            // decoder: the layer measured
  std::optional<AttentionKind> layer_type;  // decoder of a model whose layers differ
  std::string op;  // "fwd" | "recompute" | "bwd"
  int64_t B = 0, T = 0;
  Spread seconds;  // per device, concurrent_devices at once
  bool has_alone = false;
  Spread alone_seconds;
  std::vector<exec::KernelTotal> kernels;  // --kernels: device 0's kernels in one run of the operation
};

struct UnitComputeResult {
  std::string model;  // the card's name
  std::vector<UnitCase> cases;
  struct FitRow {
    UnitKind kind = UnitKind::kDecoder;
    int layer = 0;
    std::optional<AttentionKind> layer_type;
    std::string op;
    UnitFit fit;
  };
  std::vector<FitRow> fits;
  std::vector<UnitTimeProfile> profiles;  // one per unit kind (decoder: per layer type), model = the card's name
  int concurrent_devices = 1;
};

// Uploads the unit parameters and every (T, B)'s inputs to the devices (held until the stage's cases
// are destroyed, which must happen before the backend is) and builds one case per (T, B) (and per
// device count); finish() records every operation in ctx.out and fits the unit times.
PreparedStage<UnitComputeResult> prepare_unit_compute(exec::Backend& backend, const ModelCard& card,
                                                      const ModelLayout& layout,
                                                      const UnitComputeOptions& options, StageContext& ctx);

// Seconds the stage should take at `gflops` per device (for the up-front estimate).
double estimate_unit_compute_s(const ModelCard& card, const UnitComputeOptions& options,
                               const RepeatPolicy& repeat, double gflops);

// fp32 SGEMM rate (n x n x n) through kernels::gemm at the current BLAS thread count: the CPU
// backend's "peak" (it computes in fp32), in GFLOP/s.
Spread measure_sgemm_gflops(int64_t n, StageContext& ctx);

}  // namespace slidedp::profiler
