// UTF-8 helpers the tokenizer needs: validation naming the first bad byte, code point iteration and
// encoding. The text pipeline refuses invalid UTF-8 up front, so the rest may assume it is valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slidedp::text {

// Offset of the first byte that does not start a valid UTF-8 sequence (overlong forms, surrogates and
// code points past U+10FFFF are invalid), or npos when `s` is valid.
size_t first_invalid_utf8(std::string_view s);

// Length in bytes of the UTF-8 sequence that starts with `lead` (valid text assumed).
inline size_t utf8_length(uint8_t lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// Decodes the code point at s[i] (valid text assumed) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);

void append_utf8(std::string& out, char32_t c);

// Unicode White_Space (what Oniguruma's \s matches; JavaScript's differs on U+0085 and U+FEFF,
// PCRE2's on U+180E).
bool is_unicode_white_space(char32_t c);

}  // namespace slidedp::text
