// A model family is a type (card/family.h): every model_type has exactly one family, the family's
// facts agree with what its kernels can do, and the per-family FLOPs reduce to SlideFormer's closed
// form where they should.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <variant>

#include "card/family.h"
#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/error.h"
#include "kernels/cpu/transformer/model_step.h"
#include "model/model_costs.h"

namespace slidedp {
namespace {

TEST(ModelFamily, EveryModelTypeHasOneFamilyAndTheOthersNone) {
  const std::vector<std::string> expected = {"llama",  "qwen2",   "qwen3",      "mistral",
                                             "gemma4", "qwen3_5", "qwen3_5_moe"};
  EXPECT_EQ(supported_model_types(), expected);
  EXPECT_TRUE(std::holds_alternative<LlamaFamily>(*family_of_model_type("mistral")));
  EXPECT_TRUE(std::holds_alternative<Gemma4Family>(*family_of_model_type("gemma4")));
  EXPECT_TRUE(std::holds_alternative<Qwen35Family>(*family_of_model_type("qwen3_5_moe")));
  EXPECT_FALSE(family_of_model_type("gemma4_text").has_value());  // config.json's inner name, not a card's
  EXPECT_FALSE(family_of_model_type("").has_value());
  ModelCard c = model_preset("llama-3.2-1b");
  c.model_type = "gpt2";
  try {
    c.validate("card.yaml");
    FAIL() << "an unknown model_type validated";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("card.yaml: model_type"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama, qwen2, qwen3, mistral, gemma4, qwen3_5, qwen3_5_moe"),
              std::string::npos)
        << e.what();
  }
}

// config.json is read by the family its model_type names, through the family's own reader; `T_text`
// (a bare text config) only for the families that nest their text model under text_config.
TEST(ModelFamily, ConfigJsonIsReadByTheFamilyItsModelTypeNames) {
  auto read_error = [](const std::string& json) {
    try {
      model_card_from_hf_config(json, "c.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  const std::string llama = model_card_to_hf_config(model_preset("llama-3.2-1b"));
  EXPECT_EQ(model_card_from_hf_config(llama, "c.json").family().index(), ModelFamily(LlamaFamily{}).index());
  // Refused by the model_type alone (a family reading the rest would name a missing key first).
  for (const std::string& type :
       {std::string("llama_text"), std::string("gpt2"), std::string("gemma4_text_text")}) {
    const std::string what = read_error(R"({"model_type": ")" + type + R"("})");
    EXPECT_NE(what.find("c.json: model_type"), std::string::npos) << type << ": " << what;
    EXPECT_NE(what.find("'" + type +
                        "' is not supported (llama, qwen2, qwen3, mistral, gemma4, qwen3_5, qwen3_5_moe)"),
              std::string::npos)
        << what;
  }
  // A nested family's bare text config reads as the text model, its outer one needs text_config.
  const ModelCard gemma = model_preset("gemma-4-31b");
  const std::string outer = model_card_to_hf_config(gemma);
  EXPECT_EQ(model_card_from_hf_config(outer, "c.json").family().index(), ModelFamily(Gemma4Family{}).index());
  EXPECT_NE(read_error(R"({"model_type": "gemma4"})").find("c.json: text_config"), std::string::npos);
  EXPECT_NE(read_error(R"({"model_type": "qwen3_5_moe"})").find("c.json: text_config"), std::string::npos);
  EXPECT_NE(read_error(R"({"model_type": "gemma4_text"})").find("c.json: config"), std::string::npos)
      << read_error(R"({"model_type": "gemma4_text"})");
}

// The family's kMlpTokenTiles is what the planner and the memory model read; the kernels' specs are
// what runs. A family that claims tiles its units refuse would be planned and then fail to start.
TEST(ModelFamily, MlpTokenTilesAreOfferedExactlyWhereTheUnitsAcceptThem) {
  for (const std::string& name : model_preset_names()) {
    const ModelCard card = model_preset(name);
    kernels::ModelSpecs specs = kernels::make_model_specs(card, make_model_layout(card));
    bool accepted = true;
    try {
      specs.set_mlp_token_tile(64);
    } catch (const InputError&) {
      accepted = false;
    }
    EXPECT_EQ(card.mlp_token_tiles(), accepted) << name;
  }
}

// SlideFormer's model FLOPs per step for a dense Llama-style model (its TFLOP/s metric):
// 12 B S L H^2 ((1 + kv/heads + S/H) q_dim/H + 1.5 I/H + V/(2 L H)). The model sums it layer by
// layer for every family; for these cards the two must agree to rounding (1e-12 relative: a sum of
// about 100 doubles).
TEST(ModelFamily, LayerByLayerFlopsEqualSlideFormersClosedFormForLlamaStyleCards) {
  int checked = 0;
  for (const std::string& name : model_preset_names()) {
    const ModelCard c = model_preset(name);
    if (!c.is_family<LlamaFamily>()) continue;
    const double B = 3, S = 4096, L = static_cast<double>(c.num_layers),
                 H = static_cast<double>(c.hidden_size);
    const double heads = static_cast<double>(c.num_heads), kv = static_cast<double>(c.num_kv_heads);
    const double I = static_cast<double>(c.intermediate_size), V = static_cast<double>(c.vocab_size);
    const double qratio = static_cast<double>(c.q_dim()) / H;
    const double closed =
        12.0 * B * S * L * H * H * ((1.0 + kv / heads + S / H) * qratio + 1.5 * I / H + V / (2.0 * L * H));
    const double got = model_flops_per_step(c, 3, 4096);
    EXPECT_NEAR(got, closed, 1e-12 * closed) << name;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace slidedp
