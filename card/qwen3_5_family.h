// The card's part of the Qwen3.5/3.6 family (family.h): each decoder layer's shape, its parameter count,
// the family's validation and its YAML keys. Every family declares this same overload set.
#pragma once

#include <cstdint>
#include <vector>

#include "card/model_card.h"

namespace YAML {
class Emitter;
}

namespace slidedp {

class YamlReader;

// Fills in what is the family's own in layer l's shape; `s` arrives with the card's common numbers.
void shape_layer(const Qwen35Family&, const ModelCard& c, int64_t layer, LayerShape& s);
// Weights, biases and norm vectors of one decoder layer of shape `s`.
int64_t decoder_layer_params(const Qwen35Family&, const ModelCard& c, const LayerShape& s);
// The family's checks, after the card's common ones.
void validate_family(const Qwen35Family&, const ModelCard& c, const CardCheck& need);
// The family's own keys of our YAML card format (strict: what is read is consumed).
void read_family_yaml(const Qwen35Family&, const YamlReader& r, ModelCard& c);
void write_family_yaml(const Qwen35Family&, YAML::Emitter& e, const ModelCard& c);

// Qwen3.5's default layer_types: full attention every full_attention_interval-th layer (3, 7, 11, ...
// for 4), linear otherwise.
std::vector<AttentionKind> qwen3_5_default_layer_types(int64_t num_layers,
                                                       int64_t full_attention_interval = 4);

}  // namespace slidedp
