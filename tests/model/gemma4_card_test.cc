// Gemma 4 model cards: the presets' parameter counts against the totals computed in
// shared/reference/model-families.md section 2.5 (from the converter's configs; they match the
// published "30.7B" and "25.2B total / 3.8B active"), the per-layer breakdown, the layer schedule,
// config.json parsing of the released multimodal layout, the refused variants, and the tensor
// names and shapes of the checkpoint (section 2.3).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "card/gemma4_family.h"
#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/error.h"
#include "model/model_costs.h"
#include "tests/model/config_edit_util.h"

namespace slidedp {
namespace {

TEST(Gemma4Card, PresetTotalsEqualTheReferenceExactly) {
  EXPECT_EQ(model_preset("gemma-4-31b").total_params(), 30697345340);
  EXPECT_EQ(model_preset("gemma-4-31b").active_params(), 30697345340);  // dense
  const ModelCard moe = model_preset("gemma-4-26b-a4b");
  EXPECT_EQ(moe.total_params(), 25233141790);
  EXPECT_EQ(moe.active_params(), 3822530590);
  for (const char* name : {"gemma-4-31b", "gemma-4-26b-a4b"}) {
    const ModelCard c = model_preset(name);
    const ModelLayout m = make_model_layout(c);
    EXPECT_EQ(m.total_params, c.total_params()) << name;
    EXPECT_EQ(m.num_units(), c.num_layers + 2) << name;
  }
}

TEST(Gemma4Card, PerLayerBreakdownMatchesTheReference) {
  // Section 2.5: attention (sliding / global) and MLP per layer; 4 norms and layer_scalar besides.
  const ModelCard big = model_preset("gemma-4-31b");
  const int64_t big_rest = 346816512 + 4 * 5376 + 1;
  EXPECT_EQ(big.decoder_layer_params(0), 132121088 + big_rest);  // sliding
  EXPECT_EQ(big.decoder_layer_params(5), 187171840 + big_rest);  // full, K=V
  const ModelCard moe = model_preset("gemma-4-26b-a4b");
  const int64_t router = 128 * 2816 + 2816 + 128, norms = 7 * 2816 + 1;
  EXPECT_EQ(moe.decoder_layer_params(0), 34603520 + 17842176 + 761266176 + router + norms);
  EXPECT_EQ(moe.decoder_layer_params(29), 49021952 + 17842176 + 761266176 + router + norms);
}

TEST(Gemma4Card, LayerScheduleAndShapes) {
  const ModelCard c = model_preset("gemma-4-31b");
  EXPECT_FALSE(c.uniform_layers());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerShape s = c.layer(l);
    const bool full = l % 6 == 5;  // full attention at 5, 11, ..., 59
    EXPECT_EQ(s.attention == AttentionKind::kFull, full) << l;
    EXPECT_EQ(s.head_dim, full ? 512 : 256) << l;
    EXPECT_EQ(s.num_kv_heads, full ? 4 : 16) << l;
    EXPECT_EQ(s.k_eq_v, full) << l;
    EXPECT_EQ(s.window, full ? 0 : 1024) << l;
    EXPECT_DOUBLE_EQ(s.rope_theta, full ? 1e6 : 1e4) << l;
    EXPECT_EQ(s.rope_angles, full ? 64 : 128) << l;  // proportional RoPE: int(0.25 * 512 // 2)
  }
  // The last layer is full attention even when the 5:1 pattern would not end on one.
  const std::vector<AttentionKind> t = gemma4_default_layer_types(8);
  EXPECT_EQ(t[5], AttentionKind::kFull);
  EXPECT_EQ(t[6], AttentionKind::kSliding);
  EXPECT_EQ(t[7], AttentionKind::kFull);
}

TEST(Gemma4Card, TensorNamesAndShapesAreTheCheckpoints) {
  const ModelCard c = model_preset("gemma-4-26b-a4b");
  const ModelLayout m = make_model_layout(c);
  EXPECT_NE(m.units.front().find("model.language_model.embed_tokens.weight"), nullptr);
  EXPECT_NE(m.units.back().find("model.language_model.norm.weight"), nullptr);
  EXPECT_TRUE(m.units.back().reads_tied_embedding);
  EXPECT_EQ(m.units.back().find("lm_head.weight"), nullptr);
  const UnitLayout& sliding = m.units[1];
  EXPECT_EQ(sliding.at("self_attn.v_proj.weight").shape, (std::vector<int64_t>{2048, 2816}));
  EXPECT_EQ(sliding.at("experts.gate_up_proj").shape, (std::vector<int64_t>{128, 1408, 2816}));
  EXPECT_EQ(sliding.at("experts.down_proj").shape, (std::vector<int64_t>{128, 2816, 704}));
  EXPECT_EQ(sliding.at("router.proj.weight").shape, (std::vector<int64_t>{128, 2816}));
  EXPECT_EQ(sliding.at("router.per_expert_scale").shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(sliding.at("layer_scalar").shape, (std::vector<int64_t>{1}));
  const UnitLayout& global = m.units[6];  // layer 5
  EXPECT_EQ(global.prefix(), "model.language_model.layers.5.");
  EXPECT_EQ(global.find("model.language_model.layers.5.self_attn.v_proj.weight"), nullptr);  // K=V
  EXPECT_EQ(global.at("self_attn.q_proj.weight").shape, (std::vector<int64_t>{8192, 2816}));
  EXPECT_EQ(global.at("self_attn.k_proj.weight").shape, (std::vector<int64_t>{1024, 2816}));
  EXPECT_EQ(global.at("self_attn.q_norm.weight").shape, (std::vector<int64_t>{512}));
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                           "post_feedforward_layernorm_2"})
    EXPECT_EQ(global.at(std::string(norm) + ".weight").shape, (std::vector<int64_t>{2816})) << norm;
  // Units differ in size, and one unit holds all 128 experts of its layer.
  EXPECT_NE(m.units[1].flat_numel, m.units[6].flat_numel);
  EXPECT_GT(m.units[1].param_count, 761266176);
}

