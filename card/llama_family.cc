// The Llama-style family's card: every layer the card's common shape; no keys of its own.
#include "card/llama_family.h"

#include <fmt/format.h>

namespace slidedp {

void shape_layer(const LlamaFamily& /*family*/, const ModelCard& /*c*/, int64_t /*layer*/,
                 LayerShape& /*s*/) {}

int64_t decoder_layer_params(const LlamaFamily& /*family*/, const ModelCard& c, const LayerShape& s) {
  const int64_t C = c.hidden_size, q = s.q_dim(), kv = s.kv_dim();
  int64_t n = C * q + C * kv + (s.k_eq_v ? 0 : C * kv) + q * C;  // q, k, v (unless K=V), o
  if (c.attention_bias) n += q + 2 * kv;
  if (c.qk_norm) n += 2 * s.head_dim;
  n += 3 * C * s.intermediate_size;  // gate, up, down
  n += 2 * C;                        // input_layernorm, post_attention_layernorm
  return n;
}

void validate_family(const LlamaFamily& /*family*/, const ModelCard& c, const CardCheck& need) {
  need(c.layer_types.empty() && c.sliding_window == 0 && c.global_head_dim == 0 &&
           c.num_global_kv_heads == 0 && !c.attention_k_eq_v && c.global_rope_theta == 0 &&
           c.num_experts == 0 && c.final_logit_softcapping == 0,
       "model_type",
       fmt::format("'{}' has no sliding/global layers, experts or logit softcap (Gemma 4 only)",
                   c.model_type));
}

void read_family_yaml(const LlamaFamily& /*family*/, const YamlReader& /*r*/, ModelCard& /*c*/) {}

void write_family_yaml(const LlamaFamily& /*family*/, YAML::Emitter& /*e*/, const ModelCard& /*c*/) {}

}  // namespace slidedp
