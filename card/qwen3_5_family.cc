// The Qwen3.5/3.6 family's card: Gated DeltaNet and gated full-attention layers (partial RoPE), the
// MoE block of qwen3_5_moe with its shared expert, its YAML keys and checks.
#include "card/qwen3_5_family.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "card/layer_types_yaml.h"
#include "common/yaml_reader.h"

namespace slidedp {

std::vector<AttentionKind> qwen3_5_default_layer_types(int64_t num_layers, int64_t full_attention_interval) {
  std::vector<AttentionKind> t(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = (static_cast<int64_t>(i) + 1) % full_attention_interval == 0 ? AttentionKind::kFull
                                                                        : AttentionKind::kLinear;
  return t;
}

void shape_layer(const Qwen35Family& /*family*/, const ModelCard& c, int64_t layer, LayerShape& s) {
  s.shared_expert_intermediate_size = c.shared_expert_intermediate_size;
  if (!c.layer_types.empty() && c.layer_types.at(static_cast<size_t>(layer)) == AttentionKind::kLinear) {
    s.attention = AttentionKind::kLinear;
    s.num_heads = s.num_kv_heads = s.head_dim = 0;
    s.rope_angles = 0;
    s.linear_k_heads = c.linear_num_key_heads;
    s.linear_v_heads = c.linear_num_value_heads;
    s.linear_k_dim = c.linear_key_head_dim;
    s.linear_v_dim = c.linear_value_head_dim;
    s.conv_kernel = c.linear_conv_kernel_dim;
    return;
  }
  s.output_gate = true;
  // partial RoPE: int(head_dim * factor) leading channels, pairs (j, j + rotary_dim / 2)
  s.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  s.rope_angles = s.rotary_dim / 2;
}

// model-families.md section 3.3.
int64_t decoder_layer_params(const Qwen35Family& /*family*/, const ModelCard& c, const LayerShape& s) {
  const int64_t C = c.hidden_size;
  int64_t n = 2 * C;  // input_layernorm, post_attention_layernorm
  if (s.linear()) {
    const int64_t conv = s.linear_conv_dim(), vd = s.linear_value_dim(), nv = s.linear_v_heads;
    n += conv * C + vd * C + 2 * nv * C;  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
    n += conv * s.conv_kernel + 2 * nv;   // conv1d (depthwise, no bias), dt_bias, A_log
    n += s.linear_v_dim + C * vd;         // the gated norm, out_proj
  } else {
    n +=
        2 * s.q_dim() * C + 2 * s.kv_dim() * C + s.q_dim() * C + 2 * s.head_dim;  // q+gate, k, v, o, q/k norm
  }
  if (s.moe()) {
    const int64_t Is = s.shared_expert_intermediate_size;
    n += s.num_experts * C + s.num_experts * 3 * s.expert_intermediate_size * C;  // router, packed experts
    n += 3 * Is * C + C;  // shared expert and its gate
  } else {
    n += 3 * C * s.intermediate_size;
  }
  return n;
}

// The hybrid schedule, the DeltaNet's dimensions, the MoE block of qwen3_5_moe.
void validate_family(const Qwen35Family& /*family*/, const ModelCard& c, const CardCheck& need) {
  need(static_cast<int64_t>(c.layer_types.size()) == c.num_layers, "layer_types",
       fmt::format("has {} entries for {} layers", c.layer_types.size(), c.num_layers));
  for (AttentionKind k : c.layer_types)
    need(k != AttentionKind::kSliding, "layer_types",
         "Qwen3.5/3.6 layers are linear_attention or full_attention");
  need(c.linear_num_key_heads > 0, "linear_num_key_heads",
       "must be positive (the Gated DeltaNet's key heads)");
  need(c.linear_num_value_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
       "linear_num_value_heads",
       fmt::format("must be a positive multiple of linear_num_key_heads ({})", c.linear_num_key_heads));
  need(c.linear_key_head_dim > 0, "linear_key_head_dim", "must be positive");
  need(c.linear_value_head_dim > 0, "linear_value_head_dim", "must be positive");
  need(c.linear_conv_kernel_dim == 4, "linear_conv_kernel_dim",
       fmt::format("{} is not supported: the released models and the units use 4", c.linear_conv_kernel_dim));
  need(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1 &&
           static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor) % 2 == 0,
       "partial_rotary_factor", "must be in (0, 1] and leave an even number of rotated channels");
  need(!c.tie_word_embeddings, "tie_word_embeddings", "Qwen3.5/3.6's head is untied");
  need(!c.attention_bias && !c.qk_norm, "model_type",
       "q/k norm is implied by the family and there are no biases");
  need(c.sliding_window == 0 && c.global_head_dim == 0 && c.num_global_kv_heads == 0 && !c.attention_k_eq_v &&
           c.global_rope_theta == 0 && c.final_logit_softcapping == 0,
       "model_type", "sliding windows, global heads, K=V and a logit softcap are Gemma 4's, not Qwen3.6's");
  const bool moe_type = c.model_type == "qwen3_5_moe";
  need(moe_type == (c.num_experts > 0), "num_experts",
       moe_type ? "qwen3_5_moe needs experts" : "qwen3_5 is dense (qwen3_5_moe has experts)");
  if (moe_type) {
    need(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, "num_experts_per_tok",
         fmt::format("must be in 1..num_experts ({})", c.num_experts));
    need(c.moe_intermediate_size > 0, "moe_intermediate_size", "must be positive");
    need(c.shared_expert_intermediate_size > 0, "shared_expert_intermediate_size", "must be positive");
    need(c.intermediate_size == 0, "intermediate_size",
         "must be 0: every qwen3_5_moe layer's MLP is the MoE block");
  } else {
    need(c.shared_expert_intermediate_size == 0, "shared_expert_intermediate_size", "only with experts");
  }
}

// The Qwen3.5/3.6 keys, named as in Qwen3_5TextConfig, with rope_parameters' partial_rotary_factor
// flattened.
void read_family_yaml(const Qwen35Family& /*family*/, const YamlReader& r, ModelCard& c) {
  constexpr int64_t kMax = int64_t{1} << 40;
  c.layer_types = read_layer_types_yaml(r, {AttentionKind::kLinear, AttentionKind::kFull},
                                        qwen3_5_default_layer_types(c.num_layers));
  c.linear_num_key_heads = r.integer("linear_num_key_heads", 1, 100000);
  c.linear_num_value_heads = r.integer("linear_num_value_heads", 1, 100000);
  c.linear_key_head_dim = r.integer("linear_key_head_dim", 1, 100000);
  c.linear_value_head_dim = r.integer("linear_value_head_dim", 1, 100000);
  c.linear_conv_kernel_dim = r.integer_or("linear_conv_kernel_dim", 4, 1, 1024);
  c.partial_rotary_factor = r.number_or("partial_rotary_factor", 0.25, 1e-9, 1.0, "");
  c.num_experts = r.integer_or("num_experts", 0, 0, 1 << 20);
  c.num_experts_per_tok = r.integer_or("num_experts_per_tok", 0, 0, 1 << 20);
  c.moe_intermediate_size = r.integer_or("moe_intermediate_size", 0, 0, kMax);
  c.shared_expert_intermediate_size = r.integer_or("shared_expert_intermediate_size", 0, 0, kMax);
}

void write_family_yaml(const Qwen35Family& /*family*/, YAML::Emitter& e, const ModelCard& c) {
  write_layer_types_yaml(e, c.layer_types);
  e << YAML::Key << "linear_num_key_heads" << YAML::Value << c.linear_num_key_heads;
  e << YAML::Key << "linear_num_value_heads" << YAML::Value << c.linear_num_value_heads;
  e << YAML::Key << "linear_key_head_dim" << YAML::Value << c.linear_key_head_dim;
  e << YAML::Key << "linear_value_head_dim" << YAML::Value << c.linear_value_head_dim;
  e << YAML::Key << "linear_conv_kernel_dim" << YAML::Value << c.linear_conv_kernel_dim;
  e << YAML::Key << "partial_rotary_factor" << YAML::Value << c.partial_rotary_factor;
  if (c.moe()) {
    e << YAML::Key << "num_experts" << YAML::Value << c.num_experts;
    e << YAML::Key << "num_experts_per_tok" << YAML::Value << c.num_experts_per_tok;
    e << YAML::Key << "moe_intermediate_size" << YAML::Value << c.moe_intermediate_size;
    e << YAML::Key << "shared_expert_intermediate_size" << YAML::Value << c.shared_expert_intermediate_size;
  }
}

}  // namespace slidedp
