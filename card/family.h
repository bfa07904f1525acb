// A model family is a type. Each family is a tag holding the facts that follow from its model_type
// (which Hugging Face model types it reads, where its tensors live, whether its layers differ, what
// its units support); ModelFamily is the closed set of them. Behaviour that differs by family is an
// overload on the tag (card/*_family.h for the card's part, the layout's, config.json's, the model's
// and the kernels' own per-family overloads), reached by one std::visit: a family that lacks an
// overload does not compile. docs/ARCHITECTURE.md lists what a new family touches.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace slidedp {

// Llama, Qwen2/2.5, Qwen3, Mistral: every decoder layer alike (pre-norm attention and SwiGLU MLP).
struct LlamaFamily {
  static constexpr std::string_view kName = "Llama-style";
  static constexpr std::array<std::string_view, 4> kModelTypes = {"llama", "qwen2", "qwen3", "mistral"};
  static constexpr std::string_view kTensorPrefix = "model.";
  static constexpr bool kTextConfigNested = false;  // config.json is the text model's
  static constexpr bool kLayersDiffer = false;
  static constexpr bool kMlpTokenTiles = true;     // the unit can run its MLP over token tiles
  static constexpr bool kZeroCentredNorm = false;  // RMSNorm scales by w, not (1 + w)
  static constexpr bool kTiedByDefault = false;    // tie_word_embeddings when a card omits it
  static constexpr bool kEmbeddingTimesSqrtC = false;
  // Checkpoint tensors outside the text model (towers, extra heads): not trained, not read.
  static constexpr std::array<std::string_view, 0> kIgnoredTensorPrefixes = {};
};

// Gemma 4's text model (Gemma4ForConditionalGeneration): sliding and full layers, sandwich norms,
// GeGLU, optional experts beside the dense MLP, the embedding scaled by sqrt(C), a tied head.
struct Gemma4Family {
  static constexpr std::string_view kName = "Gemma 4";
  static constexpr std::array<std::string_view, 1> kModelTypes = {"gemma4"};
  static constexpr std::string_view kTensorPrefix = "model.language_model.";
  static constexpr bool kTextConfigNested = true;  // under text_config; `<type>_text` names a bare one
  static constexpr bool kLayersDiffer = true;
  static constexpr bool kMlpTokenTiles = false;
  static constexpr bool kZeroCentredNorm = false;
  static constexpr bool kTiedByDefault = true;  // tie_word_embeddings when a card omits it
  static constexpr bool kEmbeddingTimesSqrtC = true;
  static constexpr std::array<std::string_view, 4> kIgnoredTensorPrefixes = {
      "model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."};
};

// Qwen3.5 and Qwen3.6 (Hugging Face model_type qwen3_5 / qwen3_5_moe for both): Gated DeltaNet and
// gated full-attention layers, zero-centred RMSNorm, an untied head; the MoE variant has no dense MLP.
struct Qwen35Family {
  static constexpr std::string_view kName = "Qwen3.5/3.6";
  static constexpr std::array<std::string_view, 2> kModelTypes = {"qwen3_5", "qwen3_5_moe"};
  static constexpr std::string_view kTensorPrefix = "model.language_model.";
  static constexpr bool kTextConfigNested = true;  // under text_config; `<type>_text` names a bare one
  static constexpr bool kLayersDiffer = true;
  static constexpr bool kMlpTokenTiles = false;
  static constexpr bool kZeroCentredNorm = true;
  static constexpr bool kTiedByDefault = false;  // tie_word_embeddings when a card omits it
  static constexpr bool kEmbeddingTimesSqrtC = false;
  // The vision tower and the multi-token-prediction head (transformers drops mtp.* on load too).
  static constexpr std::array<std::string_view, 2> kIgnoredTensorPrefixes = {"model.visual.", "mtp."};
};

using ModelFamily = std::variant<LlamaFamily, Gemma4Family, Qwen35Family>;

// The family that reads `model_type` (a card's, as listed in kModelTypes); nullopt: none does.
std::optional<ModelFamily> family_of_model_type(std::string_view model_type);
// Every model_type some family reads, in the variant's order (llama, qwen2, ..., qwen3_5_moe).
std::vector<std::string> supported_model_types();

}  // namespace slidedp
