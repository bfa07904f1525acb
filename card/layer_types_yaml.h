// The layer_types key of our YAML card, as the families with layers of several kinds read and write
// it (Gemma 4: sliding / full; Qwen3.5/3.6: linear / full). Included by their card files only.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "common/yaml_reader.h"

namespace slidedp {

// The kinds the card lists, each one of `allowed` (InputError naming the key otherwise), or `fallback`
// when the key is absent.
inline std::vector<AttentionKind> read_layer_types_yaml(const YamlReader& r,
                                                        std::initializer_list<AttentionKind> allowed,
                                                        std::vector<AttentionKind> fallback) {
  if (!r.has("layer_types")) return fallback;
  std::vector<AttentionKind> kinds;
  for (const std::string& t : r.text_list("layer_types"))
    kinds.push_back(attention_kind_from_name(t, allowed, r.where("layer_types")));
  return kinds;
}

inline void write_layer_types_yaml(YAML::Emitter& e, const std::vector<AttentionKind>& kinds) {
  e << YAML::Key << "layer_types" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (AttentionKind k : kinds) e << attention_kind_name(k);
  e << YAML::EndSeq;
}

}  // namespace slidedp
