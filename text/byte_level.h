// The byte-level alphabet of GPT-2-style BPE (Qwen, Llama 3): every byte 0-255 is written as one
// printable Unicode character, so that vocabulary entries are text. Printable Latin-1 bytes stand for
// themselves; the other 68 bytes take U+0100.. in byte order (0x20, the space, becomes U+0120 'Ġ').
// The tokenizer works on raw bytes internally and uses this only to read and write vocabulary strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace slidedp::text {

// The code point that stands for `byte` in the byte-level alphabet.
char32_t byte_level_char(uint8_t byte);

// The raw bytes a byte-level string stands for, or nullopt when it holds a character outside the
// alphabet (added tokens such as "<|im_end|>" are plain text and do not need it).
std::optional<std::string> byte_level_decode(std::string_view utf8);

// The byte-level string for raw bytes (the inverse of byte_level_decode).
std::string byte_level_encode(std::string_view bytes);

}  // namespace slidedp::text
