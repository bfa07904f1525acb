// The default training text compiled into the binary (io/data/tiny_corpus.txt, public-domain English
// prose), so `slidedp-run` without --data trains on something real and the same everywhere. Tokenized
// with the byte-level tokenizer: token = byte value, vocabulary 256 (the slidedp-tiny preset's).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "io/token_dataset.h"

namespace slidedp {

inline constexpr int64_t kByteVocabSize = 256;

// The embedded text, exactly as in io/data/tiny_corpus.txt.
std::string_view default_corpus_text();

// Byte-level tokenizer: one token per byte, id = the byte's unsigned value.
std::vector<uint32_t> byte_tokenize(std::string_view text);

// The embedded text as an in-memory dataset (vocab 256, no loss mask), named "<embedded tiny_corpus.txt>".
TokenDataset default_corpus_dataset();

}  // namespace slidedp
