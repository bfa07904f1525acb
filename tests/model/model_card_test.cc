// Model cards: every preset's parameter count against the exact totals computed in
// shared/reference/model-configs.md (which match the checkpoints' byte totals) and within 1% of the
// published size; config.json parsing; strict YAML errors.
#include "card/model_card.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "card/unit_layout.h"
#include "common/error.h"
#include "tests/model/config_edit_util.h"

namespace slidedp {
namespace {

// Exact totals from the reference (checkpoint index total_size / 2 for bf16).
const std::map<std::string, int64_t> kExactTotals = {
    {"qwen2.5-7b", 7615616512},    {"qwen2.5-14b", 14770033664}, {"qwen2.5-32b", 32763876352},
    {"qwen2.5-72b", 72706203648},  {"qwen3-8b", 8190735360},     {"qwen3-14b", 14768307200},
    {"qwen3-32b", 32762123264},    {"llama-3.1-8b", 8030261248}, {"llama-3.1-70b", 70553706496},
    {"llama-3.2-1b", 1235814400},  {"llama-3.2-3b", 3212749824}, {"mistral-7b-v0.3", 7248023552},
};

TEST(ModelCard, EveryPresetMatchesTheCheckpointParameterCountExactly) {
  for (const auto& [name, total] : kExactTotals) {
    ModelCard c = model_preset(name);
    EXPECT_EQ(c.total_params(), total) << name;
    ModelLayout layout = make_model_layout(c);
    EXPECT_EQ(layout.total_params, total) << name;
    EXPECT_EQ(layout.num_units(), c.num_layers + 2) << name;
  }
}

TEST(ModelCard, EveryPublishedSizeIsWithinOnePercent) {
  // Qwen2.5-32B's card says 32.5B while its weights hold 32.76B (0.8% off): still within 1%.
  for (const std::string& name : model_preset_names()) {
    ModelCard c = model_preset(name);
    if (c.published_params <= 0) continue;  // our own test model
    double rel = std::fabs(static_cast<double>(c.total_params()) - c.published_params) / c.published_params;
    EXPECT_LT(rel, 0.01) << name << " computed " << c.total_params() << " published " << c.published_params;
  }
}

TEST(ModelCard, PerLayerBreakdownMatchesReference) {
  EXPECT_EQ(model_preset("qwen2.5-7b").decoder_layer_params(), 233057792);
  EXPECT_EQ(model_preset("qwen3-32b").decoder_layer_params(), 487598336);
  EXPECT_EQ(model_preset("llama-3.2-1b").decoder_layer_params(), 60821504);
}

TEST(ModelCard, UnknownPresetListsTheKnownOnes) {
  try {
    load_model_card("qwen9-1t");
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3-14b"), std::string::npos) << e.what();
  }
}

TEST(ModelCard, YamlRoundTripIsLossless) {
  for (const std::string& name : model_preset_names()) {
    ModelCard a = model_preset(name);
    ModelCard b = model_card_from_yaml(model_card_to_yaml(a), "roundtrip");
    EXPECT_EQ(model_card_to_yaml(a), model_card_to_yaml(b)) << name;
    EXPECT_EQ(a.total_params(), b.total_params());
  }
}

TEST(ModelCard, YamlRejectsUnknownKeysNamingFileAndKey) {
  const std::string text =
      "name: x\nmodel_type: llama\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
      "intermediate_size: 128\nvocab_size: 100\nhiden_size: 3\n";
  try {
    model_card_from_yaml(text, "card.yaml");
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("card.yaml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hiden_size"), std::string::npos) << msg;
  }
}

// yaml-cpp keeps the first of a repeated key silently and accepts a sequence as a key (which then
// failed as an internal error, exit 1). Every reader goes through YamlReader, which refuses both,
// naming the file, the key and its lines; nested maps too.
TEST(ModelCard, YamlRejectsRepeatedAndNonScalarKeysWithTheirLines) {
  const std::string body = "model_type: llama\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
                           "intermediate_size: 64\nvocab_size: 256\n";
  struct Case {
    std::string yaml, must_say;
  };
  for (const Case& c : {Case{"name: x\nname: y\n" + body, "card.yaml: name: given twice (lines 1 and 2)"},
                        Case{"name: x\n? [a, b]\n: 3\n" + body, "line 2: a key must be a plain name, not a sequence"},
                        Case{"name: x\n" + body + "rope_scaling:\n  rope_type: linear\n  factor: 2\n  factor: 4\n",
                             "rope_scaling.factor: given twice (lines 10 and 11)"}}) {
    SCOPED_TRACE(c.yaml);
    try {
      model_card_from_yaml(c.yaml, "card.yaml");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(c.must_say), std::string::npos) << e.what();
    }
  }
}

