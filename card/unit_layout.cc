// Unit layouts from a model card; see unit_layout.h for the contract.
#include "card/unit_layout.h"

#include "common/error.h"

namespace slidedp {
namespace {

// Appends tensors to a unit's flat buffer, each at an aligned offset.
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

// A Llama-family decoder layer: attention (optional q/k/v biases, optional q/k norms) and SwiGLU.
void add_decoder_tensors(const LlamaFamily& /*family*/, LayoutBuilder& b, const ModelCard& c,
                         const LayerShape& s) {
  const int64_t C = c.hidden_size, I = s.intermediate_size;
  b.add("input_layernorm.weight", {C});
  b.add("self_attn.q_proj.weight", {s.q_dim(), C});
  if (c.attention_bias) b.add("self_attn.q_proj.bias", {s.q_dim()});
  b.add("self_attn.k_proj.weight", {s.kv_dim(), C});
  if (c.attention_bias) b.add("self_attn.k_proj.bias", {s.kv_dim()});
  b.add("self_attn.v_proj.weight", {s.kv_dim(), C});
  if (c.attention_bias) b.add("self_attn.v_proj.bias", {s.kv_dim()});
  b.add("self_attn.o_proj.weight", {C, s.q_dim()});
  if (c.qk_norm) {
    b.add("self_attn.q_norm.weight", {s.head_dim});
    b.add("self_attn.k_norm.weight", {s.head_dim});
  }
  b.add("post_attention_layernorm.weight", {C});
  b.add("mlp.gate_proj.weight", {I, C});
  b.add("mlp.up_proj.weight", {I, C});
  b.add("mlp.down_proj.weight", {C, I});
}

// A Gemma 4 decoder layer in Gemma4TextDecoderLayer's order: sandwich-normed attention (no v_proj on
// K=V layers), the dense GeGLU MLP, and on MoE models the router and the packed experts (3-D
// parameters without a .weight suffix, as the checkpoint stores them).
void add_decoder_tensors(const Gemma4Family& /*family*/, LayoutBuilder& b, const ModelCard& c,
                         const LayerShape& s) {
  const int64_t C = c.hidden_size, I = s.intermediate_size;
  b.add("input_layernorm.weight", {C});
  b.add("self_attn.q_proj.weight", {s.q_dim(), C});
  b.add("self_attn.k_proj.weight", {s.kv_dim(), C});
  if (!s.k_eq_v) b.add("self_attn.v_proj.weight", {s.kv_dim(), C});
  b.add("self_attn.o_proj.weight", {C, s.q_dim()});
  b.add("self_attn.q_norm.weight", {s.head_dim});
  b.add("self_attn.k_norm.weight", {s.head_dim});
  b.add("post_attention_layernorm.weight", {C});
  b.add("pre_feedforward_layernorm.weight", {C});
  b.add("mlp.gate_proj.weight", {I, C});
  b.add("mlp.up_proj.weight", {I, C});
  b.add("mlp.down_proj.weight", {C, I});
  if (s.moe()) {
    const int64_t E = s.num_experts, Ie = s.expert_intermediate_size;
    b.add("post_feedforward_layernorm_1.weight", {C});
    b.add("router.proj.weight", {E, C});
    b.add("router.scale", {C});
    b.add("router.per_expert_scale", {E});
    b.add("pre_feedforward_layernorm_2.weight", {C});
    b.add("experts.gate_up_proj", {E, 2 * Ie, C});
    b.add("experts.down_proj", {E, C, Ie});
    b.add("post_feedforward_layernorm_2.weight", {C});
  }
  b.add("post_feedforward_layernorm.weight", {C});
  b.add("layer_scalar", {1});
}

// A Qwen3.5/3.6 decoder layer (Qwen3_5DecoderLayer; names and shapes: model-families.md section 3.3):
// the Gated DeltaNet or the gated full attention, then the dense SwiGLU MLP or the MoE block with its
// packed experts (3-D, gate rows first) and the gated shared expert.
void add_decoder_tensors(const Qwen35Family& /*family*/, LayoutBuilder& b, const ModelCard& c,
                         const LayerShape& s) {
  const int64_t C = c.hidden_size;
  b.add("input_layernorm.weight", {C});
  if (s.linear()) {
    const int64_t conv = s.linear_conv_dim(), vd = s.linear_value_dim(), nv = s.linear_v_heads;
    b.add("linear_attn.in_proj_qkv.weight", {conv, C});  // rows q | k | v
    b.add("linear_attn.in_proj_z.weight", {vd, C});
    b.add("linear_attn.in_proj_b.weight", {nv, C});
    b.add("linear_attn.in_proj_a.weight", {nv, C});
    b.add("linear_attn.conv1d.weight", {conv, 1, s.conv_kernel});
    b.add("linear_attn.dt_bias", {nv});
    b.add("linear_attn.A_log", {nv});
    b.add("linear_attn.norm.weight", {s.linear_v_dim});
    b.add("linear_attn.out_proj.weight", {C, vd});
  } else {
    b.add("self_attn.q_proj.weight", {2 * s.q_dim(), C});  // per head: the query rows, then the gate rows
    b.add("self_attn.k_proj.weight", {s.kv_dim(), C});
    b.add("self_attn.v_proj.weight", {s.kv_dim(), C});
    b.add("self_attn.o_proj.weight", {C, s.q_dim()});
    b.add("self_attn.q_norm.weight", {s.head_dim});
    b.add("self_attn.k_norm.weight", {s.head_dim});
  }
  b.add("post_attention_layernorm.weight", {C});
  if (s.moe()) {
    const int64_t E = s.num_experts, Ie = s.expert_intermediate_size, Is = s.shared_expert_intermediate_size;
    b.add("mlp.gate.weight", {E, C});
    b.add("mlp.experts.gate_up_proj", {E, 2 * Ie, C});
    b.add("mlp.experts.down_proj", {E, C, Ie});
    b.add("mlp.shared_expert.gate_proj.weight", {Is, C});
    b.add("mlp.shared_expert.up_proj.weight", {Is, C});
    b.add("mlp.shared_expert.down_proj.weight", {C, Is});
    b.add("mlp.shared_expert_gate.weight", {1, C});
  } else {
    const int64_t I = s.intermediate_size;
    b.add("mlp.gate_proj.weight", {I, C});
    b.add("mlp.up_proj.weight", {I, C});
    b.add("mlp.down_proj.weight", {C, I});
  }
}

}  // namespace

const char* unit_kind_name(UnitKind kind) {
  switch (kind) {
    case UnitKind::kEmbedding:
      return "embedding";
    case UnitKind::kDecoder:
      return "decoder";
    case UnitKind::kHead:
      return "head";
  }
  return "?";
}

bool is_norm_weight(const std::string& name) {
  if (!name.ends_with(".weight")) return false;
  const std::string stem = name.substr(0, name.size() - 7);  // the module's dotted path
  const size_t dot = stem.rfind('.');
  return stem.substr(dot == std::string::npos ? 0 : dot + 1).find("norm") != std::string::npos;
}

bool is_frozen_buffer(const std::string& name) { return name.ends_with("layer_scalar"); }

bool has_frozen_buffers(const ModelLayout& layout) {
  for (const UnitLayout& u : layout.units)
    for (const TensorSpec& t : u.tensors)
      if (is_frozen_buffer(t.name)) return true;
  return false;
}

const TensorSpec* UnitLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorSpec& UnitLayout::at(const std::string& short_name) const {
  const TensorSpec* t = find(prefix() + short_name);
  SLIDEDP_CHECK(t != nullptr, "unit has no tensor " + prefix() + short_name);
  return *t;
}

ModelLayout make_model_layout(const ModelCard& c) {
  ModelLayout m;
  const int64_t C = c.hidden_size, V = c.vocab_size;
  const std::string model = c.tensor_prefix();

  UnitLayout emb;
  emb.kind = UnitKind::kEmbedding;
  emb.index = 0;
  LayoutBuilder(emb, "").add(model + "embed_tokens.weight", {V, C});
  m.units.push_back(std::move(emb));

  for (int64_t l = 0; l < c.num_layers; ++l) {
    UnitLayout u;
    u.kind = UnitKind::kDecoder;
    u.index = static_cast<int>(l + 1);
    u.layer = static_cast<int>(l);
    u.name_prefix = model + "layers." + std::to_string(l) + ".";
    LayoutBuilder b(u, u.prefix());
    std::visit([&](const auto& f) { add_decoder_tensors(f, b, c, c.layer(l)); }, c.family());
    m.units.push_back(std::move(u));
  }

  UnitLayout head;
  head.kind = UnitKind::kHead;
  head.index = static_cast<int>(c.num_layers + 1);
  LayoutBuilder hb(head, "");
  hb.add(model + "norm.weight", {C});
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
