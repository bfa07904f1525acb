// The BPE model of tokenizer.json ("model": {"type": "BPE"}): a vocabulary, merges in rank order, and
// the merge loop of Hugging Face `tokenizers` (lowest rank first, leftmost among equal ranks, a
// merge applied only while its pair is still intact). Words arrive as raw bytes: for a byte-level
// vocabulary each byte is one initial symbol; otherwise each UTF-8 character is, with unknown
// characters spelled as <0xNN> byte tokens when `byte_fallback` is set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace slidedp::text {

struct BpeOptions {
  bool byte_level = false;     // vocabulary strings are in the byte-level alphabet (text/byte_level.h)
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;  // consecutive unknown characters give one unk token
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `vocab` maps tokens (raw bytes) to ids; `merges` are pairs of tokens (raw bytes) in rank order.
  // Throws InputError naming `origin` for a merge whose parts or result are not in the vocabulary.
  BpeModel(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& origin);

  // Appends the ids of one pre-tokenized word (raw bytes, valid UTF-8 unless byte-level). Throws
  // InputError when a character has no token, no byte fallback and no unk token.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> id_of(std::string_view token_bytes) const;
  // The raw bytes of a token ("" for ids the model does not know; added tokens live elsewhere).
  const std::string& token_bytes(int32_t id) const;
  // The byte a <0xNN> token stands for, or -1.
  int byte_of_fallback_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(bytes_of_id_.size()) - 1; }
  const BpeOptions& options() const { return options_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
    bool live;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  void merge_all(std::vector<Symbol>& symbols) const;

  BpeOptions options_;
  VocabMap vocab_;
  std::vector<std::string> bytes_of_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t id_of_byte_[256];           // byte-level: the token of each single byte
  int32_t fallback_id_of_byte_[256];  // byte fallback: the <0xNN> token of each byte, -1 if absent
  std::vector<int16_t> fallback_byte_of_id_;
};

}  // namespace slidedp::text
