// Weight-decay groups; see weight_decay_groups.h.
#include "executor/weight_decay_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "common/error.h"

namespace slidedp::exec {

NoDecayGroups parse_no_decay_groups(const std::string& text, const std::string& origin) {
  NoDecayGroups g;
  if (text.empty() || text == "none") return g;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) {
    if (word == "norms") g.norms = true;
    else if (word == "biases") g.biases = true;
    else if (word == "embeddings") g.embeddings = true;
    else
      throw InputError(origin, fmt::format("'{}' is not a parameter group (norms, biases, embeddings, or none)", word));
  }
  return g;
}

std::string no_decay_groups_text(const NoDecayGroups& g) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : ",") + std::string(name);
  };
  add(g.norms, "norms");
  add(g.biases, "biases");
  add(g.embeddings, "embeddings");
  return s.empty() ? "none" : s;
}

bool takes_no_decay(const std::string& name, const NoDecayGroups& g) {
  // Gemma 4's layer_scalar is a buffer transformers never trains: its gradient is zero, and without
  // decay AdamW leaves it exactly as loaded.
  if (is_frozen_buffer(name)) return true;
  if (g.norms && is_norm_weight(name)) return true;
  if (g.biases && name.ends_with(".bias")) return true;
  if (g.embeddings && name.ends_with("embed_tokens.weight")) return true;
  return false;
}

std::vector<std::vector<ElementRange>> no_decay_ranges(const ModelLayout& layout, const NoDecayGroups& groups) {
  std::vector<std::vector<ElementRange>> out(static_cast<size_t>(layout.num_units()));
  for (const UnitLayout& u : layout.units) {
    auto& ranges = out[static_cast<size_t>(u.index)];
    for (const TensorSpec& t : u.tensors)
      if (takes_no_decay(t.name, groups)) ranges.push_back({t.offset, t.offset + t.numel});
    std::sort(ranges.begin(), ranges.end(), [](const ElementRange& a, const ElementRange& b) { return a.begin < b.begin; });
  }
  return out;
}

}  // namespace slidedp::exec