// A released-style config.json: the text model under text_config, a vision tower beside it.
const char* kReleased26B = R"({
  "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
  "text_config": {
    "model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 2,
    "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": true, "intermediate_size": 2112,
    "enable_moe_block": true, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
    "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "sliding_window": 1024,
    "final_logit_softcapping": 30.0, "max_position_embeddings": 262144, "vocab_size": 262144,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}}},
  "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152},
  "tie_word_embeddings": true})";

TEST(Gemma4HfConfig, ReadsTheTextModelOfTheReleasedLayout) {
  const ModelCard c = model_card_from_hf_config(kReleased26B, "/m/config.json");
  EXPECT_TRUE(c.is_family<Gemma4Family>());
  EXPECT_EQ(c.total_params(), 25233141790);
  EXPECT_EQ(c.active_params(), 3822530590);
  EXPECT_NE(c.source.find("vision tower is not trained"), std::string::npos) << c.source;
  // Written back and read again: the same card (a text-only gemma4 folder).
  ModelCard back = model_card_from_hf_config(model_card_to_hf_config(c), "again.json");
  back.name = c.name, back.source = c.source;
  EXPECT_EQ(model_card_to_yaml(back), model_card_to_yaml(c));
}

TEST(Gemma4HfConfig, RefusesVariantsWeDoNotTrainNamingTheKey) {
  auto error_of = [](const std::string& json) -> std::string {
    try {
      model_card_from_hf_config(json, "/m/config.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // E2B/E4B: per-layer embeddings are on by default (Gemma4TextConfig's 256).
  EXPECT_NE(error_of(R"({"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35})")
                .find("hidden_size_per_layer_input"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "gemma4_text", "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 20})")
                .find("num_kv_shared_layers"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "gemma4"})").find("/m/config.json: text_config"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "gemma4_text", "hidden_size_per_layer_input": 0,
                         "enable_moe_block": true, "num_experts": 4, "top_k_experts": 8, "moe_intermediate_size": 8})")
                .find("top_k_experts"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "gemma4_text", "hidden_size_per_layer_input": 0, "layer_types": ["x"]})")
                .find("layer_types"),
            std::string::npos);
}

// Found by fuzz/targets/hf_config_json.cc: a rope_type that is not a string (here a list) ended in a
// JSON type error, which the tools report as exit 1; it is bad input naming the key.
// An empty layer_types was accepted and the run failed on a tensor that follows from it.
TEST(Gemma4HfConfig, ALayerTypesListOfTheWrongLengthIsRefusedNamingTheKey) {
  testing::expect_edited_config_refused(kReleased26B, "\"num_hidden_layers\": 30,",
                                        "\"num_hidden_layers\": 30, \"layer_types\": [],",
                                        "layer_types: has 0 entries for 30 layers");
}

