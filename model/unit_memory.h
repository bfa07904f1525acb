// What one unit's code holds on a device for a micro-batch of B x T tokens, per backend, from the very
// carve sequences the units run (CPU: kernels/cpu/transformer, fp32 math; CUDA: kernels/cuda/
// unit_scratch.h, bf16). Both backends answer Device::unit_memory with this function and the memory
// account (memory_account.h) sizes plans with it, so the bytes a plan is charged for are the bytes its
// units take, on hardware this machine does not have as well.
#pragma once

#include <cstdint>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp {

enum class UnitCode {
  kCpu,   // the CPU backend: fp32 math over a compute-type copy of the delivered parameters
  kCuda,  // the CUDA backend: bf16 activations, fp32 statistics and gradient sums, cuBLASLt workspace
};
const char* unit_code_name(UnitCode code);  // "cpu" | "cuda"

struct UnitMemoryOptions {
  UnitCode code = UnitCode::kCuda;
  bool exact_fp32 = false;          // CPU backend --exact: fp32 parameters delivered (no compute copy)
  int64_t loss_chunk_tokens = 4096; // the head's fused cross-entropy chunk
  int64_t mlp_token_tile = 0;       // decoder MLP token tile (0: untiled)
  int cpu_threads = 1;              // CPU backend: threads per emulated device (attention scratch per thread)
};

// Bytes of one unit operation (0 where a kind has none).
struct UnitMemory {
  int64_t hidden_bytes = 0;              // one (B, T, C) activation buffer
  int64_t saved_bytes = 0;               // decoder: the state forward saves for backward
  int64_t forward_workspace_bytes = 0;   // decoder forward and recompute; the head's fused pass
  int64_t backward_workspace_bytes = 0;  // decoder backward
};

// For kDecoder: layer 0's (every layer's, for the models whose layers are all alike).
UnitMemory unit_memory(const ModelCard& card, const ModelLayout& layout, UnitKind kind, int64_t B, int64_t T,
                       const UnitMemoryOptions& options);
// Every decoder layer's, in order: Gemma 4's and Qwen3.6's layers differ by type, each charged its
// own unit's carve sizes.
std::vector<UnitMemory> decoder_unit_memories(const ModelCard& card, const ModelLayout& layout, int64_t B, int64_t T,
                                              const UnitMemoryOptions& options);

// One micro-batch's router statistics on a mixture-of-experts model (the load-balancing loss,
// kernels/cpu/transformer/router_aux_loss.h), held from its first layer's forward to its last
// backward whether or not the loss is on; 0 for a dense model.
int64_t router_stats_bytes(const ModelCard& card, int64_t B);

// The CUDA embedding backward's sort scratch for N tokens: four int32 arrays (exact) and CUB's radix
// sort temp storage, which only a device can size (CUB picks its tuning from the GPU), estimated as
// one more key/value pair array plus 1 MiB; the CUDA backend uses the exact figure. 0 on the CPU.
int64_t embedding_backward_scratch_estimate(UnitCode code, int64_t tokens);

}  // namespace slidedp
