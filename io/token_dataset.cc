// Token files: reading (mmap + full validation), in-memory datasets and atomic writing; see
// token_dataset.h and docs/FORMATS.md for the byte layout.
#include "io/token_dataset.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"
#include "io/posix_file.h"

namespace slidedp {

namespace {

// The header as laid out on disk (little-endian, 64 bytes, no implicit padding).
struct TokenFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t num_tokens;
  uint64_t vocab_size;
  uint32_t flags;
  uint32_t document_end;    // flags bit 1; else zero
  uint64_t packed_seq_len;  // flags bit 2; else zero
  uint8_t reserved[16];
};
static_assert(sizeof(TokenFileHeader) == kTokenFileHeaderBytes, "token file header must be 64 bytes");

// Finds the first token >= vocab (or -1).
template <typename T>
int64_t first_bad_token(const uint8_t* p, int64_t n, uint64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    T t;
    std::memcpy(&t, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    if (t >= vocab) return i;
  }
  return -1;
}

// Why `documents` does not describe these tokens (empty: it does). A packed file is bins of T tokens
// each ending with the document end, then one more end token, so that the sampler's S = (N - 1) / T
// sequences are exactly the bins.
template <class TokenAt>
std::string documents_mismatch(const TokenFileDocuments& d, uint64_t num_tokens, uint64_t vocab,
                               TokenAt token_at) {
  if (!d.document_end) return d.packed_seq_len != 0 ? "packed_seq_len without a document end" : "";
  if (*d.document_end >= vocab)
    return fmt::format("document_end {} is >= vocab_size {}", *d.document_end, vocab);
  if (d.packed_seq_len == 0) return "";
  const uint64_t T = static_cast<uint64_t>(d.packed_seq_len);
  if (d.packed_seq_len < 0 || num_tokens == 0 || (num_tokens - 1) % T != 0)
    return fmt::format("{} tokens are not whole packed sequences of {} plus one end token", num_tokens,
                       d.packed_seq_len);
  for (uint64_t i = T - 1; i < num_tokens; i += T)
    if (token_at(i) != *d.document_end)
      return fmt::format("packed sequence {} ends with token {}, not the document end {}", i / T, token_at(i),
                         *d.document_end);
  if (token_at(num_tokens - 1) != *d.document_end) return "the last token is not the document end";
  return "";
}

}  // namespace

struct TokenDataset::Storage {
  std::string name;
  MappedFile file;              // when opened from a file
  std::string copied;           // when read from a file into memory
  std::vector<uint32_t> owned;  // when built in memory
  std::vector<uint8_t> owned_mask;
  const uint8_t* tokens = nullptr;
  const uint8_t* mask = nullptr;  // nullptr: no mask
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  TokenDtype dtype = TokenDtype::kUint32;
  TokenFileDocuments documents;
};

const char* token_dtype_name(TokenDtype dtype) { return dtype == TokenDtype::kUint16 ? "uint16" : "uint32"; }

TokenDtype token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDtype::kUint16 : TokenDtype::kUint32;
}

TokenDataset TokenDataset::open(const std::string& path) {
  auto s = std::make_shared<Storage>();
  s->name = path;
  s->file = MappedFile(path);
  const std::span<const uint8_t> bytes = s->file.bytes();
  return validated(std::move(s), bytes);
}

TokenDataset TokenDataset::read(const std::string& path) {
  auto s = std::make_shared<Storage>();
  s->name = path;
  s->copied = read_text_file(path);  // binary-safe: the bytes as they are
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(s->copied.data()), s->copied.size());
  return validated(std::move(s), bytes);
}

