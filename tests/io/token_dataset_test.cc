// Token files: the byte layout checked against docs/FORMATS.md field by field, round trips of both
// widths with and without a loss mask, and every malformed file as an error naming the file. Also the
// embedded default corpus (size, ASCII, byte tokenization).
#include "io/token_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "io/default_corpus.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

template <typename T>
T field(const std::string& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

TEST(TokenFile, LayoutMatchesTheDocumentedFormat) {
  TempDir dir;
  std::vector<uint32_t> tokens = {1, 2, 3, 65535, 0};
  std::vector<uint8_t> mask = {0, 1, 1, 0, 1};
  write_token_file(dir / "t.bin", tokens, mask, 65536, TokenDtype::kUint16);
  std::string b = testing::read_bytes(dir / "t.bin");
  ASSERT_EQ(b.size(), 64u + 5 * 2 + 5);
  EXPECT_EQ(b.substr(0, 8), "SDPTOKNS");
  EXPECT_EQ(field<uint32_t>(b, 8), 1u);       // version
  EXPECT_EQ(field<uint32_t>(b, 12), 2u);      // bytes per token
  EXPECT_EQ(field<uint64_t>(b, 16), 5u);      // token count
  EXPECT_EQ(field<uint64_t>(b, 24), 65536u);  // vocab size
  EXPECT_EQ(field<uint32_t>(b, 32), 1u);      // flags: loss mask present
  for (std::size_t i = 36; i < 64; ++i) EXPECT_EQ(b[i], 0) << "reserved byte " << i;
  EXPECT_EQ(field<uint16_t>(b, 64 + 3 * 2), 65535);
  EXPECT_EQ(b[64 + 10 + 0], 0);  // mask after the tokens
  EXPECT_EQ(b[64 + 10 + 1], 1);
}

TEST(TokenFile, RoundTripsBothWidthsWithAndWithoutMask) {
  TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 1000; ++i) tokens.push_back((i * 7919u) % 100000u);
  std::vector<uint8_t> mask(tokens.size());
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = i % 3 == 0 ? 0 : 1;

  write_token_file(dir / "a.bin", tokens, mask, 100000, TokenDtype::kUint32);
  TokenDataset a = TokenDataset::open(dir / "a.bin");
  EXPECT_EQ(a.num_tokens(), 1000);
  EXPECT_EQ(a.vocab_size(), 100000);
  EXPECT_EQ(a.dtype(), TokenDtype::kUint32);
  EXPECT_TRUE(a.has_loss_mask());
  for (int64_t i = 0; i < a.num_tokens(); ++i) {
    ASSERT_EQ(a.token(i), tokens[static_cast<std::size_t>(i)]);
    ASSERT_EQ(a.counts_in_loss(i), mask[static_cast<std::size_t>(i)] == 1);
  }

  std::vector<uint32_t> small(tokens.size());
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = tokens[i] % 50000;
  write_token_file(dir / "b.bin", small, {}, 50000, token_dtype_for_vocab(50000));
  TokenDataset b = TokenDataset::open(dir / "b.bin");
  EXPECT_EQ(b.dtype(), TokenDtype::kUint16);
  EXPECT_FALSE(b.has_loss_mask());
  EXPECT_EQ(fs::file_size(dir / "b.bin"), 64u + 2000u);
  for (int64_t i = 0; i < b.num_tokens(); ++i) {
    ASSERT_EQ(b.token(i), small[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(b.counts_in_loss(i));
  }
  TokenDataset copy = b;  // shared storage: copies stay valid after the original goes
  b = TokenDataset::open(dir / "a.bin");
  EXPECT_EQ(copy.token(999), small[999]);
}

TEST(TokenFile, EveryMalformedFileIsAnErrorNamingIt) {
  TempDir dir;
  std::vector<uint32_t> tokens = {5, 6, 7, 8};
  write_token_file(dir / "good.bin", tokens, {}, 10, TokenDtype::kUint16);
  const std::string good = testing::read_bytes(dir / "good.bin");
  auto patched = [&](std::size_t offset, const void* value, std::size_t n) {
    std::string b = good;
    std::memcpy(b.data() + offset, value, n);
    return b;
  };
  uint32_t v2 = 2, b3 = 3, flag_bits = 8, one = 1;
  uint64_t huge = 1000, vocab5 = 5, vocab_big = 70000;
  struct Case {
    const char* label;
    std::string bytes;
    ErrorKind kind;
    const char* must_say;
  };
  const Case cases[] = {
      {"empty", "", ErrorKind::kInput, "empty file"},
      {"short header", good.substr(0, 40), ErrorKind::kIo, "truncated"},
      {"wrong magic", "NOTTOKNS" + good.substr(8), ErrorKind::kInput, "wrong magic"},
      {"bad version", patched(8, &v2, 4), ErrorKind::kInput, "version"},
      {"bad width", patched(12, &b3, 4), ErrorKind::kInput, "token_bytes"},
      {"count past the end", patched(16, &huge, 8), ErrorKind::kIo, "truncated"},
      {"token >= vocab", patched(24, &vocab5, 8), ErrorKind::kInput, "token 5 at index 0 is >= vocab_size 5"},
      {"uint16 with a big vocab", patched(24, &vocab_big, 8), ErrorKind::kInput, "uint16"},
      {"unknown flags", patched(32, &flag_bits, 4), ErrorKind::kInput, "flags"},
      {"reserved not zero", patched(48, &one, 4), ErrorKind::kInput, "reserved"},
      {"document end without its flag", patched(36, &one, 4), ErrorKind::kInput, "document_end"},
      {"packed length without its flag", patched(40, &one, 4), ErrorKind::kInput, "packed_seq_len"},
      {"mask flag without mask bytes", patched(32, &one, 4), ErrorKind::kIo, "truncated"},
      {"trailing bytes", good + "xy", ErrorKind::kInput, "belong to nothing"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir / "bad.bin";
    testing::write_bytes(path, c.bytes);
    try {
      TokenDataset::open(path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(e.kind(), c.kind) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.must_say), std::string::npos) << msg;
    }
  }
  // A mask byte other than 0/1.
  std::vector<uint8_t> mask = {1, 1, 1, 1};
  write_token_file(dir / "m.bin", tokens, mask, 10, TokenDtype::kUint16);
  std::string m = testing::read_bytes(dir / "m.bin");
  m[m.size() - 1] = 2;
  testing::write_bytes(dir / "m.bin", m);
  EXPECT_THROW(TokenDataset::open(dir / "m.bin"), InputError);
  EXPECT_THROW(TokenDataset::open(dir / "missing.bin"), IoError);
}

TEST(TokenFile, WriterAndInMemoryDatasetsValidateToo) {
  TempDir dir;
  std::vector<uint32_t> tokens = {1, 2, 300};
  EXPECT_THROW(write_token_file(dir / "x.bin", tokens, {}, 256, TokenDtype::kUint16), InputError);
  EXPECT_FALSE(fs::exists(dir / "x.bin"));
  EXPECT_THROW(write_token_file(dir / "x.bin", tokens, {}, 100000, TokenDtype::kUint16), InputError);
  std::vector<uint8_t> short_mask = {1};
  EXPECT_THROW(write_token_file(dir / "x.bin", tokens, short_mask, 1000, TokenDtype::kUint16), InputError);
  EXPECT_THROW(TokenDataset::from_tokens("mem", tokens, {}, 256), InputError);
  EXPECT_THROW(TokenDataset::from_tokens("mem", tokens, {1, 1, 2}, 1000), InputError);
  TokenDataset ok = TokenDataset::from_tokens("mem", tokens, {1, 0, 1}, 1000);
  EXPECT_FALSE(ok.counts_in_loss(1));
  EXPECT_EQ(ok.token(2), 300u);
}

TEST(DefaultCorpus, IsEmbeddedProseOfTheDocumentedSize) {
  std::string_view text = default_corpus_text();
  EXPECT_GE(text.size(), 30u * 1024);
  EXPECT_LE(text.size(), 80u * 1024);
  for (char c : text) ASSERT_TRUE(static_cast<unsigned char>(c) < 128) << "non-ASCII byte";
  EXPECT_NE(text.find("It is a truth universally acknowledged"), std::string_view::npos);
  // The embedded bytes are exactly the repository file.
  EXPECT_EQ(std::string(text), testing::read_bytes("io/data/tiny_corpus.txt"));

  TokenDataset d = default_corpus_dataset();
  EXPECT_EQ(d.num_tokens(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(d.vocab_size(), 256);
  EXPECT_FALSE(d.has_loss_mask());
  for (int64_t i = 0; i < d.num_tokens(); i += 997)
    ASSERT_EQ(d.token(i), static_cast<unsigned char>(text[static_cast<std::size_t>(i)]));
  EXPECT_EQ(byte_tokenize("\xff\x01"), (std::vector<uint32_t>{255, 1}));
}

}  // namespace
}  // namespace slidedp
