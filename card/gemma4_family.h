// The card's part of the Gemma 4 family (family.h): each decoder layer's shape, its parameter count,
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
void shape_layer(const Gemma4Family&, const ModelCard& c, int64_t layer, LayerShape& s);
// Weights, biases and norm vectors of one decoder layer of shape `s`.
int64_t decoder_layer_params(const Gemma4Family&, const ModelCard& c, const LayerShape& s);
// The family's checks, after the card's common ones.
void validate_family(const Gemma4Family&, const ModelCard& c, const CardCheck& need);
// The family's own keys of our YAML card format (strict: what is read is consumed).
void read_family_yaml(const Gemma4Family&, const YamlReader& r, ModelCard& c);
void write_family_yaml(const Gemma4Family&, YAML::Emitter& e, const ModelCard& c);

// Gemma4TextConfig's default layer_types: (five sliding, one full) repeated, the last layer full.
std::vector<AttentionKind> gemma4_default_layer_types(int64_t num_layers);

}  // namespace slidedp
