// FNV-1a, 64-bit: the digest of texts that only need telling apart (a spec file's version, the
// start-up check's fields across nodes, a checkpoint's state), not protecting. splitmix64: a mixing
// function whose values are the same on every platform (seeded shuffles, synthetic inputs).
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

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace slidedp