TokenDataset TokenDataset::validated(std::shared_ptr<Storage> s, std::span<const uint8_t> bytes) {
  const std::string path = s->name;
  if (bytes.empty()) throw InputError(path, "empty file (not a token file)");
  if (bytes.size() < sizeof(TokenFileHeader))
    throw IoError(path, fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(),
                                    kTokenFileHeaderBytes));
  TokenFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kTokenFileMagic, 8) != 0)
    throw InputError(
        path, "wrong magic: not a SlideDP token file (expected \"SDPTOKNS\"; build one with slidedp-data)");
  if (h.version != kTokenFileVersion)
    throw InputError(path + ": version", fmt::format("{} is not supported (this build reads version {})",
                                                     h.version, kTokenFileVersion));
  if (h.token_bytes != 2 && h.token_bytes != 4)
    throw InputError(path + ": token_bytes",
                     fmt::format("{} (expected 2 for uint16 or 4 for uint32)", h.token_bytes));
  constexpr uint32_t known = kTokenFileFlagLossMask | kTokenFileFlagDocumentEnd | kTokenFileFlagPacked;
  if ((h.flags & ~known) != 0)
    throw InputError(path + ": flags", fmt::format("unknown flag bits 0x{:x}", h.flags & ~known));
  if ((h.flags & kTokenFileFlagPacked) && !(h.flags & kTokenFileFlagDocumentEnd))
    throw InputError(path + ": flags", "packed (bit 2) without a document end (bit 1)");
  if (!(h.flags & kTokenFileFlagDocumentEnd) && h.document_end != 0)
    throw InputError(path + ": document_end", "set (offset 36) while flags bit 1 says the file has none");
  if (!(h.flags & kTokenFileFlagPacked) && h.packed_seq_len != 0)
    throw InputError(path + ": packed_seq_len",
                     "set (offset 40) while flags bit 2 says the file is not packed");
  bool reserved_zero = true;
  for (uint8_t b : h.reserved) reserved_zero = reserved_zero && b == 0;
  if (!reserved_zero) throw InputError(path + ": reserved", "reserved header bytes must be zero");
  if (h.vocab_size == 0 || h.vocab_size > static_cast<uint64_t>(kMaxVocabSize))
    throw InputError(path + ": vocab_size", fmt::format("{} is outside [1, 2^31]", h.vocab_size));
  if (h.token_bytes == 2 && h.vocab_size > 65536)
    throw InputError(path + ": vocab_size", fmt::format("{} does not fit uint16 tokens", h.vocab_size));
  const bool has_mask = (h.flags & kTokenFileFlagLossMask) != 0;
  // Sizes in 128-bit-free arithmetic: num_tokens is bounded by the file size before multiplying.
  const uint64_t payload = bytes.size() - sizeof h;
  const uint64_t per_token = h.token_bytes + (has_mask ? 1u : 0u);
  if (h.num_tokens > payload / per_token)
    throw IoError(path,
                  fmt::format("truncated: header says {} tokens ({} bytes each{}) but only {} bytes follow",
                              h.num_tokens, h.token_bytes, has_mask ? " + 1 mask byte" : "", payload));
  if (h.num_tokens * per_token != payload)
    throw InputError(
        path, fmt::format("{} bytes after the {} tokens{} belong to nothing",
                          payload - h.num_tokens * per_token, h.num_tokens, has_mask ? " and mask" : ""));
  s->num_tokens = static_cast<int64_t>(h.num_tokens);
  s->vocab_size = static_cast<int64_t>(h.vocab_size);
  s->dtype = static_cast<TokenDtype>(h.token_bytes);
  s->tokens = bytes.data() + sizeof h;
  s->mask = has_mask ? s->tokens + h.num_tokens * h.token_bytes : nullptr;

  int64_t bad = h.token_bytes == 2 ? first_bad_token<uint16_t>(s->tokens, s->num_tokens, h.vocab_size)
                                   : first_bad_token<uint32_t>(s->tokens, s->num_tokens, h.vocab_size);
  if (bad >= 0) {
    TokenDataset tmp;
    tmp.s_ = s;
    throw InputError(
        path, fmt::format("token {} at index {} is >= vocab_size {}", tmp.token(bad), bad, h.vocab_size));
  }
  if (has_mask)
    for (int64_t i = 0; i < s->num_tokens; ++i)
      if (s->mask[i] > 1)
        throw InputError(path, fmt::format("loss mask byte {} at index {} is not 0 or 1", s->mask[i], i));
  if (h.flags & kTokenFileFlagDocumentEnd) s->documents.document_end = h.document_end;
  if (h.flags & kTokenFileFlagPacked) {
    if (h.packed_seq_len < 2 || h.packed_seq_len > static_cast<uint64_t>(INT64_MAX))
      throw InputError(path + ": packed_seq_len",
                       fmt::format("{} is not a sequence length", h.packed_seq_len));
    s->documents.packed_seq_len = static_cast<int64_t>(h.packed_seq_len);
  }
  TokenDataset d;
  d.s_ = std::move(s);
  const std::string why = documents_mismatch(d.s_->documents, h.num_tokens, h.vocab_size,
                                             [&d](uint64_t i) { return d.token(static_cast<int64_t>(i)); });
  if (!why.empty()) throw InputError(path + ": documents", why);
  return d;
}

TokenDataset TokenDataset::from_tokens(std::string name, std::vector<uint32_t> tokens,
                                       std::vector<uint8_t> loss_mask, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > kMaxVocabSize)
    throw InputError(name + ": vocab_size", fmt::format("{} is outside [1, 2^31]", vocab_size));
  if (!loss_mask.empty() && loss_mask.size() != tokens.size())
    throw InputError(name,
                     fmt::format("loss mask has {} entries for {} tokens", loss_mask.size(), tokens.size()));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= static_cast<uint64_t>(vocab_size))
      throw InputError(name,
                       fmt::format("token {} at index {} is >= vocab_size {}", tokens[i], i, vocab_size));
  for (std::size_t i = 0; i < loss_mask.size(); ++i)
    if (loss_mask[i] > 1)
      throw InputError(name, fmt::format("loss mask byte {} at index {} is not 0 or 1", loss_mask[i], i));
  auto s = std::make_shared<Storage>();
  s->name = std::move(name);
  s->owned = std::move(tokens);
  s->owned_mask = std::move(loss_mask);
  s->tokens = reinterpret_cast<const uint8_t*>(s->owned.data());
  s->mask = s->owned_mask.empty() ? nullptr : s->owned_mask.data();
  s->num_tokens = static_cast<int64_t>(s->owned.size());
  s->vocab_size = vocab_size;
  s->dtype = TokenDtype::kUint32;
  TokenDataset d;
  d.s_ = std::move(s);
  return d;
}

