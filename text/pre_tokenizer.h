// The pre-tokenizers of tokenizer.json that the released tokenizers of our families use: Split (a
// regex or a literal, the five delimiter behaviours of `tokenizers`), ByteLevel (the byte-level
// alphabet, optionally a prefix space and GPT-2's split regex) and Sequence of these. A piece is
// raw UTF-8 here: the byte-level alphabet is applied by the BPE model's vocabulary, not to the text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace slidedp::text {

class PreTokenizer {
 public:
  // Reads a "pre_tokenizer" value (null = the whole piece is one word).
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& origin);
  // Splits one normalized piece into words, appended to `words`.
  void split(std::string_view piece, std::vector<std::string>& words) const;
  bool byte_level() const { return byte_level_; }

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    enum class Kind { kSplitRegex, kSplitString, kByteLevel } kind;
    std::shared_ptr<Regex> regex;  // kSplitRegex, and kByteLevel with use_regex
    std::string literal;           // kSplitString
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
  };
  static void read_step(const nlohmann::json& j, const std::string& origin, PreTokenizer& into);
  static void apply(const Step& step, std::string_view piece, std::vector<std::string>& out);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace slidedp::text
