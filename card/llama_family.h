// The card's part of the Llama-style family (Llama, Qwen2/2.5, Qwen3, Mistral) (family.h): each decoder
// layer's shape, its parameter count, the family's validation and its YAML keys. Every family declares this
// same overload set.
#pragma once

#include <cstdint>

#include "card/model_card.h"

namespace YAML {
class Emitter;
}

namespace slidedp {

class YamlReader;

// Fills in what is the family's own in layer l's shape; `s` arrives with the card's common numbers.
void shape_layer(const LlamaFamily&, const ModelCard& c, int64_t layer, LayerShape& s);
// Weights, biases and norm vectors of one decoder layer of shape `s`.
int64_t decoder_layer_params(const LlamaFamily&, const ModelCard& c, const LayerShape& s);
// The family's checks, after the card's common ones.
void validate_family(const LlamaFamily&, const ModelCard& c, const CardCheck& need);
// The family's own keys of our YAML card format (strict: what is read is consumed).
void read_family_yaml(const LlamaFamily&, const YamlReader& r, ModelCard& c);
void write_family_yaml(const LlamaFamily&, YAML::Emitter& e, const ModelCard& c);

}  // namespace slidedp
