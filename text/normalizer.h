// The normalizers of tokenizer.json that the released tokenizers of our families use: Unicode
// normal forms (Qwen: NFC), Replace (Gemma: ' ' -> U+2581), Prepend, and Sequence of these. Anything
// else is refused when the file is read, naming the type.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace slidedp::text {

class Normalizer {
 public:
  // Reads a "normalizer" value (null = identity); `origin` is "tokenizer.json: normalizer".
  static Normalizer from_json(const nlohmann::json& j, const std::string& origin);
  bool identity() const { return steps_.empty(); }
  // `text` is valid UTF-8.
  std::string apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kReplaceString, kReplaceRegex, kPrepend } kind;
    std::string pattern;  // kReplaceString: the literal; kPrepend: the prefix
    std::string content;  // kReplace*: the replacement
    std::shared_ptr<Regex> regex;
  };
  static void read_step(const nlohmann::json& j, const std::string& origin, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

// Replaces every occurrence of `from` (non-empty) in `text` by `to`.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

}  // namespace slidedp::text
