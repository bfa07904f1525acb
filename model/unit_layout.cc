// Unit layouts from a model card; see unit_layout.h for the contract.
#include "model/unit_layout.h"

#include "common/error.h"

namespace slidedp {
namespace {

class LayoutBuilder {
 public:
  LayoutBuilder(UnitLayout& unit, std::string prefix) : unit_(unit), prefix_(std::move(prefix)) {}
  void add(const std::string& name, std::vector<int64_t> shape) {
    TensorSpec t;
    t.name = prefix_ + name;
    t.numel = 1;
    for (int64_t d : shape) t.numel *= d;
    t.shape = std::move(shape);
    t.offset = unit_.flat_numel;
    unit_.flat_numel += (t.numel + kTensorAlignElems - 1) / kTensorAlignElems * kTensorAlignElems;
    unit_.param_count += t.numel;
    unit_.tensors.push_back(std::move(t));
  }

 private:
  UnitLayout& unit_;
  std::string prefix_;
};

}  // namespace

const char* unit_kind_name(UnitKind kind) {
  switch (kind) {
    case UnitKind::kEmbedding: return "embedding";
    case UnitKind::kDecoder: return "decoder";
    case UnitKind::kHead: return "head";
  }
  return "?";
}

const TensorSpec* UnitLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string UnitLayout::prefix() const {
  if (kind == UnitKind::kDecoder) return "model.layers." + std::to_string(layer) + ".";
  return "";
}

const TensorSpec& UnitLayout::at(const std::string& short_name) const {
  const TensorSpec* t = find(prefix() + short_name);
  SLIDEDP_CHECK(t != nullptr, "unit has no tensor " + prefix() + short_name);
  return *t;
}

ModelLayout make_model_layout(const ModelCard& c) {
  ModelLayout m;
  const int64_t C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, hd = c.head_dim;

  UnitLayout emb;
  emb.kind = UnitKind::kEmbedding;
  emb.index = 0;
  LayoutBuilder(emb, "").add("model.embed_tokens.weight", {V, C});
  m.units.push_back(std::move(emb));

  for (int64_t l = 0; l < c.num_layers; ++l) {
    UnitLayout u;
    u.kind = UnitKind::kDecoder;
    u.index = static_cast<int>(l + 1);
    u.layer = static_cast<int>(l);
    LayoutBuilder b(u, u.prefix());
    b.add("input_layernorm.weight", {C});
    b.add("self_attn.q_proj.weight", {c.q_dim(), C});
    if (c.attention_bias) b.add("self_attn.q_proj.bias", {c.q_dim()});
    b.add("self_attn.k_proj.weight", {c.kv_dim(), C});
    if (c.attention_bias) b.add("self_attn.k_proj.bias", {c.kv_dim()});
    b.add("self_attn.v_proj.weight", {c.kv_dim(), C});
    if (c.attention_bias) b.add("self_attn.v_proj.bias", {c.kv_dim()});
    b.add("self_attn.o_proj.weight", {C, c.q_dim()});
    if (c.qk_norm) {
      b.add("self_attn.q_norm.weight", {hd});
      b.add("self_attn.k_norm.weight", {hd});
    }
    b.add("post_attention_layernorm.weight", {C});
    b.add("mlp.gate_proj.weight", {I, C});
    b.add("mlp.up_proj.weight", {I, C});
    b.add("mlp.down_proj.weight", {C, I});
    m.units.push_back(std::move(u));
  }

  UnitLayout head;
  head.kind = UnitKind::kHead;
  head.index = static_cast<int>(c.num_layers + 1);
  LayoutBuilder hb(head, "");
  hb.add("model.norm.weight", {C});
  if (c.tie_word_embeddings) {
    head.reads_tied_embedding = true;
  } else {
    hb.add("lm_head.weight", {V, C});
  }
  m.units.push_back(std::move(head));

  for (const auto& u : m.units) {
    m.total_flat_numel += u.flat_numel;
    m.total_params += u.param_count;
  }
  SLIDEDP_CHECK(m.total_params == c.total_params(), "layout and card disagree on the parameter count");
  return m;
}

}  // namespace slidedp
