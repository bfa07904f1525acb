#include "text/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "text/utf8.h"

namespace slidedp::text {

BpeModel::BpeModel(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& origin)
    : options_(options), vocab_(std::move(vocab)) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  bytes_of_id_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) bytes_of_id_[id] = token;

  std::fill(std::begin(id_of_byte_), std::end(id_of_byte_), -1);
  std::fill(std::begin(fallback_id_of_byte_), std::end(fallback_id_of_byte_), -1);
  fallback_byte_of_id_.assign(bytes_of_id_.size(), -1);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (auto id = id_of(std::string_view(&c, 1))) id_of_byte_[b] = *id;
    if (auto id = id_of(fmt::format("<0x{:02X}>", b))) {
      fallback_id_of_byte_[b] = *id;
      fallback_byte_of_id_[*id] = static_cast<int16_t>(b);
    }
  }
  if (options_.byte_level) {
    for (int b = 0; b < 256; ++b)
      if (id_of_byte_[b] < 0)
        throw InputError(origin, fmt::format("model.vocab: the byte-level vocabulary has no token for byte 0x{:02X}", b));
  }

  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto a = id_of(left), b = id_of(right), merged = id_of(left + right);
    if (!a || !b || !merged)
      throw InputError(origin, fmt::format("model.merges[{}]: '{}' + '{}' has a part or a result outside the vocabulary",
                                           rank, left, right));
    // A pair listed twice keeps its first (lowest) rank, as `tokenizers` does.
    merges_.try_emplace(pair_key(*a, *b), Merge{static_cast<uint32_t>(rank), *merged});
  }
}

std::optional<int32_t> BpeModel::id_of(std::string_view token_bytes) const {
  auto it = vocab_.find(token_bytes);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::token_bytes(int32_t id) const {
  static const std::string kNone;
  if (id < 0 || static_cast<size_t>(id) >= bytes_of_id_.size()) return kNone;
  return bytes_of_id_[id];
}

int BpeModel::byte_of_fallback_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= fallback_byte_of_id_.size()) return -1;
  return fallback_byte_of_id_[id];
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  auto push = [&](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, true});
    if (index > 0) symbols[index - 1].next = index;
  };
  if (options_.byte_level) {
    for (unsigned char b : word) push(id_of_byte_[b]);
    return;
  }
  bool previous_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += utf8_length(static_cast<uint8_t>(word[i]));
    const std::string_view ch = word.substr(start, i - start);
    if (auto id = id_of(ch)) {
      push(*id);
      previous_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && fallback_id_of_byte_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) push(fallback_id_of_byte_[b]);
        previous_unk = false;
        continue;
      }
    }
    if (!options_.unk_id)
      throw InputError("", fmt::format("the character '{}' has no token, no byte fallback and the model no unk token", ch));
    if (!(options_.fuse_unk && previous_unk)) push(*options_.unk_id);
    previous_unk = true;
  }
}

// The merge loop of `tokenizers` (Word::merge_all): a heap of candidate merges ordered by rank, then
// position; a candidate is stale once its left symbol is gone or its pair no longer makes the same
// token.
void BpeModel::merge_all(std::vector<Symbol>& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto after = [](const Candidate& x, const Candidate& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::vector<Candidate> heap;
  auto offer = [&](int32_t pos) {
    const Symbol& left = symbols[pos];
    if (left.next < 0) return;
    auto it = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), after);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) offer(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.live || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.live = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = id_of(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  initial_symbols(word, symbols);
  merge_all(symbols);
  for (const Symbol& s : symbols)
    if (s.live) ids.push_back(s.id);
}

}  // namespace slidedp::text
