// Per-unit device memory from the units' own size queries; see unit_memory.h.
#include "model/unit_memory.h"

#include "common/error.h"
#include "kernels/cpu/transformer/decoder_layer.h"
#include "kernels/cpu/transformer/head_unit.h"
#include "kernels/cpu/transformer/model_step.h"
#include "kernels/cuda/unit_scratch.h"

namespace slidedp {
namespace {

int64_t align_up(int64_t bytes, int64_t align) { return (bytes + align - 1) / align * align; }

kernels::ModelSpecs specs_for(const ModelCard& card, const ModelLayout& layout, const UnitMemoryOptions& o) {
  kernels::ModelSpecs s = kernels::make_model_specs(card, layout);
  s.head.loss_chunk_tokens = o.loss_chunk_tokens;
  s.decoder.mlp_token_tile = o.mlp_token_tile;
  s.decoder.threads = o.cpu_threads > 0 ? o.cpu_threads : 1;
  return s;
}

// The CPU units compute in fp32: a unit's bf16 parameters are widened into the front of its workspace
// (kernels::Arena alignment, 64 bytes); --exact delivers fp32 and needs no copy.
int64_t cpu_param_scratch(int64_t numel, bool exact) { return exact ? 0 : align_up(numel * 4, 64); }

UnitMemory cpu_unit_memory(const kernels::ModelSpecs& s, UnitKind kind, int64_t B, int64_t T, bool exact) {
  UnitMemory m;
  m.hidden_bytes = B * T * s.embedding.C * 4;
  switch (kind) {
    case UnitKind::kEmbedding:
      break;
    case UnitKind::kDecoder:
      m.saved_bytes = kernels::decoder_saved_bytes<float>(s.decoder, B, T);
      m.forward_workspace_bytes = cpu_param_scratch(s.decoder.flat_numel, exact) +
                                  align_up(kernels::decoder_forward_workspace_bytes<float>(s.decoder, B, T), 64);
      m.backward_workspace_bytes = cpu_param_scratch(s.decoder.flat_numel, exact) +
                                   align_up(kernels::decoder_backward_workspace_bytes<float>(s.decoder, B, T), 64);
      break;
    case UnitKind::kHead:
      m.forward_workspace_bytes = cpu_param_scratch(s.head.flat_numel, exact) +
                                  (s.head.tied ? cpu_param_scratch(s.embedding.V * s.embedding.C, exact) : 0) +
                                  align_up(kernels::head_workspace_bytes<float>(s.head, B, T, true), 64);
      break;
  }
  return m;
}

UnitMemory cuda_unit_memory(const kernels::ModelSpecs& s, UnitKind kind, int64_t B, int64_t T) {
  namespace kc = kernels::cuda;
  UnitMemory m;
  m.hidden_bytes = B * T * s.embedding.C * 2;  // bf16
  switch (kind) {
    case UnitKind::kEmbedding:
      break;
    case UnitKind::kDecoder:
      m.saved_bytes = kc::decoder_saved_bytes(s.decoder, B, T);
      m.forward_workspace_bytes = kc::decoder_forward_workspace_bytes(s.decoder, B, T);
      m.backward_workspace_bytes = kc::decoder_backward_workspace_bytes(s.decoder, B, T);
      break;
    case UnitKind::kHead:
      m.forward_workspace_bytes = kc::head_workspace_bytes(s.head, B, T);
      break;
  }
  return m;
}

}  // namespace

const char* unit_code_name(UnitCode code) { return code == UnitCode::kCpu ? "cpu" : "cuda"; }

UnitMemory unit_memory(const ModelCard& card, const ModelLayout& layout, UnitKind kind, int64_t B, int64_t T,
                       const UnitMemoryOptions& options) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative micro-batch or sequence length");
  const kernels::ModelSpecs s = specs_for(card, layout, options);
  return options.code == UnitCode::kCpu ? cpu_unit_memory(s, kind, B, T, options.exact_fp32)
                                        : cuda_unit_memory(s, kind, B, T);
}

int64_t embedding_backward_scratch_estimate(UnitCode code, int64_t tokens) {
  if (code == UnitCode::kCpu) return 0;
  const int64_t array = align_up(tokens * 4, 256);
  return 4 * array + 2 * array + (int64_t{1} << 20);
}

}  // namespace slidedp
