// Qwen3.6 model cards (qwen3_5 / qwen3_5_moe): the presets' parameter counts against the totals
// computed in shared/reference/model-families.md section 3.5, the per-layer breakdown, the 3:1 layer
// schedule, the checkpoint's tensor names and shapes (section 3.3, including the third-party count of
// 851 names for the 27B text model), config.json parsing of the released layout and its refusals,
// the costs (a Gated DeltaNet layer's mixer is linear in T), and that no backend runs it yet.
#include <gtest/gtest.h>

#include <string>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/error.h"
#include "model/model_costs.h"
#include "tests/model/config_edit_util.h"

namespace slidedp {
namespace {

TEST(Qwen36Card, PresetTotalsEqualTheReferenceExactly) {
  const ModelCard dense = model_preset("qwen3.6-27b");
  EXPECT_EQ(dense.total_params(), 26895998464);
  EXPECT_EQ(dense.active_params(), 26895998464);
  const ModelCard moe = model_preset("qwen3.6-35b-a3b");
  EXPECT_EQ(moe.total_params(), 34660610688);
  EXPECT_EQ(moe.active_params(), 3454988928);  // embedding and head included, as the reference counts
  for (const ModelCard& c : {dense, moe}) {
    const ModelLayout m = make_model_layout(c);
    EXPECT_EQ(m.total_params, c.total_params()) << c.name;
    EXPECT_EQ(m.num_units(), c.num_layers + 2) << c.name;
  }
}

TEST(Qwen36Card, PerLayerBreakdownMatchesTheReference) {
  // Section 3.5: per layer GDN / full attention and FFN; the two layer norms besides.
  const ModelCard dense = model_preset("qwen3.6-27b");
  EXPECT_EQ(dense.decoder_layer_params(0), 115876064 + 267386880 + 2 * 5120);  // linear attention
  EXPECT_EQ(dense.decoder_layer_params(3), 104858112 + 267386880 + 2 * 5120);  // full attention
  const ModelCard moe = model_preset("qwen3.6-35b-a3b");
  EXPECT_EQ(moe.decoder_layer_params(0), 33718464 + 808978432 + 2 * 2048);
  EXPECT_EQ(moe.decoder_layer_params(3), 27263488 + 808978432 + 2 * 2048);
}

TEST(Qwen36Card, ThreeDeltaNetLayersForEveryFullAttentionLayer) {
  for (const char* name : {"qwen3.6-27b", "qwen3.6-35b-a3b"}) {
    const ModelCard c = model_preset(name);
    int full = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerShape s = c.layer(l);
      EXPECT_EQ(s.linear(), (l + 1) % 4 != 0) << name << " layer " << l;
      if (s.linear()) continue;
      ++full;
      EXPECT_TRUE(s.output_gate);
      EXPECT_EQ(s.rotary_dim, 64);  // partial RoPE: 64 of 256 channels
    }
    EXPECT_EQ(full, c.num_layers / 4) << name;
    EXPECT_FALSE(c.uniform_layers());
  }
}

TEST(Qwen36Card, TensorNamesAndShapesAreTheCheckpoints) {
  const ModelLayout dense = make_model_layout(model_preset("qwen3.6-27b"));
  int64_t names = 0;
  std::map<std::string, std::vector<int64_t>> shape;
  for (const UnitLayout& u : dense.units)
    for (const TensorSpec& t : u.tensors) ++names, shape[t.name] = t.shape;
  EXPECT_EQ(names, 851);  // 48 x 14 + 16 x 11 + 3, a third-party count of the released 27B text model
  const std::string l62 = "model.language_model.layers.62.", l63 = "model.language_model.layers.63.";
  EXPECT_EQ(shape.at(l62 + "linear_attn.in_proj_qkv.weight"), (std::vector<int64_t>{10240, 5120}));
  EXPECT_EQ(shape.at(l62 + "linear_attn.conv1d.weight"), (std::vector<int64_t>{10240, 1, 4}));
  EXPECT_EQ(shape.at(l62 + "linear_attn.norm.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(shape.at(l63 + "self_attn.q_proj.weight"), (std::vector<int64_t>{12288, 5120}));
  EXPECT_EQ(shape.at(l63 + "self_attn.o_proj.weight"), (std::vector<int64_t>{5120, 6144}));
  EXPECT_EQ(shape.at("lm_head.weight"), (std::vector<int64_t>{248320, 5120}));
  const ModelLayout moe = make_model_layout(model_preset("qwen3.6-35b-a3b"));
  std::map<std::string, std::vector<int64_t>> moe_shape;
  for (const UnitLayout& u : moe.units)
    for (const TensorSpec& t : u.tensors) moe_shape[t.name] = t.shape;
  const std::string l0 = "model.language_model.layers.0.";
  EXPECT_EQ(moe_shape.at(l0 + "mlp.gate.weight"), (std::vector<int64_t>{256, 2048}));
  EXPECT_EQ(moe_shape.at(l0 + "mlp.experts.gate_up_proj"), (std::vector<int64_t>{256, 1024, 2048}));
  EXPECT_EQ(moe_shape.at(l0 + "mlp.experts.down_proj"), (std::vector<int64_t>{256, 2048, 512}));
  EXPECT_EQ(moe_shape.at(l0 + "mlp.shared_expert_gate.weight"), (std::vector<int64_t>{1, 2048}));
  EXPECT_EQ(moe_shape.at(l0 + "linear_attn.in_proj_z.weight"), (std::vector<int64_t>{4096, 2048}));
}

// The released layout: the text model under text_config, rope_parameters with the mRoPE fields, the
// vision and MTP parts beside it. It reads back as the preset's architecture, and our own config.json
// round-trips.
TEST(Qwen36HfConfig, ReadsTheReleasedLayoutAsThePreset) {
  const std::string config = R"({
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": false, "vision_config": {"depth": 27},
    "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
      "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320,
      "max_position_embeddings": 262144, "rms_norm_eps": 1e-06, "attn_output_gate": true, "hidden_act": "silu",
      "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
      "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
      "shared_expert_intermediate_size": 512, "router_aux_loss_coef": 0.001, "mtp_num_hidden_layers": 1,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                          "mrope_section": [11, 11, 10], "mrope_interleaved": true}}})";
  const ModelCard c = model_card_from_hf_config(config, "config.json");
  EXPECT_EQ(architecture_differences(c, model_preset("qwen3.6-35b-a3b")), std::vector<std::string>{});
  const ModelCard dense = model_preset("qwen3.6-27b");
  const ModelCard back = model_card_from_hf_config(model_card_to_hf_config(dense), "config.json");
  EXPECT_EQ(architecture_differences(back, dense), std::vector<std::string>{});
  EXPECT_EQ(architecture_differences(model_card_from_yaml(model_card_to_yaml(dense), "y"), dense),
            std::vector<std::string>{});
}

