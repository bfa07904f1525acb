// Which parameters take AdamW's weight decay. By default every tensor does (torch.optim.AdamW over
// model.parameters()); the common alternative (Hugging Face Trainer, nanoGPT, Megatron) exempts norms,
// biases and sometimes the embeddings. Exempt tensors are element ranges of the units' flat buffers,
// so the updater splits a chunk's update at tensor boundaries and runs each part with its own decay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "card/unit_layout.h"

namespace slidedp::exec {

struct NoDecayGroups {
  bool norms = false;       // every "*norm.weight": input/post-attention layernorms, q/k norms, final norm
  bool biases = false;      // every "*.bias" (Qwen2's q/k/v biases)
  bool embeddings = false;  // "model.embed_tokens.weight" (with tied embeddings also the output projection)
  bool any() const { return norms || biases || embeddings; }
  bool operator==(const NoDecayGroups&) const = default;
};

// Parses "norms,biases,embeddings" (any subset, comma-separated; "" or "none": no group). Throws
// InputError naming `origin` and the unknown word.
NoDecayGroups parse_no_decay_groups(const std::string& text, const std::string& origin);
std::string no_decay_groups_text(const NoDecayGroups& groups);  // "norms,biases" | "none"

// True when the tensor with this Hugging Face name is in one of the groups.
bool takes_no_decay(const std::string& hf_name, const NoDecayGroups& groups);

struct ElementRange {
  int64_t begin = 0, end = 0;  // [begin, end) of a unit's flat buffer
  bool operator==(const ElementRange&) const = default;
};

// Per unit of `layout`, the sorted, disjoint ranges of tensors that take no decay.
std::vector<std::vector<ElementRange>> no_decay_ranges(const ModelLayout& layout, const NoDecayGroups& groups);

// Calls fn(begin, end, decays) for consecutive pieces of [begin, end) of a unit, cut where
// `no_decay` (that unit's ranges) starts or ends a range; `decays` is false inside a range.
template <class Fn>
void for_each_decay_piece(const std::vector<ElementRange>& no_decay, int64_t begin, int64_t end, Fn&& fn) {
  int64_t at = begin;
  for (const ElementRange& r : no_decay) {
    if (r.end <= at) continue;
    if (r.begin >= end) break;
    if (r.begin > at) fn(at, r.begin, true);
    const int64_t stop = r.end < end ? r.end : end;
    fn(at > r.begin ? at : r.begin, stop, false);
    at = stop;
  }
  if (at < end) fn(at, end, true);
}

}  // namespace slidedp::exec
