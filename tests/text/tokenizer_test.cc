// Unit tests of the tokenizer's parts against independent references written here: the GPT-2
// byte-level alphabet, a naive BPE merge loop, a naive leftmost-longest matcher, hand-checked regex
// splits; and every refused tokenizer.json construct. The agreement with a released implementation on
// real tokenizers is tokenizer_agreement_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <random>

#include "common/error.h"
#include "tests/text/text_test_util.h"
#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/byte_level.h"
#include "text/pre_tokenizer.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace slidedp::text {
namespace {

using slidedp::testing::byte_level_tokenizer_json;
using slidedp::testing::fresh_dir;
using slidedp::testing::write_json;

constexpr const char* kQwenSplit =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(ByteLevel, AlphabetIsGpt2s) {
  EXPECT_EQ(byte_level_char(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(byte_level_char('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(byte_level_char('A'), U'A');
  EXPECT_EQ(byte_level_char(0xAD), U'\u0143');  // the soft hyphen is not printable: 0x100 + its rank (67)
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string encoded = byte_level_encode(all);
  EXPECT_EQ(byte_level_decode(encoded), all);
  EXPECT_EQ(byte_level_decode("a b"), std::nullopt);  // a plain space is outside the alphabet
}

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(first_invalid_utf8("abc"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("\xE6\x97\xA5\xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(first_invalid_utf8("a\xC0\x80"), 1u);          // overlong NUL
  EXPECT_EQ(first_invalid_utf8("a\xED\xA0\x80"), 1u);      // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);   // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xE6\x97"), 2u);         // truncated
}

std::vector<std::string> regex_split(const std::string& pattern, const std::string& text) {
  nlohmann::json j = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  std::vector<std::string> words;
  PreTokenizer::from_json(j, "test").split(text, words);
  return words;
}

TEST(Regex, SplitsAsTheQwenPatternDoes) {
  // Hand-checked: \s+(?!\S) leaves the last space to the next word.
  EXPECT_EQ(regex_split(kQwenSplit, "a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(regex_split(kQwenSplit, "I'LL 123"), (std::vector<std::string>{"I", "'LL", " ", "1", "2", "3"}));
  EXPECT_EQ(regex_split(kQwenSplit, "x\n\n  y"), (std::vector<std::string>{"x", "\n\n", " ", " y"}));
  EXPECT_EQ(regex_split(kQwenSplit, "日本語!?"), (std::vector<std::string>{"日本語", "!?"}));
}

TEST(Regex, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+0085 (NEL) is White_Space (PCRE2's own \s misses it); U+180E is not (PCRE2's \h has it).
  EXPECT_EQ(regex_split(R"(\s+)", "a\u0085b"), (std::vector<std::string>{"a", "\u0085", "b"}));
  EXPECT_EQ(regex_split(R"(\s+)", "a\u180Eb"), (std::vector<std::string>{"a\u180Eb"}));
  EXPECT_EQ(regex_split(R"([^\s]+)", "a\u3000b"), (std::vector<std::string>{"a", "\u3000", "b"}));
  EXPECT_THROW(Regex(R"([\S])", "test"), InputError);
  EXPECT_THROW(Regex(R"(\p{Nonsense})", "test"), InputError);
}

// The merge loop of `tokenizers`, naively: merge the lowest-ranked adjacent pair, leftmost first,
// one at a time, until no listed pair is left.
std::vector<std::string> naive_bpe(const std::string& word, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> s;
  for (char c : word) s.emplace_back(1, c);
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank.try_emplace(merges[r], r);
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = rank.find({s[i], s[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) return s;
    s[at] += s[at + 1];
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

TEST(BpeModel, MergesAsTheNaiveLoop) {
  std::mt19937 rng(7);
  const std::string alphabet = "abcd ";
  // Merges built as a trainer would: each joins two tokens that already exist.
  std::vector<std::string> tokens;
  for (char c : alphabet) tokens.emplace_back(1, c);
  std::vector<std::pair<std::string, std::string>> merges;
  std::set<std::string> known(tokens.begin(), tokens.end());
  while (merges.size() < 60) {
    const std::string& a = tokens[rng() % tokens.size()];
    const std::string& b = tokens[rng() % tokens.size()];
    if (a.size() + b.size() > 6 || known.count(a + b)) continue;
    merges.emplace_back(a, b);
    known.insert(a + b);
    tokens.push_back(a + b);
  }
  VocabMap vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace(std::string(1, static_cast<char>(b)), b);
  int32_t next = 256;
  for (const auto& [a, b] : merges) vocab.emplace(a + b, next++);
  BpeOptions options;
  options.byte_level = true;
  const BpeModel model(vocab, merges, options, "test");
  for (int trial = 0; trial < 3000; ++trial) {
    std::string word;
    const size_t n = 1 + rng() % 24;
    for (size_t i = 0; i < n; ++i) word.push_back(alphabet[rng() % alphabet.size()]);
    std::vector<int32_t> ids;
    model.encode_word(word, ids);
    std::vector<int32_t> expected;
    for (const std::string& t : naive_bpe(word, merges)) expected.push_back(vocab.at(t));
    ASSERT_EQ(ids, expected) << "word '" << word << "'";
  }
}

TEST(BpeModel, ByteFallbackAndUnknowns) {
  VocabMap vocab{{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}};
  for (int b = 0; b < 256; ++b) vocab.emplace(fmt::format("<0x{:02X}>", b), 4 + b);
  BpeOptions options;
  options.byte_fallback = true;
  options.unk_id = 0;
  const BpeModel model(vocab, {{"a", "b"}}, options, "test");
  std::vector<int32_t> ids;
  model.encode_word("ab\xC3\xA9", ids);  // "abé": é is unknown, spelled as its two UTF-8 bytes
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 4 + 0xC3, 4 + 0xA9}));
  EXPECT_EQ(model.byte_of_fallback_token(4 + 0xC3), 0xC3);
  EXPECT_THROW(BpeModel(vocab, {{"a", "c"}}, options, "test"), InputError);  // a merge part outside the vocabulary
}

TEST(AddedTokens, LeftmostLongestAsTheNaiveScan) {
  const std::vector<std::string> contents = {"<a>", "<a><b>", "b", "<a><", "ab"};
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < contents.size(); ++i) tokens.push_back({static_cast<int32_t>(100 + i), contents[i]});
  const AddedTokenMatcher matcher(tokens);
  std::mt19937 rng(11);
  const std::string alphabet = "<a>bx";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const size_t n = rng() % 20;
    for (size_t i = 0; i < n; ++i) text.push_back(alphabet[rng() % alphabet.size()]);
    // naive: at each position the longest content that starts there; text between matches is one piece
    std::vector<std::pair<std::string, int32_t>> expected;
    std::string pending;
    for (size_t i = 0; i < text.size();) {
      int best = -1;
      for (size_t t = 0; t < contents.size(); ++t)
        if (text.compare(i, contents[t].size(), contents[t]) == 0 &&
            (best < 0 || contents[t].size() > contents[best].size()))
          best = static_cast<int>(t);
      if (best < 0) {
        pending.push_back(text[i++]);
        continue;
      }
      if (!pending.empty()) expected.emplace_back(pending, -1), pending.clear();
      expected.emplace_back(contents[best], 100 + best);
      i += contents[best].size();
    }
    if (!pending.empty()) expected.emplace_back(pending, -1);
    std::vector<TextPiece> pieces;
    matcher.split(text, pieces);
    std::vector<std::pair<std::string, int32_t>> got;
    for (const TextPiece& p : pieces) got.emplace_back(std::string(p.text), p.added_id);
    ASSERT_EQ(got, expected) << "text '" << text << "'";
  }
}

TEST(AddedTokens, StripFlagsAbsorbWhiteSpace) {
  AddedToken t{7, "<m>"};
  t.lstrip = t.rstrip = true;
  const AddedTokenMatcher matcher({t});
  std::vector<TextPiece> pieces;
  matcher.split("x  <m>\t y", pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "x");
  EXPECT_EQ(pieces[1].text, "  <m>\t ");
  EXPECT_EQ(pieces[2].text, "y");
}

class TinyTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    json = byte_level_tokenizer_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}}, kQwenSplit);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  Tokenizer load() {
    write_json(dir / "tokenizer.json", json);
    return Tokenizer::load(dir);
  }
  std::filesystem::path dir;
  nlohmann::json json;
};

TEST_F(TinyTokenizer, EncodesAndDecodes) {
  const Tokenizer t = load();
  const int32_t hello = *t.token_id("hello"), end = *t.token_id("<|end|>");
  const std::vector<int32_t> ids = t.encode("hello<|end|>hello", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{hello, end, hello}));
  for (const std::string s : {"hello wörld\n\n  日本", "", "a\tb   c", "😀 <|end|><|end"})
    EXPECT_EQ(t.decode(t.encode(s, false)), s);
  EXPECT_EQ(t.decode(t.encode("x<|end|>", false), /*skip_special_tokens=*/true), "x");
  // NFC: 'e' + combining acute encodes as the precomposed 'é'
  EXPECT_EQ(t.encode("e\u0301", false), t.encode("\u00e9", false));
  EXPECT_THROW(t.encode("bad \xFF", false), InputError);
  EXPECT_THROW(t.decode(std::vector<int32_t>{static_cast<int32_t>(t.vocab_size())}), InputError);
}

TEST_F(TinyTokenizer, SpecialTokensAsTheFilesSay) {
  const int32_t end = 256 + 5;
  json["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
                                                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                            {"special_tokens", {{"<|end|>", {{"id", "<|end|>"}, {"ids", {end}}, {"tokens", {"<|end|>"}}}}}}};
  EXPECT_EQ(load().encode("h", true), (std::vector<int32_t>{end, 'h'}));
  // tokenizer_config.json's explicit add_bos_token decides, as transformers' Llama/Gemma tokenizers
  write_json(dir / "tokenizer_config.json", {{"add_bos_token", false}, {"bos_token", "<|end|>"}});
  EXPECT_EQ(load().encode("h", true).size(), 1u);
  write_json(dir / "tokenizer_config.json", {{"add_eos_token", true}, {"eos_token", {{"content", "<|end|>"}}}});
  EXPECT_EQ(load().encode("h", true), (std::vector<int32_t>{end, 'h', end}));
}

TEST_F(TinyTokenizer, RefusesWhatItDoesNotImplementNamingTheField) {
  auto refused = [&](const std::string& expected_in_message) {
    try {
      load();
      ADD_FAILURE() << "accepted; expected a refusal naming " << expected_in_message;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expected_in_message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  const nlohmann::json good = json;
  json["model"]["type"] = "WordPiece";
  refused("model.type");
  json = good;
  json["pre_tokenizer"]["pretokenizers"][0]["type"] = "Metaspace";
  refused("pre_tokenizer.pretokenizers[0]");
  json = good;
  json["normalizer"] = {{"type", "Lowercase"}};
  refused("normalizer");
  json = good;
  json["model"]["merges"].push_back("Q Z9");
  refused("model.merges[5]");
  json = good;
  json["added_tokens"][0]["single_word"] = true;
  refused("added_tokens[0].single_word");
  json = good;
  json["decoder"] = {{"type", "WordPiece"}};
  refused("decoder.type");
  json = good;
  json["model"]["dropout"] = 0.1;
  refused("model.dropout");
  std::filesystem::remove(dir / "tokenizer.json");
  EXPECT_THROW(Tokenizer::load(dir), IoError);
  std::ofstream(dir / "tokenizer.json") << "{\"model\": ";
  EXPECT_THROW(Tokenizer::load(dir), InputError);
}

}  // namespace
}  // namespace slidedp::text
