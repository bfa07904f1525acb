// A model's own tokenizer, read from its tokenizer.json (and tokenizer_config.json beside it), encoding
// as Hugging Face `tokenizers` does for byte-level BPE (Qwen, Llama 3) and BPE with byte fallback
// (Gemma): added tokens first, then normalizer -> pre-tokenizer -> BPE per word, then the
// post-processor's special tokens when asked. Anything in the file this does not implement is
// refused when it is read, naming the field; it never encodes differently without saying so.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"

namespace slidedp::text {

// What tokenizer_config.json says beyond tokenizer.json (all optional).
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token;
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<std::string> chat_template;  // the default template (tokenizer_config or chat_template.jinja)
  std::string chat_template_origin;          // the file it came from
};

// Words already encoded, shared across calls by one thread (bounded, as `tokenizers`' cache).
using WordCache = std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;

class Tokenizer {
 public:
  // `path` is a model folder (tokenizer.json, optional tokenizer_config.json and chat_template.jinja)
  // or a tokenizer.json file. Throws IoError for a missing file, InputError naming the file and field.
  static Tokenizer load(const std::filesystem::path& path);

  // Encodes valid UTF-8 `text` (InputError naming the byte offset otherwise). With
  // `add_special_tokens` the post-processor's tokens (e.g. BOS) are added, as `tokenizer(text)` does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens, WordCache* cache = nullptr) const;
  // The text of `ids` as the tokenizer.json decoder gives it (invalid UTF-8 from byte tokens becomes
  // U+FFFD). Ids past the vocabulary are an InputError.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id the tokenizer can produce.
  int64_t vocab_size() const { return vocab_size_; }
  // The id of a token given as its text (an added token's content or a vocabulary entry).
  std::optional<int32_t> token_id(std::string_view content) const;
  // The bytes token `id` stands for in the text, decoded alone (the decoder's per-token steps: byte
  // level, Replace, byte fallback to its one byte; not Fuse or Strip). Where the tokenizer is lossless
  // the surfaces of encode(text) concatenate to the text: what lets a character range (an assistant's
  // turn) be mapped to the tokens it covers.
  std::string token_surface(int32_t id) const;
  // The added tokens marked special (end-of-turn markers and the like), by content.
  std::vector<std::string> special_token_contents() const;
  bool is_special(int32_t id) const;
  const TokenizerConfig& config() const { return config_; }
  const std::string& origin() const { return origin_; }

 private:
  enum class DecoderStep { kReplace, kByteFallback, kFuse, kStrip };
  struct Decoder {
    bool byte_level = false;
    struct Step {
      DecoderStep kind;
      std::string from, to;      // kReplace
      char32_t strip_char = 0;   // kStrip
      size_t strip_start = 0, strip_stop = 0;
    };
    std::vector<Step> steps;
  };
  void read_added_tokens(const nlohmann::json& j);
  void read_post_processor(const nlohmann::json& j);
  void read_decoder(const nlohmann::json& j, const std::string& where);
  void encode_text(std::string_view piece, std::vector<int32_t>& ids, WordCache* cache) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids, WordCache* cache) const;
  std::string token_text(int32_t id) const;

  std::string origin_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::optional<BpeModel> model_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_index_of_id_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // the post-processor's tokens around a single sequence
  Decoder decoder_;
  TokenizerConfig config_;
  int64_t vocab_size_ = 0;
};

}  // namespace slidedp::text
