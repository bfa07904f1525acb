// The tiny Gemma 4 and Qwen3.6 cards of the kernel tests (both layer types of each family, dense
// or with a miniature MoE block), as model-card YAML.
#pragma once

#include <string>

#include "card/model_card.h"

namespace slidedp::kernels::test {

inline constexpr const char* kTinyGemma4 =
    "name: tiny-gemma4\nmodel_type: gemma4\nhidden_size: 12\nnum_hidden_layers: 2\n"
    "num_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 4\nintermediate_size: 10\nvocab_size: 23\n"
    "rms_norm_eps: 1e-6\nlayer_types: [sliding_attention, full_attention]\nsliding_window: 3\n"
    "global_head_dim: 8\nnum_global_key_value_heads: 1\nattention_k_eq_v: true\nglobal_rope_theta: 100.0\n"
    "global_partial_rotary_factor: 0.5\nrope_theta: 50.0\nfinal_logit_softcapping: 30.0\n";

inline ModelCard tiny_gemma4(bool moe) {
  // the 26B-A4B shape in miniature: 5 experts, 2 per token, each with intermediate size 3
  const std::string experts = moe ? "num_experts: 5\nnum_experts_per_tok: 2\nmoe_intermediate_size: 3\n" : "";
  return model_card_from_yaml(std::string(kTinyGemma4) + experts, moe ? "tiny-gemma4-moe" : "tiny-gemma4");
}

inline constexpr const char* kTinyQwen =
    "hidden_size: 8\nnum_hidden_layers: 2\nnum_attention_heads: 2\nnum_key_value_heads: 1\nhead_dim: 8\n"
    "vocab_size: 23\nrms_norm_eps: 1e-6\nrope_theta: 1000.0\npartial_rotary_factor: 0.5\n"
    "layer_types: [linear_attention, full_attention]\nlinear_num_key_heads: 2\nlinear_num_value_heads: 4\n"
    "linear_key_head_dim: 4\nlinear_value_head_dim: 3\nlinear_conv_kernel_dim: 4\n";

inline ModelCard tiny_qwen(bool moe) {
  const std::string ffn = moe ? "name: tiny-qwen3-5-moe\nmodel_type: qwen3_5_moe\nintermediate_size: 0\n"
                                "num_experts: 5\nnum_experts_per_tok: 2\nmoe_intermediate_size: 3\n"
                                "shared_expert_intermediate_size: 4\n"
                              : "name: tiny-qwen3-5\nmodel_type: qwen3_5\nintermediate_size: 10\n";
  return model_card_from_yaml(ffn + std::string(kTinyQwen), moe ? "tiny-qwen3-5-moe" : "tiny-qwen3-5");
}

}  // namespace slidedp::kernels::test
