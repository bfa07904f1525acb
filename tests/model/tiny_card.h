// The model tests' tiny card, whose byte and FLOP counts the tests compute by hand: hidden 64,
// 2 layers, 4 heads of 16, 2 kv heads, intermediate 128, vocab 256, untied (unit 0, the embedding,
// has 256 x 64 = 16384 elements).
#pragma once

#include "card/model_card.h"

namespace slidedp {

inline ModelCard tiny_card() {
  return model_card_from_yaml(
      "name: tiny\nmodel_type: llama\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 16\nintermediate_size: 128\nvocab_size: 256\n",
      "tiny");
}

}  // namespace slidedp
