// How a model's parameters are cut into units and laid out in flat buffers. Units in execution order:
// 0 = embedding, 1..L = decoder layers, L+1 = head (final norm + lm_head + loss). Each unit's
// parameters are ONE flat range; every tensor sits at a documented element offset inside it, aligned
// to kTensorAlignElems so GEMM and SIMD code can use aligned loads and cuBLASLt gets 16-byte-aligned
// bf16 pointers. The padding elements are zero and receive zero gradients, so the optimizer leaves
// them at zero. Chunks of `chunk_numel` elements of these flat ranges are the grain of every transfer,
// reduction and update.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "card/model_card.h"

namespace slidedp {

enum class UnitKind { kEmbedding, kDecoder, kHead };
const char* unit_kind_name(UnitKind kind);

inline constexpr int64_t kTensorAlignElems = 64;

struct TensorSpec {
  std::string name;            // Hugging Face tensor name, e.g. "model.layers.3.mlp.up_proj.weight"
                               // (Gemma 4: "model.language_model.layers.3.mlp.up_proj.weight")
  std::vector<int64_t> shape;  // row-major, as in the checkpoint ([out, in] for nn.Linear weights)
  int64_t offset = 0;          // element offset inside the unit's flat buffer (aligned)
  int64_t numel = 0;
};

struct UnitLayout {
  UnitKind kind = UnitKind::kDecoder;
  int index = 0;            // position in execution order: 0 .. L+1
  int layer = -1;           // decoder layer number, -1 for embedding and head
  std::string name_prefix;  // what short names are relative to: "model.layers.3." for decoders, else ""
  std::vector<TensorSpec> tensors;
  int64_t flat_numel = 0;   // including alignment padding
  int64_t param_count = 0;  // real parameters (sum of tensor numels)
  // Tied embeddings: the head's lm_head is unit 0's embed_tokens weight (not part of this unit).
  bool reads_tied_embedding = false;

  // Returns the tensor with this name, or nullptr.
  const TensorSpec* find(const std::string& name) const;
  // Like find(), but the short name relative to the unit ("mlp.up_proj.weight"); aborts if absent.
  const TensorSpec& at(const std::string& short_name) const;
  const std::string& prefix() const { return name_prefix; }
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // size L + 2
  int64_t total_flat_numel = 0;
  int64_t total_params = 0;
  int num_units() const { return static_cast<int>(units.size()); }
  // The token embedding (unit 0's one tensor; the tied head's weight too), whatever its prefix.
  const TensorSpec& embedding_weight() const { return units.front().tensors.front(); }
  int64_t max_unit_numel() const {
    int64_t m = 0;
    for (const UnitLayout& u : units) m = std::max(m, u.flat_numel);
    return m;
  }
};

ModelLayout make_model_layout(const ModelCard& card);

// Tensor roles by Hugging Face name, for initialization and weight-decay groups.
// A norm's weight: "input_layernorm.weight", "self_attn.q_norm.weight", Gemma 4's
// "post_feedforward_layernorm_1.weight", "model.norm.weight".
bool is_norm_weight(const std::string& hf_name);
// Gemma 4's "layer_scalar": a buffer loaded from the checkpoint that transformers never trains.
bool is_frozen_buffer(const std::string& hf_name);
bool has_frozen_buffers(const ModelLayout& layout);

// Number of chunks a unit of `numel` elements is cut into (at least 1, even for an empty unit).
inline int64_t num_chunks(int64_t numel, int64_t chunk_numel) {
  return numel <= 0 ? 1 : (numel + chunk_numel - 1) / chunk_numel;
}

}  // namespace slidedp
