// The generated corpus the tokenizer agreement test encodes: at least 1 MB of documents mixing
// English with contractions, code, numbers, eleven scripts (CJK, Hangul, Arabic, Devanagari, Thai,
// ...), emoji with modifiers and joiners, runs of spaces, tabs, newlines and CRLF, non-NFC sequences,
// and the family's own added tokens (and near misses) inside the text. Seeded: the same bytes every
// run. U+0085, U+FEFF and 'ſ' are left out of it: the JavaScript port differs from Hugging Face on
// exactly those (JavaScript's \s, its case folding); edge_documents() holds them, for Hugging Face's
// own library only.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace slidedp::testing {

inline std::vector<std::string> reference_corpus(const std::vector<std::string>& added_tokens, size_t min_bytes,
                                                 uint32_t seed) {
  static const std::vector<std::string> kWords = {
      "the", "model", "streams", "layers", "from", "host", "memory", "while", "gradients", "flow", "back",
      "It's", "they're", "WE'LL", "you've", "I'm", "she'd", "don't", "Can't", "O'Neil's", "naïve", "café",
      "Straße", "résumé", "fine-tuning", "GPU", "PCIe", "AdamW", "bf16", "x86_64", "e.g.", "U.S.A.", "ŁÓDŹ"};
  static const std::vector<std::string> kScripts = {
      "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可", "これはテストですカタカナとひらがな",
      "한국어 텍스트입니다", "مرحبا بالعالم، هذا اختبار", "नमस्ते दुनिया यह परीक्षण है", "Привет, мир! Это тест.",
      "Γειά σου Κόσμε", "สวัสดีชาวโลก", "שלום עולם", "Xin chào thế giới", "ሰላም ለዓለም", "გამარჯობა", "Türkçe ğüşıöç"};
  static const std::vector<std::string> kEmoji = {"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "🤖", "✅", "🔥🔥", "🏳️‍🌈", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"};
  static const std::vector<std::string> kCode = {
      "def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
      "{\"key\": [1, 2.5e-3, null], \"nested\": {\"a\": true}}", "<div class=\"x\">&nbsp;</div>",
      "https://example.org/path?q=1&r=%20", "/usr/local/cuda/lib64/libnccl.so.2", "SELECT * FROM t WHERE id=42;",
      "    indented\n        more\n", "a_b-c.d/e\\f", "x+=1;y-=2;z*=3", "if __name__ == '__main__':\n    main()\n"};
  static const std::vector<std::string> kSpace = {" ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n",
                                                  "   \n  ", "\u3000", "\u00a0", "\u2003", "\t\t", "\n \n"};
  static const std::vector<std::string> kOdd = {"e\u0301", "n\u0303o", "A\u030A", "\u1100\u1161", "\u212B",
                                                "!!!", "...", "?!", "--", "***", "'''", "'s", "'S", "''",
                                                "ﬁ", "１２３", "½", "\u200d", "\u00ad"};
  std::mt19937 rng(seed);
  auto pick = [&](const std::vector<std::string>& pool) -> const std::string& { return pool[rng() % pool.size()]; };
  auto number = [&] {
    std::string n = std::to_string(rng() % 1000000007u);
    switch (rng() % 4) {
      case 0: return n.substr(0, 1 + rng() % n.size());
      case 1: return n + "." + std::to_string(rng() % 1000);
      case 2: return std::string("1,234,567");
      default: return std::string("2026-12-04");
    }
  };
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < min_bytes) {
    std::string doc;
    const int fragments = 5 + static_cast<int>(rng() % 76);
    for (int f = 0; f < fragments; ++f) {
      switch (rng() % 10) {
        case 0: case 1: case 2: doc += pick(kWords); break;
        case 3: doc += pick(kScripts); break;
        case 4: doc += pick(kEmoji); break;
        case 5: doc += pick(kCode); break;
        case 6: doc += number(); break;
        case 7: doc += pick(kOdd); break;
        case 8:
          if (!added_tokens.empty()) {
            const std::string& t = pick(added_tokens);
            if (rng() % 4 == 0) {  // a near miss now and then: all but the last character
              size_t cut = t.size() - 1;
              while (cut > 0 && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
              doc += t.substr(0, cut);
            } else {
              doc += t;
            }
          }
          break;
        default: doc += pick(kSpace); break;
      }
      if (rng() % 3 != 0) doc += rng() % 5 == 0 ? pick(kSpace) : " ";
    }
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

// Documents built around the characters on which regex engines differ: U+0085 (White_Space, not in
// JavaScript's \s), U+FEFF (in JavaScript's \s, not White_Space), U+180E (in PCRE2's \s, not
// White_Space since Unicode 6.3), U+017F 'ſ' (folds to 's' in the
// case-insensitive contraction alternatives), next to spaces, newlines and letters.
inline std::vector<std::string> edge_documents(size_t count, uint32_t seed) {
  static const std::vector<std::string> kPieces = {"\u0085", "\ufeff", "\u180e", "'\u017f", "'\u017fT", " ", "  ", "\n", "word",
                                                   "IT", "it", "'S", "x", "\u00a0", "12"};
  std::mt19937 rng(seed);
  std::vector<std::string> docs;
  for (size_t i = 0; i < count; ++i) {
    std::string doc;
    for (int k = 0, n = 3 + static_cast<int>(rng() % 20); k < n; ++k) doc += kPieces[rng() % kPieces.size()];
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace slidedp::testing
