// The Gemma 4 family's card: sliding and full layers (the full ones with their own head_dim, KV heads,
// K=V and proportional RoPE), experts beside the dense MLP, its YAML keys and checks.
#include "card/gemma4_family.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "card/layer_types_yaml.h"
#include "card/llama_family.h"
#include "common/yaml_reader.h"

namespace slidedp {

std::vector<AttentionKind> gemma4_default_layer_types(int64_t num_layers) {
  // Gemma4TextConfig: five sliding layers, then a full one; the last layer is always full.
  std::vector<AttentionKind> t(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = (i + 1) % 6 == 0 ? AttentionKind::kFull : AttentionKind::kSliding;
  if (!t.empty()) t.back() = AttentionKind::kFull;
  return t;
}

void shape_layer(const Gemma4Family& /*family*/, const ModelCard& c, int64_t layer, LayerShape& s) {
  const bool full =
      c.layer_types.empty() || c.layer_types.at(static_cast<size_t>(layer)) == AttentionKind::kFull;
  if (!full) {
    s.attention = AttentionKind::kSliding;
    s.window = c.sliding_window;
    return;
  }
  s.attention = AttentionKind::kFull;
  s.head_dim = c.global_head_dim > 0 ? c.global_head_dim : c.head_dim;
  s.k_eq_v = c.attention_k_eq_v;
  if (c.attention_k_eq_v && c.num_global_kv_heads > 0) s.num_kv_heads = c.num_global_kv_heads;
  s.rope_theta = c.global_rope_theta > 0 ? c.global_rope_theta : c.rope_theta;
  // _compute_proportional_rope_parameters: int(partial_rotary_factor * head_dim // 2) slots rotate,
  // with exponents over the whole head_dim; the others get frequency 0.
  s.rope_angles = static_cast<int64_t>(
      std::floor(c.global_partial_rotary_factor * static_cast<double>(s.head_dim) / 2.0));
}

// The Llama-style layer's count plus the q/k norms, the sandwich norms, layer_scalar and the experts.
int64_t decoder_layer_params(const Gemma4Family& /*family*/, const ModelCard& c, const LayerShape& s) {
  const int64_t C = c.hidden_size;
  int64_t n = decoder_layer_params(LlamaFamily{}, c, s);
  if (!c.qk_norm) n += 2 * s.head_dim;  // q_norm, k_norm: the family has them (its cards leave qk_norm false)
  n += 2 * C + 1;                       // pre/post_feedforward_layernorm, layer_scalar
  if (s.moe()) {
    n += s.num_experts * C + C + s.num_experts;               // router proj, scale, per_expert_scale
    n += 3 * C;                                               // the MoE path's three norms
    n += s.num_experts * 3 * s.expert_intermediate_size * C;  // gate_up_proj, down_proj
  }
  return n;
}

void validate_family(const Gemma4Family& /*family*/, const ModelCard& c, const CardCheck& need) {
  need(c.layer_types.empty() || static_cast<int64_t>(c.layer_types.size()) == c.num_layers, "layer_types",
       fmt::format("has {} entries for {} layers", c.layer_types.size(), c.num_layers));
  need(c.sliding_window > 0, "sliding_window", "must be positive");
  need(c.global_head_dim > 0 && c.global_head_dim % 2 == 0, "global_head_dim", "must be positive and even");
  need(c.num_global_kv_heads >= 0 && (c.num_global_kv_heads == 0 || c.num_heads % c.num_global_kv_heads == 0),
       "num_global_key_value_heads", fmt::format("must divide num_attention_heads ({})", c.num_heads));
  need(c.global_rope_theta > 0, "global_rope_theta", "must be positive");
  need(c.global_partial_rotary_factor > 0 && c.global_partial_rotary_factor <= 1,
       "global_partial_rotary_factor", "must be in (0, 1]");
  need(!c.attention_bias, "attention_bias", "Gemma 4 has no projection biases");
  need(!c.qk_norm, "qk_norm", "is implied by model_type gemma4 (leave it false)");
  need(c.tie_word_embeddings, "tie_word_embeddings", "Gemma 4's head is tied to the embedding");
  need(c.num_experts >= 0, "num_experts", "must be >= 0");
  if (c.num_experts > 0) {
    need(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, "top_k_experts",
         fmt::format("must be in 1..num_experts ({})", c.num_experts));
    need(c.moe_intermediate_size > 0, "moe_intermediate_size", "must be positive with experts");
  }
}

// The Gemma 4 keys, named as in Gemma4TextConfig except the flattened RoPE pair (global_rope_theta,
// global_partial_rotary_factor: rope_parameters.full_attention there) and num_experts_per_tok
// (top_k_experts there; the name the Qwen MoE configs use).
void read_family_yaml(const Gemma4Family& /*family*/, const YamlReader& r, ModelCard& c) {
  constexpr int64_t kMax = int64_t{1} << 40;
  c.layer_types = read_layer_types_yaml(r, {AttentionKind::kSliding, AttentionKind::kFull},
                                        gemma4_default_layer_types(c.num_layers));
  c.sliding_window = r.integer_or("sliding_window", 512, 1, kMax);
  c.global_head_dim = r.integer_or("global_head_dim", 512, 2, 100000);
  c.num_global_kv_heads = r.integer_or("num_global_key_value_heads", 0, 0, 100000);
  c.attention_k_eq_v = r.boolean_or("attention_k_eq_v", false);
  c.global_rope_theta = r.number_or("global_rope_theta", 1e6, 1e-9, 1e12, "");
  c.global_partial_rotary_factor = r.number_or("global_partial_rotary_factor", 0.25, 1e-9, 1.0, "");
  c.num_experts = r.integer_or("num_experts", 0, 0, 1 << 20);
  c.num_experts_per_tok = r.integer_or("num_experts_per_tok", 0, 0, 1 << 20);
  c.moe_intermediate_size = r.integer_or("moe_intermediate_size", 0, 0, kMax);
  c.final_logit_softcapping = r.number_or("final_logit_softcapping", 0.0, 0.0, 1e12, "");
}

void write_family_yaml(const Gemma4Family& /*family*/, YAML::Emitter& e, const ModelCard& c) {
  write_layer_types_yaml(e, c.layer_types);
  e << YAML::Key << "sliding_window" << YAML::Value << c.sliding_window;
  e << YAML::Key << "global_head_dim" << YAML::Value << c.global_head_dim;
  e << YAML::Key << "num_global_key_value_heads" << YAML::Value << c.num_global_kv_heads;
  e << YAML::Key << "attention_k_eq_v" << YAML::Value << c.attention_k_eq_v;
  e << YAML::Key << "global_rope_theta" << YAML::Value << c.global_rope_theta;
  e << YAML::Key << "global_partial_rotary_factor" << YAML::Value << c.global_partial_rotary_factor;
  if (c.moe()) {
    e << YAML::Key << "num_experts" << YAML::Value << c.num_experts;
    e << YAML::Key << "num_experts_per_tok" << YAML::Value << c.num_experts_per_tok;
    e << YAML::Key << "moe_intermediate_size" << YAML::Value << c.moe_intermediate_size;
  }
  e << YAML::Key << "final_logit_softcapping" << YAML::Value << c.final_logit_softcapping;
}

}  // namespace slidedp
