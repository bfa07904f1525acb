// A compiled pre-tokenizer regex on PCRE2 (UTF + UCP, JIT when available). Patterns are written for
// Oniguruma, the engine of Hugging Face `tokenizers`; the one difference that matters for released
// tokenizers is \s: PCRE2's also matches U+180E (its \h set), so \s and \S are rewritten to Unicode
// White_Space, Oniguruma's meaning.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace slidedp::text {

class Regex {
 public:
  // Throws InputError naming `origin` when the pattern does not compile (with PCRE2's message and offset).
  Regex(const std::string& pattern, const std::string& origin);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Byte ranges [begin, end) of the successive non-overlapping leftmost matches in `text` (valid
  // UTF-8); an empty match is skipped, the search resuming one character later.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The pattern with \s and \S spelled as Unicode White_Space classes (exposed for tests).
std::string with_unicode_white_space(const std::string& pattern, const std::string& origin);

}  // namespace slidedp::text