TEST(ModelCard, YamlRejectsOutOfRangeAndBadTypes) {
  EXPECT_THROW(model_card_from_yaml("name: x\nmodel_type: llama\nhidden_size: -5\nnum_hidden_layers: 2\n"
                                    "num_attention_heads: 4\nintermediate_size: 8\nvocab_size: 10\n",
                                    "c"),
               InputError);
  EXPECT_THROW(model_card_from_yaml("name: x\nmodel_type: gpt2\nhidden_size: 64\nnum_hidden_layers: 2\n"
                                    "num_attention_heads: 4\nintermediate_size: 8\nvocab_size: 10\n",
                                    "c"),
               InputError);
  EXPECT_THROW(model_card_from_yaml("name: [x\n", "c"), InputError);  // malformed YAML
  // kv heads must divide heads
  EXPECT_THROW(model_card_from_yaml("name: x\nmodel_type: llama\nhidden_size: 64\nnum_hidden_layers: 2\n"
                                    "num_attention_heads: 4\nnum_key_value_heads: 3\n"
                                    "intermediate_size: 8\nvocab_size: 10\n",
                                    "c"),
               InputError);
}

TEST(HfConfig, ParsesQwen3AndFillsArchitectureFacts) {
  const std::string json = R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 17408, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rope_theta": 1000000, "rope_scaling": null, "rms_norm_eps": 1e-06, "tie_word_embeddings": false,
    "attention_bias": false, "sliding_window": null, "use_sliding_window": false})";
  ModelCard c = model_card_from_hf_config(json, "config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.total_params(), 14768307200);
}

TEST(HfConfig, Qwen2HasBiasAndDefaultHeadDim) {
  const std::string json = R"({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
    "vocab_size": 152064, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": false, "use_sliding_window": false, "sliding_window": 131072})";
  ModelCard c = model_card_from_hf_config(json, "config.json");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.total_params(), 7615616512);
}

// transformers' Qwen3Config defaults head_dim to 128, not hidden/heads (Qwen3-0.6B/1.7B/4B have
// hidden/heads = 64/128/80): a config.json without the key must still load the released shapes.
TEST(HfConfig, Qwen3MissingHeadDimIs128LikeTransformers) {
  const std::string json = R"({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 1000})";
  EXPECT_EQ(model_card_from_hf_config(json, "config.json").head_dim, 128);
  // Llama and Mistral keep hidden/heads (their configs' default when the key is absent).
  const std::string llama = R"({"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "intermediate_size": 3072, "vocab_size": 1000})";
  EXPECT_EQ(model_card_from_hf_config(llama, "config.json").head_dim, 64);
}

TEST(HfConfig, LlamaRopeScalingAndRoundTrip) {
  ModelCard a = model_preset("llama-3.2-1b");
  ModelCard b = model_card_from_hf_config(model_card_to_hf_config(a), "config.json");
  EXPECT_EQ(b.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(b.rope_scaling.factor, 32.0);
  EXPECT_TRUE(b.tie_word_embeddings);
  EXPECT_EQ(b.total_params(), a.total_params());
}

// transformers 5 saves RoPE under rope_parameters (RotaryEmbeddingConfigMixin): a Qwen3 folder saved by
// it has no top-level rope_theta, and read only there it trained at theta 1e4 instead of 1e6,
// silently. Both layouts are read; the values are the same model's; "dtype" replaces "torch_dtype".
TEST(HfConfig, Transformers5RopeParametersAreReadAndWrittenBack) {
  const std::string qwen3 = R"({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 1000,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "dtype": "bfloat16"})";
  const ModelCard q = model_card_from_hf_config(qwen3, "config.json");
  EXPECT_EQ(q.rope_theta, 1e6);
  EXPECT_EQ(q.rope_scaling.type, "none");
  EXPECT_TRUE(q.hf_rope_parameters);
  const nlohmann::json written = nlohmann::json::parse(model_card_to_hf_config(q));
  EXPECT_EQ(written["rope_parameters"]["rope_theta"], 1e6) << written.dump();
  EXPECT_EQ(written["rope_parameters"]["rope_type"], "default") << written.dump();
  EXPECT_FALSE(written.contains("rope_theta")) << written.dump();
  EXPECT_FALSE(written.contains("rope_scaling")) << written.dump();
  EXPECT_EQ(written["dtype"], "bfloat16") << written.dump();
  EXPECT_FALSE(written.contains("torch_dtype")) << written.dump();

  // Llama 3.x: the scaling's fields sit beside rope_type and rope_theta.
  const std::string llama = R"({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
    "tie_word_embeddings": true, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
    "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})";
  const ModelCard l = model_card_from_hf_config(llama, "config.json");
  const ModelCard preset = model_preset("llama-3.2-1b");
  EXPECT_EQ(l.rope_theta, preset.rope_theta);
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_EQ(l.rope_scaling.factor, preset.rope_scaling.factor);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, preset.rope_scaling.original_max_position_embeddings);
  const ModelCard back = model_card_from_hf_config(model_card_to_hf_config(l), "again.json");
  EXPECT_TRUE(back.hf_rope_parameters);
  EXPECT_EQ(back.rope_theta, l.rope_theta);
  EXPECT_EQ(back.rope_scaling.factor, l.rope_scaling.factor);
  EXPECT_EQ(back.rope_scaling.high_freq_factor, l.rope_scaling.high_freq_factor);

  // transformers 4's layout is written back as it came.
  const nlohmann::json old = nlohmann::json::parse(model_card_to_hf_config(preset));
  EXPECT_TRUE(old.contains("rope_theta") && old.contains("rope_scaling") && old.contains("torch_dtype")) << old.dump();
  EXPECT_FALSE(old.contains("rope_parameters")) << old.dump();
}

