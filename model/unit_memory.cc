// Per-unit device memory from the units' own size queries; see unit_memory.h.
#include "model/unit_memory.h"

#include <cmath>
#include <variant>

#include "common/error.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/layer_dispatch.h"
#include "kernels/cpu/transformer/llama_layer.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cpu/transformer/router_aux_loss.h"
#include "kernels/cuda/gemma4_scratch.h"
#include "kernels/cuda/qwen3_5_scratch.h"
#include "kernels/cuda/unit_scratch.h"

namespace slidedp {
namespace {

int64_t align_up(int64_t bytes, int64_t align) { return (bytes + align - 1) / align * align; }

// The kernels' specs with the options' tunables.
kernels::ModelSpecs specs_for(const ModelCard& card, const ModelLayout& layout, const UnitMemoryOptions& o) {
  kernels::ModelSpecs s = kernels::make_model_specs(card, layout);
  s.head.loss_chunk_tokens = o.loss_chunk_tokens;
  if (card.mlp_token_tiles()) s.set_mlp_token_tile(o.mlp_token_tile);
  s.set_threads(o.cpu_threads > 0 ? o.cpu_threads : 1);
  return s;
}

// The CPU units compute in fp32: a unit's bf16 parameters are widened into the front of its workspace
// (kernels::Arena alignment, 64 bytes); --exact delivers fp32 and needs no copy.
int64_t cpu_param_scratch(int64_t numel, bool exact) { return exact ? 0 : align_up(numel * 4, 64); }

// `layer`: the decoder layer whose unit is sized (kind kDecoder).
UnitMemory cpu_unit_memory(const kernels::ModelSpecs& s, UnitKind kind, int layer, int64_t B, int64_t T, bool exact) {
  UnitMemory m;
  m.hidden_bytes = B * T * s.embedding.C * 4;
  switch (kind) {
    case UnitKind::kEmbedding:
      break;
    case UnitKind::kDecoder: {
      const int64_t params = cpu_param_scratch(kernels::layer_flat_numel(s, layer), exact);
      m.saved_bytes = kernels::layer_saved_bytes<float>(s, layer, B, T);
      m.forward_workspace_bytes = params + align_up(kernels::layer_forward_workspace_bytes<float>(s, layer, B, T), 64);
      m.backward_workspace_bytes = params + align_up(kernels::layer_backward_workspace_bytes<float>(s, layer, B, T), 64);
      break;
    }
    case UnitKind::kHead:
      m.forward_workspace_bytes = cpu_param_scratch(s.head.flat_numel, exact) +
                                  (s.head.tied ? cpu_param_scratch(s.embedding.V * s.embedding.C, exact) : 0) +
                                  align_up(kernels::head_workspace_bytes<float>(s.head, B, T, true), 64);
      break;
  }
  return m;
}

// Decoder layer `layer` on the GPU (kernels/cuda/*_scratch.h, each family's sizes).
UnitMemory cuda_layer_memory(const kernels::ModelSpecs& s, int layer, int64_t B, int64_t T) {
  namespace kc = kernels::cuda;
  UnitMemory m;
  m.hidden_bytes = B * T * s.embedding.C * 2;  // bf16
  std::visit(
      [&](const auto& spec) {
        m.saved_bytes = kc::layer_saved_bytes(spec, B, T);
        m.forward_workspace_bytes = kc::layer_forward_workspace_bytes(spec, B, T);
        m.backward_workspace_bytes = kc::layer_backward_workspace_bytes(spec, B, T);
      },
      s.layer(layer));
  return m;
}

UnitMemory cuda_unit_memory(const kernels::ModelSpecs& s, UnitKind kind, int layer, int64_t B, int64_t T) {
  if (kind == UnitKind::kDecoder) return cuda_layer_memory(s, layer, B, T);
  UnitMemory m;
  m.hidden_bytes = B * T * s.embedding.C * 2;  // bf16
  if (kind == UnitKind::kHead) m.forward_workspace_bytes = kernels::cuda::head_workspace_bytes(s.head, B, T);
  return m;
}

}  // namespace

const char* unit_code_name(UnitCode code) { return code == UnitCode::kCpu ? "cpu" : "cuda"; }

std::vector<UnitMemory> decoder_unit_memories(const ModelCard& card, const ModelLayout& layout, int64_t B, int64_t T,
                                              const UnitMemoryOptions& options) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative micro-batch or sequence length");
  std::vector<UnitMemory> out;
  const kernels::ModelSpecs s = specs_for(card, layout, options);
  for (int l = 0; l < card.num_layers; ++l)
    out.push_back(options.code == UnitCode::kCpu
                      ? cpu_unit_memory(s, UnitKind::kDecoder, l, B, T, options.exact_fp32)
                      : cuda_layer_memory(s, l, B, T));
  return out;
}

UnitMemory unit_memory(const ModelCard& card, const ModelLayout& layout, UnitKind kind, int64_t B, int64_t T,
                       const UnitMemoryOptions& options) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative micro-batch or sequence length");
  if (card.hybrid_layers() && kind == UnitKind::kDecoder) return decoder_unit_memories(card, layout, B, T, options).at(0);
  const kernels::ModelSpecs s = specs_for(card, layout, options);
  return options.code == UnitCode::kCpu ? cpu_unit_memory(s, kind, 0, B, T, options.exact_fp32)
                                        : cuda_unit_memory(s, kind, 0, B, T);
}

int64_t embedding_backward_scratch_estimate(UnitCode code, int64_t tokens) {
  if (code == UnitCode::kCpu) return 0;
  const int64_t array = align_up(tokens * 4, 256);
  return 4 * array + 2 * array + (int64_t{1} << 20);
}

int64_t router_stats_bytes(const ModelCard& card, int64_t B) {
  return card.moe() ? kernels::router_stats_bytes(B, card.num_experts) : 0;
}

}  // namespace slidedp
