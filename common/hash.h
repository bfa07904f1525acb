// FNV-1a, 64-bit: the digest of texts that only need telling apart (a spec file's version, the
// start-up check's fields across nodes, a checkpoint's state), not protecting.
#pragma once

#include <cstdint>
#include <string_view>

namespace slidedp {

inline uint64_t fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace slidedp
