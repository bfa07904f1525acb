// Token datasets: the pre-tokenized training data format (docs/FORMATS.md, "Token files").
// A 64-byte little-endian header (magic "SDPTOKNS", version, token width, token count, vocab size,
// flags, reserved zeros), the tokens (uint16 or uint32), then an optional loss mask of one byte per
// token. The reader memory-maps the file and validates all of it up front (sizes, every token id
// below the vocabulary, mask bytes 0/1), so training never meets a bad token mid-run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace slidedp {

inline constexpr char kTokenFileMagic[8] = {'S', 'D', 'P', 'T', 'O', 'K', 'N', 'S'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 64;
inline constexpr uint32_t kTokenFileFlagLossMask = 1u;  // flags bit 0: a loss mask follows the tokens
// flags bit 1: the documents end with the token id at offset 36 (u32): slidedp-run's --document-end.
inline constexpr uint32_t kTokenFileFlagDocumentEnd = 2u;
// flags bit 2 (with bit 1): packed by slidedp-data build --pack T: every T tokens hold whole documents,
// each bin ending with the document end, plus one trailing end token (u64 T at offset 40).
inline constexpr uint32_t kTokenFileFlagPacked = 4u;

// What a token file says about its documents (both optional).
struct TokenFileDocuments {
  std::optional<uint32_t> document_end;  // the id ending every document
  int64_t packed_seq_len = 0;            // > 0: packed into sequences of this many tokens
};

enum class TokenDtype : uint32_t { kUint16 = 2, kUint32 = 4 };  // value = bytes per token
const char* token_dtype_name(TokenDtype dtype);                 // "uint16" | "uint32"
// The narrowest dtype that holds ids below `vocab_size`.
TokenDtype token_dtype_for_vocab(int64_t vocab_size);
// Largest vocabulary a token file may declare: ids must fit the int32 the model's inputs use.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 31;

// An immutable token sequence with an optional loss mask. Cheap to copy (shared storage); every
// accessor is thread-safe.
class TokenDataset {
 public:
  // Maps and validates a token file. Throws IoError (missing, truncated) or InputError (wrong magic,
  // version, flags, token id >= vocab, mask byte not 0/1), each naming the file.
  static TokenDataset open(const std::string& path);
  // The same, the file read into memory: for a small file that may be rewritten while it is in use
  // (a held-out set regenerated during a run), which would break a mapping (SIGBUS on truncation).
  static TokenDataset read(const std::string& path);
  // An in-memory dataset (the embedded corpus, tests); validated like a file. `loss_mask` is empty
  // (every target counts) or one 0/1 byte per token.
  static TokenDataset from_tokens(std::string name, std::vector<uint32_t> tokens,
                                  std::vector<uint8_t> loss_mask, int64_t vocab_size);

  const std::string& name() const;  // the file path, or the name given to from_tokens
  int64_t num_tokens() const;
  int64_t vocab_size() const;
  bool has_loss_mask() const;
  TokenDtype dtype() const;  // the file's token width (uint32 for in-memory datasets)
  const TokenFileDocuments& documents() const;  // none for in-memory datasets and older files

  uint32_t token(int64_t i) const;
  // True when the token at `i` counts as a training target (always true without a mask).
  bool counts_in_loss(int64_t i) const;

 private:
  struct Storage;
  // Checks `bytes` (the file's, held by `s`) and points the dataset into them.
  static TokenDataset validated(std::shared_ptr<Storage> s, std::span<const uint8_t> bytes);
  std::shared_ptr<const Storage> s_;
};

// Writes a token file atomically (temp file, fsync, rename). `loss_mask` empty or one byte per token.
// Throws InputError when a token id >= vocab_size or the dtype cannot hold the vocabulary, or when
// `documents` does not describe the tokens (a packed bin not ending with the document end).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens,
                      std::span<const uint8_t> loss_mask, int64_t vocab_size, TokenDtype dtype,
                      const TokenFileDocuments& documents = {});

}  // namespace slidedp