const std::string& TokenDataset::name() const { return s_->name; }
int64_t TokenDataset::num_tokens() const { return s_->num_tokens; }
int64_t TokenDataset::vocab_size() const { return s_->vocab_size; }
bool TokenDataset::has_loss_mask() const { return s_->mask != nullptr; }
TokenDtype TokenDataset::dtype() const { return s_->dtype; }
const TokenFileDocuments& TokenDataset::documents() const { return s_->documents; }

uint32_t TokenDataset::token(int64_t i) const {
  SLIDEDP_CHECK(i >= 0 && i < s_->num_tokens, "token index out of range");
  if (s_->dtype == TokenDtype::kUint16) {
    uint16_t t;
    std::memcpy(&t, s_->tokens + 2 * i, 2);
    return t;
  }
  uint32_t t;
  std::memcpy(&t, s_->tokens + 4 * i, 4);
  return t;
}

bool TokenDataset::counts_in_loss(int64_t i) const {
  SLIDEDP_CHECK(i >= 0 && i < s_->num_tokens, "token index out of range");
  return s_->mask == nullptr || s_->mask[i] != 0;
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens,
                      std::span<const uint8_t> loss_mask, int64_t vocab_size, TokenDtype dtype,
                      const TokenFileDocuments& documents) {
  if (vocab_size <= 0 || vocab_size > kMaxVocabSize)
    throw InputError(path + ": vocab_size", fmt::format("{} is outside [1, 2^31]", vocab_size));
  if (dtype == TokenDtype::kUint16 && vocab_size > 65536)
    throw InputError(path + ": dtype",
                     fmt::format("uint16 cannot hold ids of a vocabulary of {}", vocab_size));
  if (!loss_mask.empty() && loss_mask.size() != tokens.size())
    throw InputError(path,
                     fmt::format("loss mask has {} entries for {} tokens", loss_mask.size(), tokens.size()));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= static_cast<uint64_t>(vocab_size))
      throw InputError(path,
                       fmt::format("token {} at index {} is >= vocab_size {}", tokens[i], i, vocab_size));
  for (std::size_t i = 0; i < loss_mask.size(); ++i)
    if (loss_mask[i] > 1)
      throw InputError(path, fmt::format("loss mask byte {} at index {} is not 0 or 1", loss_mask[i], i));
  const std::string why = documents_mismatch(documents, tokens.size(), static_cast<uint64_t>(vocab_size),
                                             [&tokens](uint64_t i) { return tokens[i]; });
  if (!why.empty()) throw InputError(path + ": documents", why);

  TokenFileHeader h{};
  std::memcpy(h.magic, kTokenFileMagic, 8);
  h.version = kTokenFileVersion;
  h.token_bytes = static_cast<uint32_t>(dtype);
  h.num_tokens = tokens.size();
  h.vocab_size = static_cast<uint64_t>(vocab_size);
  h.flags = loss_mask.empty() ? 0u : kTokenFileFlagLossMask;
  if (documents.document_end) {
    h.flags |= kTokenFileFlagDocumentEnd;
    h.document_end = *documents.document_end;
  }
  if (documents.packed_seq_len > 0) {
    h.flags |= kTokenFileFlagPacked;
    h.packed_seq_len = static_cast<uint64_t>(documents.packed_seq_len);
  }

  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code made;
  fs::create_directories(dir, made);  // as the tools' output checks allow: a missing folder is created
  if (made) throw IoError(path, "cannot create the folder " + dir.string() + ": " + made.message());
  std::string tmp =
      (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  try {
    OutputFile out(tmp);
    out.write(&h, sizeof h);
    if (dtype == TokenDtype::kUint32) {
      out.write(tokens.data(), tokens.size() * 4);
    } else {
      std::vector<uint16_t> narrow;
      constexpr std::size_t kBlock = 1 << 16;
      for (std::size_t i = 0; i < tokens.size(); i += kBlock) {
        std::size_t m = std::min(kBlock, tokens.size() - i);
        narrow.resize(m);
        for (std::size_t k = 0; k < m; ++k) narrow[k] = static_cast<uint16_t>(tokens[i + k]);
        out.write(narrow.data(), m * 2);
      }
    }
    if (!loss_mask.empty()) out.write(loss_mask.data(), loss_mask.size());
    out.finish();
    publish_file(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace slidedp
