// Added tokens (tokenizer.json "added_tokens"): matched in the text before the model runs, as
// `tokenizers`' AddedVocabulary does: leftmost-longest over all contents, `lstrip`/`rstrip` widen a
// match over neighbouring whitespace. Tokens with `normalized: false` are matched in the raw text,
// the others in each remaining piece after normalization.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace slidedp::text {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One piece of text after matching: either an added token (id >= 0) or text for the model.
struct TextPiece {
  std::string_view text;
  int32_t added_id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `contents` are what to match (already normalized for the normalized set).
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into added tokens and the text between them (empty text pieces omitted).
  void split(std::string_view text, std::vector<TextPiece>& pieces) const;

 private:
  // The longest token that starts at `at`, as an index into tokens_, or -1.
  int longest_at(std::string_view text, size_t at) const;
  std::vector<AddedToken> tokens_;
  // A byte trie: edge (node << 8 | byte) -> child node; node 0 is the root.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> token_at_node_;  // index into tokens_ ending at the node, -1 if none
  bool first_byte_[256] = {};
};

}  // namespace slidedp::text