// transformers 5.15+ saves the full-attention layers' shapes as per_layer_config instead of
// global_head_dim / num_global_key_value_heads: the same model (without it the 26B-A4B's full layers
// read 0 global KV heads and took the sliding layers' 8).
TEST(Gemma4HfConfig, PerLayerConfigOfTransformers515IsTheSameModel) {
  const ModelCard released = model_card_from_hf_config(kReleased26B, "/m/config.json");
  std::string per_layer = kReleased26B;
  const std::string from = "\"num_global_key_value_heads\": 2,";
  per_layer.replace(per_layer.find(from), from.size(), "");
  const std::string g = "\"global_head_dim\": 512,";
  std::string entries;
  for (int64_t l = 0; l < released.num_layers; ++l)
    if (released.layer_types[static_cast<size_t>(l)] == AttentionKind::kFull)
      entries += fmt::format("{}\"{:02d}\": {{\"head_dim\": 512, \"num_key_value_heads\": 2}}", entries.empty() ? "" : ", ", l);
  per_layer.replace(per_layer.find(g), g.size(), "\"per_layer_config\": {" + entries + "},");
  const ModelCard read = model_card_from_hf_config(per_layer, "/m/config.json");
  EXPECT_EQ(read.global_head_dim, 512);
  EXPECT_EQ(read.num_global_kv_heads, 2);
  EXPECT_EQ(architecture_differences(read, released), std::vector<std::string>{});
  testing::expect_edited_config_refused(per_layer, "\"05\": {\"head_dim\": 512", "\"04\": {\"head_dim\": 512",
                                        "per_layer_config.04: layer 04 is a sliding-attention layer");
  testing::expect_edited_config_refused(per_layer, "\"11\": {\"head_dim\": 512, \"num_key_value_heads\": 2}",
                                        "\"11\": {\"head_dim\": 512, \"num_key_value_heads\": 4}",
                                        "per_layer_config.11.num_key_value_heads");
  testing::expect_edited_config_refused(per_layer, "\"per_layer_config\": {", "\"global_head_dim\": 256, \"per_layer_config\": {",
                                        "global_head_dim: 256 disagrees with per_layer_config (512)");
}

TEST(Gemma4HfConfig, ARopeTypeThatIsNotAStringIsBadInputNamingTheKey) {
  testing::expect_edited_config_refused(kReleased26B, R"("rope_type": "proportional")", R"("rope_type": [[1]])",
                                        "full_attention: rope_type");
  testing::expect_edited_config_refused(kReleased26B, R"("rope_type": "default")", R"("rope_type": 7)",
                                        "sliding_attention: rope_type");
  testing::expect_edited_config_refused(
      R"({"model_type": "llama", "hidden_size": 16, "intermediate_size": 20, "vocab_size": 48, "num_hidden_layers": 3,
          "num_attention_heads": 2, "num_key_value_heads": 2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
      R"("rope_type": "llama3")", R"("rope_type": {"a": 1})", "rope_scaling: rope_type");
}

TEST(Gemma4Costs, SlidingWindowAttentionIsLinearInTheWindow) {
  // Closed form: a query at t sees min(t + 1, W) keys.
  for (int64_t T : {1, 5, 64, 1000}) {
    for (int64_t W : {0, 1, 7, 64, 4096}) {
      double naive = 0;
      for (int64_t t = 0; t < T; ++t) naive += static_cast<double>(W > 0 ? std::min(t + 1, W) : t + 1);
      EXPECT_DOUBLE_EQ(causal_pairs(T, W), naive) << T << " " << W;
    }
  }
  const ModelCard c = model_preset("gemma-4-31b");
  // At 64K tokens a sliding layer's attention is ~1/64 of a full layer's with the same heads and dims.
  const UnitFlops sliding = unit_flops(c, UnitKind::kDecoder, 0, 1, 65536);
  const UnitFlops full = unit_flops(c, UnitKind::kDecoder, 5, 1, 65536);
  EXPECT_NEAR(sliding.forward_attention / (full.forward_attention * 256.0 / 512.0), causal_pairs(65536, 1024) / causal_pairs(65536, 0), 1e-12);
}

TEST(Gemma4Costs, MoeComputesWithTheActiveExpertsOnly) {
  // Forward GEMM FLOPs per token are 2x the active linear weights: the experts count 8 of 128.
  const ModelCard c = model_preset("gemma-4-26b-a4b");
  const double C = 2816, tokens = 4096;
  const double attention = C * 4096 + 2 * C * 2048 + 4096 * C;  // sliding layer q, k, v, o
  const double dense = 3 * C * 2112, router = 128 * C, experts = 8 * 3 * 704 * C;
  const UnitFlops f = unit_flops(c, UnitKind::kDecoder, 0, 1, 4096);
  EXPECT_DOUBLE_EQ(f.forward_matmul, 2 * tokens * (attention + dense + router + experts));
}

}  // namespace
}  // namespace slidedp
