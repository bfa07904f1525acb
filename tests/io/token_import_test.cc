// Raw inputs -> tokens (JSON lines, .npy, text) and the slidedp-data tool end to end: what it writes
// reads back, --json reports it, --help documents every flag, and bad input exits non-zero with a
// message naming the file (and line).
#include "io/token_import.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/token_dataset.h"
#include "io_test_util.h"
#include "tests/text/text_test_util.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"

namespace slidedp {
namespace {

using testing::error_of;
using testing::TempDir;

// A .npy file as NumPy writes it: magic, version, header length, the dict padded so the data starts
// at a multiple of 64 bytes, ending in '\n'.
template <typename T>
std::string npy(const std::string& descr, const std::vector<T>& values, const std::string& shape = "",
                int version = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                     (shape.empty() ? std::to_string(values.size()) + "," : shape) + "), }";
  const std::size_t prefix = version == 1 ? 10 : 12;
  std::size_t total = prefix + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(version) + '\0';
  if (version == 1) {
    uint16_t n = static_cast<uint16_t>(dict.size());
    out.append(reinterpret_cast<const char*>(&n), 2);
  } else {
    uint32_t n = static_cast<uint32_t>(dict.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
  }
  out += dict;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return out;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(TokenImport, JsonLinesOfListsAndObjectsWithMasks) {
  TokenStream s;
  append_jsonl(s, "[1, 2, 3]\n\n{\"input_ids\": [4, 5], \"loss_mask\": [0, true]}\n  \n[6]", "d.jsonl", 10,
               9u);
  EXPECT_EQ(s.tokens, (std::vector<uint32_t>{1, 2, 3, 9, 4, 5, 9, 6, 9}));
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_TRUE(s.has_mask);
  EXPECT_EQ(s.documents, 3);

  struct Case {
    const char* text;
    std::vector<std::string> must_say;
  };
  const Case cases[] = {
      {"[1, 2]\n[3, 4\n", {"d.jsonl: line 2", "malformed JSON"}},
      {"[1]\n\n[1, 10]\n", {"line 3", "input_ids[1]", ">= vocab_size 10"}},
      {"[1, -1]", {"line 1", "negative"}},
      {"[1, 2.5]", {"input_ids[1]", "integer"}},
      {"{\"input_ids\": [1], \"labels\": [1]}", {"line 1", "unknown key 'labels'"}},
      {"{\"input_ids\": [1, 2], \"loss_mask\": [1]}", {"loss_mask", "2 values"}},
      {"{\"input_ids\": [1], \"loss_mask\": [2]}", {"loss_mask[0]"}},
      {"{\"text\": \"hello\"}", {"line 1", "needs the model's tokenizer"}},
      {"\"hello\"", {"line 1", "needs the model's tokenizer"}},
      {"{\"text\": 5}", {"line 1: text", "expected a string"}},
      {"{\"text\": \"a\", \"input_ids\": [1]}", {"no other key"}},
      {"{\"prompt\": \"a\"}", {"line 1", "prompt without completion"}},
      {"{\"completion\": \"a\"}", {"line 1", "completion without prompt"}},
      {"true", {"expected a list of token ids"}},
      {"", {"empty file"}},
      {"\n \n", {"no JSON lines"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    TokenStream t;
    std::string msg = error_of([&] { append_jsonl(t, c.text, "d.jsonl", 10, std::nullopt); });
    for (const auto& m : c.must_say)
      EXPECT_NE(msg.find(m), std::string::npos) << "missing '" << m << "' in: " << msg;
  }
}

TEST(TokenImport, NpyOfEveryIntegerTypeAndVersion) {
  TokenStream s;
  append_npy(s, bytes_of(npy<int32_t>("<i4", {1, 2, 3})), "a.npy", 100, std::nullopt);
  append_npy(s, bytes_of(npy<int64_t>("<i8", {4, 99})), "b.npy", 100, std::nullopt);
  append_npy(s, bytes_of(npy<uint16_t>("<u2", {5}, "", 2)), "c.npy", 100, std::nullopt);
  append_npy(s, bytes_of(npy<uint32_t>("<u4", {6, 7}, "", 3)), "d.npy", 100, 0u);
  EXPECT_EQ(s.tokens, (std::vector<uint32_t>{1, 2, 3, 4, 99, 5, 6, 7, 0}));
  EXPECT_FALSE(s.has_mask);
  EXPECT_EQ(s.documents, 4);

  NpyHeader h = parse_npy_header(bytes_of(npy<int32_t>("<i4", {1})), "h.npy");
  EXPECT_EQ(h.descr, "<i4");
  EXPECT_EQ(h.shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(h.data_offset % 64, 0u);

  struct Case {
    const char* label;
    std::string file;
    std::vector<std::string> must_say;
  };
  std::string truncated = npy<int32_t>("<i4", {1, 2, 3});
  truncated.resize(truncated.size() - 3);
  const Case cases[] = {
      {"2-D", npy<int32_t>("<i4", {1, 2, 3, 4}, "2, 2"), {"1-D", "2 dimensions"}},
      {"big-endian", npy<int32_t>(">i4", {1}), {">i4", "big-endian"}},
      {"float", npy<float>("<f4", {1.0f}), {"<f4", "not supported"}},
      {"id >= vocab", npy<int64_t>("<i8", {1, 100}), {"element 1", ">= vocab_size 100"}},
      {"negative", npy<int32_t>("<i4", {-3}), {"element 0", "negative"}},
      {"truncated", truncated, {"truncated"}},
      {"wrong magic", "PK\x03\x04 not numpy at all", {"wrong magic"}},
      {"empty file", "", {"empty file"}},
      {"empty array", npy<int32_t>("<i4", {}, "0,"), {"empty array"}},
      {"bad header", std::string("\x93NUMPY\x01\x00\x08\x00{'a': ?}", 18), {".npy header"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    TokenStream t;
    std::string msg = error_of([&] { append_npy(t, bytes_of(c.file), "x.npy", 100, std::nullopt); });
    EXPECT_NE(msg.find("x.npy"), std::string::npos) << msg;
    for (const auto& m : c.must_say)
      EXPECT_NE(msg.find(m), std::string::npos) << "missing '" << m << "' in: " << msg;
  }
}

TEST(TokenImport, TextIsOneTokenPerByte) {
  TokenStream s;
  append_text(s, "Hi\xc3\xa9", "t.txt", 256, std::nullopt);
  EXPECT_EQ(s.tokens, (std::vector<uint32_t>{'H', 'i', 0xc3, 0xa9}));
  EXPECT_THROW(append_text(s, "", "t.txt", 256, std::nullopt), InputError);
  EXPECT_THROW(append_text(s, "x", "t.txt", 100, std::nullopt), InputError);
  EXPECT_EQ(input_format_for("auto", "a.jsonl"), InputFormat::kJsonl);
  EXPECT_EQ(input_format_for("auto", "a.npy"), InputFormat::kNpy);
  EXPECT_EQ(input_format_for("auto", "a.md"), InputFormat::kText);
  EXPECT_THROW(input_format_for("csv", "a.csv"), InputError);
}

std::string tool() { return SLIDEDP_DATA_BIN; }

TEST(SlidedpData, BuildsFromTextJsonlAndNpy) {
  TempDir dir;
  testing::write_bytes(dir / "a.txt", "hello world");
  auto r =
      testing::run_command(tool() + " build " + (dir / "a.txt") + " --out " + (dir / "a.bin") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["num_tokens"], 11);
  EXPECT_EQ(j["vocab_size"], 256);
  EXPECT_EQ(j["dtype"], "uint16");
  TokenDataset a = TokenDataset::open(dir / "a.bin");
  EXPECT_EQ(a.num_tokens(), 11);
  EXPECT_EQ(a.token(4), static_cast<uint32_t>('o'));

  testing::write_bytes(dir / "b.jsonl", "[1, 2, 3]\n{\"input_ids\": [70000, 5], \"loss_mask\": [0, 1]}\n");
  testing::write_bytes(dir / "c.npy", npy<int64_t>("<i8", {7, 8}));
  r = testing::run_command(tool() + " build " + (dir / "b.jsonl") + " " + (dir / "c.npy") +
                           " --vocab-size 100000 --eos-id 0 --out " + (dir / "b.bin") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["dtype"], "uint32");
  EXPECT_EQ(j["documents"], 3);
  EXPECT_EQ(j["has_loss_mask"], true);
  EXPECT_EQ(j["inputs"][1]["format"], "npy");
  TokenDataset b = TokenDataset::open(dir / "b.bin");
  std::vector<uint32_t> got;
  for (int64_t i = 0; i < b.num_tokens(); ++i) got.push_back(b.token(i));
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 2, 3, 0, 70000, 5, 0, 7, 8, 0}));
  EXPECT_FALSE(b.counts_in_loss(4));
  EXPECT_TRUE(b.counts_in_loss(5));

  r = testing::run_command(tool() + " inspect " + (dir / "b.bin") + " --seq-len 3 --head 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["num_tokens"], 10);
  EXPECT_EQ(j["sequences"], 3);
  EXPECT_EQ(j["loss_tokens"], 9);
  EXPECT_EQ(j["head"], nlohmann::json::array({1, 2, 3, 0}));

  r = testing::run_command(tool() + " build --embedded --out " + (dir / "e.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(TokenDataset::open(dir / "e.bin").num_tokens(), 30000);
}

// With the model's tokenizer: the file holds what text::Tokenizer::encode gives for each document
// (whose agreement with Hugging Face is tests/text), the EOS after each, the tokenizer's vocabulary;
// invalid UTF-8 names the file and line; --decode gives the text back.
TEST(SlidedpData, BuildsTextThroughTheModelsTokenizer) {
  TempDir dir;
  const std::filesystem::path model = dir / "model";
  std::filesystem::create_directories(model);
  std::ofstream(model / "tokenizer.json")
      << testing::byte_level_tokenizer_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}},
                                           R"('s|\s+(?!\S)|\s+|\S+)")
             .dump();
  std::ofstream(model / "tokenizer_config.json") << R"({"eos_token": "<|end|>"})";
  const text::Tokenizer tokenizer = text::Tokenizer::load(model);
  testing::write_bytes(dir / "a.txt", "hello hello\n");
  testing::write_bytes(dir / "b.jsonl", "\"hello<|end|>x\"\n{\"text\": \"wörld\"}\n");
  auto r = testing::run_command(tool() + " build " + (dir / "a.txt") + " " + (dir / "b.jsonl") + " --tokenizer " +
                                model.string() + " --append-eos --out " + (dir / "t.bin") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["documents"], 3);
  std::vector<int32_t> expected;
  const int32_t eos = *tokenizer.token_id("<|end|>");
  for (const char* doc : {"hello hello\n", "hello<|end|>x", "wörld"}) {
    for (int32_t id : tokenizer.encode(doc, true)) expected.push_back(id);
    expected.push_back(eos);
  }
  TokenDataset t = TokenDataset::open(dir / "t.bin");
  EXPECT_EQ(t.vocab_size(), tokenizer.vocab_size());
  std::vector<int32_t> got;
  for (int64_t i = 0; i < t.num_tokens(); ++i) got.push_back(static_cast<int32_t>(t.token(i)));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got[0], *tokenizer.token_id("hello"));

  r = testing::run_command(tool() + " inspect " + (dir / "t.bin") + " --model " + model.string() + " --decode --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["decoded"], "hello hello\n<|end|>hello<|end|>x<|end|>wörld<|end|>");

  testing::write_bytes(dir / "bad.txt", "fine\nbad \xFF here\n");
  r = testing::run_command(tool() + " build " + (dir / "bad.txt") + " --tokenizer " + model.string() + " --out " +
                           (dir / "x.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.txt: invalid UTF-8 at line 2, byte 5"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.bin"));
  r = testing::run_command(tool() + " build " + (dir / "a.txt") + " --tokenizer " + (dir / "nowhere") + " --out " +
                           (dir / "x.bin"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
}

// Conversations through the model folder's chat template: the file holds text::ChatEncoder's ids and
// assistant mask for each (tests/text checks that encoder against Jinja2 and generation markers), a
// text line between them counts whole, --train-on-all writes no mask; without a template a
// conversation is refused naming it, exit 2, and no file is written.
TEST(SlidedpData, BuildsConversationsWithTheAssistantMask) {
  TempDir dir;
  const std::filesystem::path model = dir / "model";
  std::filesystem::create_directories(model);
  nlohmann::json tj = testing::byte_level_tokenizer_json({{"h", "i"}, {"o", "k"}}, R"(\s+(?!\S)|\s+|\S+)");
  tj["added_tokens"] = nlohmann::json::array({{{"id", 300}, {"content", "<|im_start|>"}, {"special", true}, {"single_word", false},
                                               {"lstrip", false}, {"rstrip", false}, {"normalized", false}},
                                              {{"id", 301}, {"content", "<|im_end|>"}, {"special", true}, {"single_word", false},
                                               {"lstrip", false}, {"rstrip", false}, {"normalized", false}}});
  std::ofstream(model / "tokenizer.json") << tj.dump();
  std::ofstream(model / "tokenizer_config.json")
      << nlohmann::json{{"eos_token", "<|im_end|>"},
                        {"chat_template", "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"}}
             .dump();
  const text::Tokenizer tokenizer = text::Tokenizer::load(model);
  const text::ChatEncoder encoder(tokenizer);
  const std::vector<std::string> lines = {
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok ok"}]})",
      R"("hi there")", R"({"prompt": "hi", "completion": "ok"})"};
  std::string file;
  for (const std::string& l : lines) file += l + "\n";
  testing::write_bytes(dir / "chat.jsonl", file);
  auto r = testing::run_command(tool() + " build " + (dir / "chat.jsonl") + " --model " + model.string() + " --out " +
                                (dir / "c.bin") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["conversations"], 2);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    if (k == 1) {
      for (int32_t id : tokenizer.encode("hi there", true)) ids.push_back(id), mask.push_back(1);
      continue;
    }
    const text::ChatExample ex = encoder.encode(nlohmann::ordered_json::parse(lines[k]), false, "x");
    ids.insert(ids.end(), ex.ids.begin(), ex.ids.end());
    mask.insert(mask.end(), ex.mask.begin(), ex.mask.end());
  }
  TokenDataset t = TokenDataset::open(dir / "c.bin");
  ASSERT_TRUE(t.has_loss_mask());
  std::vector<int32_t> got;
  std::vector<uint8_t> got_mask;
  for (int64_t i = 0; i < t.num_tokens(); ++i) got.push_back(static_cast<int32_t>(t.token(i))), got_mask.push_back(t.counts_in_loss(i));
  EXPECT_EQ(got, ids);
  EXPECT_EQ(got_mask, mask);
  EXPECT_LT(std::count(mask.begin(), mask.end(), 1), static_cast<std::ptrdiff_t>(mask.size()));  // the users' turns do not count

  r = testing::run_command(tool() + " build " + (dir / "chat.jsonl") + " --model " + model.string() + " --train-on-all --out " +
                           (dir / "all.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(TokenDataset::open(dir / "all.bin").has_loss_mask());

  std::ofstream(model / "tokenizer_config.json") << R"({"eos_token": "<|im_end|>"})";
  r = testing::run_command(tool() + " build " + (dir / "chat.jsonl") + " --model " + model.string() + " --out " + (dir / "n.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("chat.jsonl: line 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("chat template"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "n.bin"));
}

TEST(SlidedpData, BadInputExitsNonZeroNamingTheProblem) {
  TempDir dir;
  testing::write_bytes(dir / "bad.jsonl", "[1, 2]\n[3, oops]\n");
  testing::write_bytes(dir / "big.jsonl", "[1, 2]\n[3, 512]\n");
  testing::write_bytes(dir / "empty.txt", "");
  testing::write_bytes(dir / "notok.bin",
                       "this is not a token file at all, just some text bytes..............");
  struct Case {
    std::string args;
    int exit_code;
    std::vector<std::string> must_say;
  };
  const std::vector<Case> cases = {
      {"build " + (dir / "bad.jsonl") + " --vocab-size 10 --out " + (dir / "x.bin"),
       2,
       {"bad.jsonl: line 2", "malformed"}},
      {"build " + (dir / "big.jsonl") + " --vocab-size 512 --out " + (dir / "x.bin"),
       2,
       {"line 2", ">= vocab_size 512"}},
      {"build " + (dir / "big.jsonl") + " --out " + (dir / "x.bin"), 2, {"--vocab-size", "required"}},
      {"build " + (dir / "empty.txt") + " --out " + (dir / "x.bin"), 2, {"empty.txt", "empty file"}},
      {"build " + (dir / "missing.txt") + " --out " + (dir / "x.bin"), 4, {"missing.txt"}},
      {"build " + (dir / "big.jsonl") + " --vocab-size 100000 --dtype uint16 --out " + (dir / "x.bin"),
       2,
       {"--dtype"}},
      {"inspect " + (dir / "notok.bin"), 2, {"notok.bin", "wrong magic"}},
      {"inspect " + (dir / "empty.txt"), 2, {"empty file"}},
      {"build " + (dir / "big.jsonl"), 2, {"--out"}},
      {"frobnicate", 2, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = testing::run_command(tool() + " " + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    for (const auto& m : c.must_say)
      EXPECT_NE(r.output.find(m), std::string::npos) << "missing '" << m << "' in: " << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "x.bin"));
}

// An output that is an input, or a link to one, would replace the text with tokens (exit 0 before);
// refused up front, the input untouched. Also a folder as the output, and an output inside a file.
TEST(SlidedpData, RefusesAnOutputThatIsAnInputOrALinkToOne) {
  TempDir dir;
  const std::string text = "some text that must survive\n";
  testing::write_bytes(dir / "in.txt", text);
  std::filesystem::create_symlink(dir / "in.txt", dir / "link.txt");
  std::filesystem::create_hard_link(dir / "in.txt", dir / "hard.txt");
  std::filesystem::create_directories(dir / "folder");
  struct Case {
    std::string args;
    std::vector<std::string> must_say;
  };
  const std::vector<Case> cases = {
      {"build " + (dir / "in.txt") + " --out " + (dir / "in.txt"), {"--out", "is INPUT", "in.txt"}},
      {"build " + (dir / "in.txt") + " --out " + (dir / "link.txt"), {"--out", "is INPUT"}},
      {"build " + (dir / "link.txt") + " --out " + (dir / "in.txt"), {"--out", "is INPUT"}},
      {"build " + (dir / "in.txt") + " --out " + (dir / "hard.txt"), {"--out", "is INPUT"}},
      {"build " + (dir / "in.txt") + " --out " + dir.path() + "/./folder/../in.txt", {"--out", "is INPUT"}},
      {"build " + (dir / "in.txt") + " --out " + (dir / "folder"), {"--out", "is a folder"}},
      {"build " + (dir / "in.txt") + " --out " + (dir / "in.txt") + "/x.bin", {"--out", "not a folder"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = testing::run_command(tool() + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    for (const auto& m : c.must_say)
      EXPECT_NE(r.output.find(m), std::string::npos) << "missing '" << m << "' in: " << r.output;
    EXPECT_EQ(testing::read_bytes(dir / "in.txt"), text);
    EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.txt"));
  }
}

TEST(SlidedpData, HelpExplainsEveryFlag) {
  auto r = testing::run_command(tool() + " build --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag :
       {"--out", "--input-format", "--vocab-size", "--dtype", "--eos-id", "--embedded", "--json"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " undocumented in:\n" << r.output;
  r = testing::run_command(tool() + " inspect --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--seq-len", "--head", "--json"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace slidedp
