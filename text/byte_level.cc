#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace slidedp::text {
namespace {

bool stands_for_itself(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct Alphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<int16_t, 324> byte_of_char{};  // code points < 324 only; -1 = not in the alphabet
  Alphabet() {
    byte_of_char.fill(-1);
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      char_of_byte[b] = stands_for_itself(b) ? static_cast<char32_t>(b) : next_extra++;
      byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) { return alphabet().char_of_byte[byte]; }

std::optional<std::string> byte_level_decode(std::string_view utf8) {
  std::string bytes;
  bytes.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const char32_t c = next_code_point(utf8, i);
    if (c >= alphabet().byte_of_char.size() || alphabet().byte_of_char[c] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(alphabet().byte_of_char[c]));
  }
  return bytes;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_level_char(b));
  return out;
}

}  // namespace slidedp::text
