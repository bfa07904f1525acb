// Documents into training sequences at build time (slidedp-data build --document-end / --pack): every
// document ends with one end token that occurs nowhere inside a document, so that the executor's
// packed documents (io/sequence_sampler.h) restart attention, positions and recurrent state exactly at
// each document's start; with --pack T, whole documents go into bins of T tokens (best-fit decreasing:
// the longest first, each into the fullest bin it fits), so no document is cut by a sequence boundary.
// The held-out split (--eval-fraction) is by document as well.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "io/token_import.h"

namespace slidedp {

// What happens to a document longer than a packed sequence (its tokens plus the end token > T).
enum class LongDocuments { kDrop, kTruncate, kSplit };
LongDocuments long_documents_from_name(const std::string& name);  // "drop" | "truncate" | "split"
const char* long_documents_name(LongDocuments policy);

struct PackOptions {
  uint32_t document_end = 0;
  int64_t seq_len = 0;  // T; 0: documents only separated, not packed
  LongDocuments long_documents = LongDocuments::kDrop;
};

struct PackSummary {
  int64_t documents = 0;       // documents written (pieces of split ones counted once each)
  int64_t sequences = 0;       // packed sequences (bins) of T tokens
  int64_t ends_added = 0;      // end tokens appended to documents that did not end with one
  int64_t padding_tokens = 0;  // end tokens filling bins (no loss)
  int64_t dropped_documents = 0, dropped_tokens = 0;      // longer than T, left out
  int64_t truncated_documents = 0, truncated_tokens = 0;  // longer than T, cut (tokens cut off)
  int64_t split_documents = 0;                            // longer than T, cut into pieces
};

struct PackedTokens {
  TokenStream stream;  // tokens and loss mask (always present: added end tokens never count)
  PackSummary summary;
};

// Ends every document of `in` with options.document_end (appended, not counted in the loss, unless the
// document already ends with it) and, with seq_len > 0, packs them into bins. Throws InputError naming
// the document's file and line when the end token occurs inside a document, or when nothing is left.
PackedTokens pack_documents(const TokenStream& in, const PackOptions& options);

// Splits the documents of `in` into (train, held out): round(fraction x documents) of them, at least
// one, chosen by a seeded shuffle that is the same on every platform. Throws InputError when the
// fraction is outside (0, 1) or would leave either side without documents.
std::pair<TokenStream, TokenStream> split_documents(const TokenStream& in, double fraction, uint64_t seed);

}  // namespace slidedp