// A config stating RoPE in both layouts is accepted when they agree and refused naming both keys when
// they do not; a rope_parameters that is not an object is refused, never ignored.
TEST(HfConfig, RopeStatedTwiceMustAgree) {
  const std::string head = R"({"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 1000, )";
  const ModelCard same = model_card_from_hf_config(
      head + R"("rope_theta": 1000000, "rope_scaling": null, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}})",
      "c.json");
  EXPECT_EQ(same.rope_theta, 1e6);
  const std::string base = head + R"("rope_theta": 1000000, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}})";
  testing::expect_edited_config_refused(base, R"("rope_theta": 1000000,)", R"("rope_theta": 10000,)",
                                        "rope_theta: 10000 disagrees with rope_parameters.rope_theta 1e+06");
  testing::expect_edited_config_refused(base, R"("rope_theta": 1000000,)",
                                        R"("rope_theta": 1000000, "rope_scaling": {"rope_type": "linear", "factor": 2},)",
                                        "rope_scaling: rope_type 'linear' disagrees with rope_parameters");
  testing::expect_edited_config_refused(base, R"("rope_parameters": {"rope_theta": 1000000, "rope_type": "default"})",
                                        R"("rope_parameters": [1000000])", "rope_parameters: expected an object");
  testing::expect_edited_config_refused(base, R"("rope_type": "default")", R"("rope_type": "yarn")",
                                        "rope_parameters.rope_type: 'yarn' is not supported");
  // An empty rope_scaling is absent, as transformers reads it.
  EXPECT_EQ(model_card_from_hf_config(head + R"("rope_scaling": {}, "rope_parameters": {"rope_theta": 500000, "rope_type": "linear", "factor": 2}})",
                                      "c.json")
                .rope_scaling.factor,
            2.0);
  // What these families do not have is refused, not ignored: partial RoPE, sliding layers.
  testing::expect_edited_config_refused(base, R"("rope_type": "default")",
                                        R"("rope_type": "default", "partial_rotary_factor": 0.5)",
                                        "rope_parameters.partial_rotary_factor");
  testing::expect_edited_config_refused(base, R"("rope_theta": 1000000,)",
                                        R"("rope_theta": 1000000, "layer_types": ["full_attention", "sliding_attention"],)",
                                        "layer_types");
}

// What nlohmann accepts or throws out_of_range for is bad input here: a number beyond double range
// (was exit 1, "internal error") and a key given twice (was: the last one silently won).
TEST(HfConfig, OutOfRangeNumbersAndRepeatedKeysAreBadInputNamingTheFile) {
  const std::string base = model_card_to_hf_config(model_preset("qwen3-8b"));
  testing::expect_edited_config_refused(base, "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e400", "1e400");
  testing::expect_edited_config_refused(base, "\"rope_theta\":", "\"rope_theta\": 5.0, \"rope_theta\":", "'rope_theta'");
}

TEST(HfConfig, ErrorsNameTheFileAndKey) {
  try {
    model_card_from_hf_config(R"({"model_type": "llama", "hidden_size": 64})", "/m/config.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/m/config.json: num_hidden_layers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_card_from_hf_config("{not json", "c.json"), InputError);
  EXPECT_THROW(model_card_from_hf_config(R"({"model_type": "gpt_neox"})", "c.json"), InputError);
  EXPECT_THROW(model_card_from_hf_config(
                   R"({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "intermediate_size": 8, "vocab_size": 10, "use_sliding_window": true})",
                   "c.json"),
               InputError);
}

TEST(UnitLayout, TensorsAreAlignedDisjointAndNamedLikeHuggingFace) {
  ModelCard c = model_preset("qwen2.5-7b");
  ModelLayout m = make_model_layout(c);
  const UnitLayout& u = m.units[3];
  EXPECT_EQ(u.layer, 2);
  ASSERT_NE(u.find("model.layers.2.self_attn.q_proj.bias"), nullptr);
  int64_t end = 0;
  for (const auto& t : u.tensors) {
    EXPECT_EQ(t.offset % kTensorAlignElems, 0) << t.name;
    EXPECT_GE(t.offset, end) << t.name;
    end = t.offset + t.numel;
  }
  EXPECT_LE(end, u.flat_numel);
  EXPECT_EQ(u.param_count, c.decoder_layer_params());
  const UnitLayout& head = m.units.back();
  EXPECT_NE(head.find("lm_head.weight"), nullptr);
  ModelLayout tied = make_model_layout(model_preset("llama-3.2-1b"));
  EXPECT_TRUE(tied.units.back().reads_tied_embedding);
  EXPECT_EQ(tied.units.back().find("lm_head.weight"), nullptr);
}

}  // namespace
}  // namespace slidedp
