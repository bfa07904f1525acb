// Structure-aware mutations; see mutate.h.
#include "fuzz/mutate.h"

#include <algorithm>
#include <cstring>
#include <regex>
#include <vector>

namespace slidedp::fuzz {
namespace {

// Values that broke or would break a parser that trusts its input: zeros and negatives for rates and
// counts, overflow of double, int64 and size_t, NaN and infinity in YAML's and JSON's spellings,
// denormals, 2^31 and 2^62 for sizes that get multiplied.
const char* const kNumbers[] = {"0", "-1", "-0", "1e400", "-1e400", "1e-320", "1e308", "4611686018427387904",
                                "9223372036854775807", "18446744073709551616", "-9223372036854775809",
                                "2147483648", "4294967296", "nan", ".nan", ".inf", "-.inf", "NaN", "Infinity",
                                "0.5", "3", "65536", "1e15"};
const char* const kValues[] = {"[1, 2]", "{a: 1}", "null", "~", "\"\"", "''", "true", "[]", "{}", "x", "\"x\"",
                               "-", "[[1]]", "\"1e400\""};

struct Span {
  std::size_t begin, end;
};

std::vector<Span> matches(const std::string& s, const std::regex& re) {
  std::vector<Span> out;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({static_cast<std::size_t>(it->position()), static_cast<std::size_t>(it->position() + it->length())});
  return out;
}

std::vector<Span> lines(const std::string& s) {
  std::vector<Span> out;
  std::size_t b = 0;
  while (b < s.size()) {
    std::size_t e = s.find('\n', b);
    e = e == std::string::npos ? s.size() : e + 1;
    out.push_back({b, e});
    b = e;
  }
  return out;
}

template <class T, std::size_t N>
const T& pick(const T (&a)[N], std::mt19937_64& rng) {
  return a[std::uniform_int_distribution<std::size_t>(0, N - 1)(rng)];
}

std::string mutate_once(std::string s, std::mt19937_64& rng) {
  static const std::regex number(R"(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?)");
  // A YAML or JSON value after "key:" up to the end of the line or the next comma / brace.
  static const std::regex value(R"(:\s*([^\s,\{\}\[\]][^,\{\}\[\]\n]*))");
  const auto any = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  switch (any(7)) {
    case 0:
    case 1: {  // a number becomes an extreme
      const std::vector<Span> m = matches(s, number);
      if (m.empty()) break;
      const Span sp = m[any(m.size())];
      return s.replace(sp.begin, sp.end - sp.begin, pick(kNumbers, rng));
    }
    case 2: {  // a scalar becomes a list, a map, null, empty
      std::vector<Span> m;
      for (auto it = std::sregex_iterator(s.begin(), s.end(), value); it != std::sregex_iterator(); ++it)
        m.push_back({static_cast<std::size_t>(it->position(1)), static_cast<std::size_t>(it->position(1) + it->length(1))});
      if (m.empty()) break;
      const Span sp = m[any(m.size())];
      return s.replace(sp.begin, sp.end - sp.begin, pick(kValues, rng));
    }
    case 3: {  // a line twice (a repeated key)
      const std::vector<Span> l = lines(s);
      if (l.empty()) break;
      const Span sp = l[any(l.size())];
      return s.insert(sp.end, s.substr(sp.begin, sp.end - sp.begin));
    }
    case 4: {  // a line dropped (a missing key)
      const std::vector<Span> l = lines(s);
      if (l.empty()) break;
      const Span sp = l[any(l.size())];
      return s.erase(sp.begin, sp.end - sp.begin);
    }
    case 5:  // cut short (a truncated file)
      if (!s.empty()) s.resize(any(s.size()));
      return s;
    default: {  // a leading little-endian length field (safetensors, npy) replaced
      if (s.size() < 8) break;
      static const uint64_t lengths[] = {0, 1, 7, 0xFFFFFFFFull, 0xFFFFFFFFFFFFFFFFull, 100'000'001, 1ull << 62};
      const uint64_t v = pick(lengths, rng);
      const std::size_t at = any(std::min<std::size_t>(s.size() - 7, 16));
      std::memcpy(s.data() + at, &v, 8);
      return s;
    }
  }
  // Nothing of that kind in the input: flip a byte.
  if (!s.empty()) s[any(s.size())] ^= static_cast<char>(1u << any(8));
  return s;
}

}  // namespace

std::string mutate(const std::string& input, std::mt19937_64& rng) {
  std::string s = input;
  const int n = std::uniform_int_distribution<int>(1, 3)(rng);
  for (int i = 0; i < n; ++i) s = mutate_once(std::move(s), rng);
  return s;
}

}  // namespace slidedp::fuzz