TEST(Qwen36HfConfig, RefusesWhatIsNotImplementedNamingTheKey) {
  const std::string base = model_card_to_hf_config(model_preset("qwen3.6-27b"));
  struct Case {
    std::string from, to, key;
  };
  for (const Case& c :
       {Case{"\"linear_attention\"", "\"sliding_attention\"", "layer_types"},
        Case{"\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 3", "linear_conv_kernel_dim"},
        Case{"\"linear_num_value_heads\": 48,", "", "linear_num_value_heads"},
        Case{"\"attn_output_gate\": true", "\"attn_output_gate\": false", "attn_output_gate"}})
    testing::expect_edited_config_refused(base, c.from, c.to, c.key);
}

// Keys of the wrong type or value are refused naming the key, never ignored or crashed on: an
// interval of 0 divided by zero (SIGFPE in every tool), rope_parameters as a list fell back to the
// defaults, an empty layer_types was blamed on a tensor.
TEST(Qwen36HfConfig, RefusesWrongTypesAndValuesNamingTheKey) {
  std::string base = model_card_to_hf_config(model_preset("qwen3.6-27b"));
  const std::string types_key = "\"layer_types\": [";
  const std::size_t from = base.find(types_key), to = base.find(']', from);
  ASSERT_NE(from, std::string::npos);
  const std::string without_types = base.substr(0, from) + "\"full_attention_interval\": 4, \"ignored_types\": []" +
                                    base.substr(to + 1);
  EXPECT_EQ(model_card_from_hf_config(without_types, "c.json").layer_types, model_preset("qwen3.6-27b").layer_types);
  testing::expect_edited_config_refused(without_types, "\"full_attention_interval\": 4", "\"full_attention_interval\": 0",
                                        "full_attention_interval");
  testing::expect_edited_config_refused(base, base.substr(from, to + 1 - from), "\"layer_types\": []",
                                        "layer_types: has 0 entries for 64 layers");
  const std::size_t rp = base.find("\"rope_parameters\": {"), rp_end = base.find('}', rp);
  testing::expect_edited_config_refused(base, base.substr(rp, rp_end + 1 - rp), "\"rope_parameters\": [10000000]",
                                        "rope_parameters: expected an object");
  // A rope_parameters without theta takes the top-level one, as transformers fills it; the two
  // stated differently are refused.
  std::string top = base;
  top.replace(rp, rp_end + 1 - rp, "\"rope_theta\": 5000000, \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}");
  EXPECT_EQ(model_card_from_hf_config(top, "c.json").rope_theta, 5e6);
  testing::expect_edited_config_refused(top, "\"rope_type\": \"default\",", "\"rope_type\": \"default\", \"rope_theta\": 1000000,",
                                        "rope_theta: 5000000 disagrees with rope_parameters.rope_theta");
}

// A DeltaNet layer's mixer is a state, not a T x T matrix: its FLOPs double with T, a full-attention
// layer's scores nearly quadruple. The MoE layer computes with 8 experts and the shared one.
TEST(Qwen36Costs, TheDeltaNetIsLinearInTheSequenceAndTheMoeComputesWithTheActiveExperts) {
  const ModelCard c = model_preset("qwen3.6-35b-a3b");
  const UnitFlops lin_t = unit_flops(c, UnitKind::kDecoder, 0, 1, 65536);
  const UnitFlops lin_2t = unit_flops(c, UnitKind::kDecoder, 0, 1, 131072);
  EXPECT_DOUBLE_EQ(lin_2t.forward_attention, 2.0 * lin_t.forward_attention);
  const UnitFlops full_t = unit_flops(c, UnitKind::kDecoder, 3, 1, 65536);
  const UnitFlops full_2t = unit_flops(c, UnitKind::kDecoder, 3, 1, 131072);
  EXPECT_GT(full_2t.forward_attention, 3.99 * full_t.forward_attention);
  // per token: 2 x (active mixer + router + 8 experts + shared expert and gate) weights
  const double C = 2048, mixer = 8192.0 * C + 4096 * C + 2 * 32 * C + C * 4096;
  const double ffn = 256 * C + 8 * 3 * 512 * C + 3 * 512 * C + C;
  EXPECT_DOUBLE_EQ(lin_t.forward_matmul, 2.0 * (mixer + ffn) * 65536);
  EXPECT_GT(decoder_activation_bytes_per_token(c, 0, 0).saved_keep, 0);
}

}  // namespace
}  // namespace slidedp
