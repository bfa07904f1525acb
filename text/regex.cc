#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <fmt/format.h>
#include <pcre2.h>

#include "common/error.h"
#include "text/utf8.h"

namespace slidedp::text {
namespace {

// Unicode White_Space, as the inside of a character class.
constexpr const char* kWhiteSpace = R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string with_unicode_white_space(const std::string& pattern, const std::string& origin) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : fmt::format("[{}]", kWhiteSpace);
      } else if (e == 'S') {
        if (in_class)
          throw InputError(origin, "\\S inside a character class is not supported by this tokenizer (PCRE2 cannot "
                                   "subtract classes); please report the tokenizer");
        out += fmt::format("[^{}]", kWhiteSpace);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // a ']' right after '[' or '[^' is a literal
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& origin) : impl_(std::make_unique<Impl>()) {
  const std::string translated = with_unicode_white_space(pattern, origin);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl_->code)
    throw InputError(origin, fmt::format("the regex '{}' does not compile: {} (at offset {})", pattern,
                                         pcre2_message(error), offset));
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  // Match data per call keeps a shared Regex usable from several threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  size_t at = 0;
  while (at <= text.size()) {
    const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                               PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw RuntimeError(fmt::format("regex match failed: {}", pcre2_message(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      at = end;
    } else {
      if (begin >= text.size()) return;
      at = begin + utf8_length(static_cast<uint8_t>(text[begin]));
    }
  }
}

}  // namespace slidedp::text
