#include "text/added_tokens.h"

#include "text/utf8.h"

namespace slidedp::text {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  token_at_node_.push_back(-1);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    int32_t node = 0;
    for (unsigned char b : content) {
      const uint64_t edge = (static_cast<uint64_t>(node) << 8) | b;
      auto it = edges_.find(edge);
      if (it == edges_.end()) {
        it = edges_.emplace(edge, static_cast<int32_t>(token_at_node_.size())).first;
        token_at_node_.push_back(-1);
      }
      node = it->second;
    }
    // The same content listed twice: the first entry wins, as in a vocabulary lookup.
    if (token_at_node_[node] < 0) token_at_node_[node] = static_cast<int32_t>(t);
  }
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t at) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (token_at_node_[node] >= 0) best = token_at_node_[node];
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextPiece>& pieces) const {
  size_t piece_start = 0;  // start of the text not yet emitted
  size_t i = 0;
  while (i < text.size()) {
    const int t = first_byte_[static_cast<uint8_t>(text[i])] ? longest_at(text, i) : -1;
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[t];
    size_t begin = i, end = i + token.content.size();
    if (token.lstrip) {
      // Absorb the whitespace before the match, but not past the previous match.
      size_t j = begin;
      while (j > piece_start) {
        size_t k = j - 1;
        while (k > piece_start && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        size_t at = k;
        if (!is_unicode_white_space(next_code_point(text, at))) break;
        j = k;
      }
      begin = j;
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t at = end;
        if (!is_unicode_white_space(next_code_point(text, at))) break;
        end = at;
      }
    }
    if (begin > piece_start) pieces.push_back({text.substr(piece_start, begin - piece_start), -1});
    pieces.push_back({text.substr(begin, end - begin), token.id});
    piece_start = i = end;
  }
  if (piece_start < text.size()) pieces.push_back({text.substr(piece_start), -1});
}

}  // namespace slidedp::text
