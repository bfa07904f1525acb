// Documents into sequences (io/document_packing.h, slidedp-data build --document-end / --pack /
// --eval-fraction) against naive references written here: every document comes out whole, exactly
// once, inside one sequence, followed by the end token; what the sampler then feeds the model (each
// row's document positions) equals the positions of the input documents counted one by one; the
// held-out split is a partition of the documents of the size asked; the file records the end token
// (slidedp-run taking it from there: tests/tools/cli_test.cc).
#include "io/document_packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "io/sequence_sampler.h"
#include "io/token_dataset.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

using testing::TempDir;
constexpr uint32_t kEnd = 1;  // the document end of these tests; documents use ids 2..

// `lengths` documents of distinct content (document d is d+2 repeated, so each is recognisable), its
// mask alternating so that the mask is checked to travel with the tokens.
TokenStream make_stream(const std::vector<int64_t>& lengths, bool with_end = false) {
  TokenStream s;
  for (size_t d = 0; d < lengths.size(); ++d) {
    for (int64_t i = 0; i < lengths[d]; ++i) {
      const bool last = with_end && i + 1 == lengths[d];
      s.tokens.push_back(last ? kEnd : static_cast<uint32_t>(d + 2));
      s.loss_mask.push_back(static_cast<uint8_t>((i + d) % 2));
    }
    s.document_ends.push_back(static_cast<int64_t>(s.tokens.size()));
    s.document_sources.push_back("doc" + std::to_string(d));
    ++s.documents;
  }
  s.has_mask = true;
  return s;
}

std::vector<int64_t> random_lengths(int n, int64_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_len)));
  return v;
}

// The documents of a packed stream read back naively: split at every end token, empty pieces (padding)
// skipped. Maps a document's content id to (tokens before its end, their mask).
std::map<uint32_t, std::pair<std::vector<uint32_t>, std::vector<uint8_t>>> read_back(const TokenStream& s) {
  std::map<uint32_t, std::pair<std::vector<uint32_t>, std::vector<uint8_t>>> docs;
  std::vector<uint32_t> cur;
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.tokens[i] == kEnd) {
      if (!cur.empty()) {
        EXPECT_EQ(docs.count(cur[0]), 0u) << "document " << cur[0] - 2 << " written twice";
        docs[cur[0]] = {cur, mask};
      }
      cur.clear();
      mask.clear();
      continue;
    }
    cur.push_back(s.tokens[i]);
    mask.push_back(s.loss_mask[i]);
  }
  EXPECT_TRUE(cur.empty()) << "the stream does not end with the end token";
  return docs;
}

TEST(DocumentPacking, EveryDocumentLandsWholeInOneSequence) {
  const int64_t T = 64;
  const std::vector<int64_t> lengths = random_lengths(300, T - 1, 7);  // all fit (with their end)
  const TokenStream in = make_stream(lengths);
  const PackedTokens p = pack_documents(in, {kEnd, T, LongDocuments::kDrop});
  const TokenStream& out = p.stream;
  ASSERT_EQ(static_cast<int64_t>(out.tokens.size()), p.summary.sequences * T + 1);
  // Every sequence ends with the end token, so no document crosses a boundary.
  for (int64_t k = 1; k <= p.summary.sequences; ++k)
    EXPECT_EQ(out.tokens[static_cast<size_t>(k * T - 1)], kEnd);
  const auto docs = read_back(out);
  ASSERT_EQ(docs.size(), lengths.size());
  for (size_t d = 0; d < lengths.size(); ++d) {
    const auto& [tokens, mask] = docs.at(static_cast<uint32_t>(d + 2));
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), lengths[d]) << "document " << d;
    for (size_t i = 0; i < mask.size(); ++i)
      EXPECT_EQ(mask[i], (i + d) % 2) << "document " << d << " token " << i;
  }
  // Padding and the added end tokens never count in the loss.
  for (size_t i = 0; i < out.tokens.size(); ++i)
    if (out.tokens[i] == kEnd) {
      EXPECT_EQ(out.loss_mask[i], 0) << i;
    }
  int64_t written = 0;
  for (int64_t l : lengths) written += l + 1;
  EXPECT_EQ(p.summary.padding_tokens, p.summary.sequences * T + 1 - written);
  EXPECT_EQ(p.summary.ends_added, static_cast<int64_t>(lengths.size()));
  // Best-fit decreasing is within 11/9 OPT + 1 bins (Johnson); OPT >= ceil(written / T).
  const int64_t lower = (written + T - 1) / T;
  EXPECT_LE(p.summary.sequences, 11 * lower / 9 + 1);
}

// What the model sees: with the file's document end, each row's positions restart at every document
// and run 0..len-1 through it (never cut), as the input documents counted one by one say.
TEST(DocumentPacking, TheSamplerSeesWholeDocumentsFromPositionZero) {
  const int64_t T = 32;
  const std::vector<int64_t> lengths = random_lengths(120, T - 1, 11);
  const PackedTokens p = pack_documents(make_stream(lengths), {kEnd, T, LongDocuments::kDrop});
  TempDir dir;
  write_token_file(dir / "p.tok", p.stream.tokens, p.stream.loss_mask, 200, TokenDtype::kUint16, {kEnd, T});
  const TokenDataset data = TokenDataset::open(dir / "p.tok");
  ASSERT_EQ(data.documents().document_end, kEnd);
  ASSERT_EQ(data.documents().packed_seq_len, T);
  const SequenceSampler sampler(data, T, 1, 3, static_cast<int32_t>(kEnd));
  ASSERT_EQ(sampler.num_sequences(), p.summary.sequences);
  std::map<uint32_t, int64_t> seen_length;
  for (int64_t step = 0; step < sampler.num_sequences(); ++step) {
    const MicroBatch mb = sampler.micro_batch(step, 0, 0, 1, 1);
    for (int64_t t = 0; t < T; ++t) {
      const uint32_t id = static_cast<uint32_t>(mb.inputs[static_cast<size_t>(t)]);
      if (id == kEnd) continue;
      // Document id-2's token at position p: positions count from its first token.
      const int32_t pos = mb.positions[static_cast<size_t>(t)];
      EXPECT_EQ(pos, seen_length.count(id) ? seen_length[id] : 0) << "document " << id - 2;
      seen_length[id] = pos + 1;
    }
  }
  for (size_t d = 0; d < lengths.size(); ++d)
    EXPECT_EQ(seen_length[static_cast<uint32_t>(d + 2)], lengths[d]) << d;
}

TEST(DocumentPacking, LongDocumentsAreDroppedTruncatedOrSplitAsAsked) {
  const int64_t T = 10;
  const std::vector<int64_t> lengths = {5, 25, 9, 10};  // 25 and 10 do not fit with their end token
  const TokenStream in = make_stream(lengths);
  const PackedTokens drop = pack_documents(in, {kEnd, T, LongDocuments::kDrop});
  EXPECT_EQ(drop.summary.dropped_documents, 2);
  EXPECT_EQ(drop.summary.dropped_tokens, 35);
  EXPECT_EQ(read_back(drop.stream).size(), 2u);

  const PackedTokens cut = pack_documents(in, {kEnd, T, LongDocuments::kTruncate});
  EXPECT_EQ(cut.summary.truncated_documents, 2);
  EXPECT_EQ(cut.summary.truncated_tokens, (25 - 9) + (10 - 9));
  EXPECT_EQ(read_back(cut.stream).at(3).first.size(), 9u);

  const PackedTokens split = pack_documents(in, {kEnd, T, LongDocuments::kSplit});
  EXPECT_EQ(split.summary.split_documents, 2);
  int64_t tokens_of_doc1 = 0;
  for (uint32_t t : split.stream.tokens) tokens_of_doc1 += t == 3 ? 1 : 0;
  EXPECT_EQ(tokens_of_doc1, 25);  // nothing lost, in pieces of at most T - 1
  EXPECT_EQ(split.summary.documents, 1 + 3 + 1 + 2);

  // A document that already ends with the end token fits at exactly T and gets no second one.
  const PackedTokens exact =
      pack_documents(make_stream({10}, /*with_end=*/true), {kEnd, T, LongDocuments::kDrop});
  EXPECT_EQ(exact.summary.ends_added, 0);
  EXPECT_EQ(exact.summary.sequences, 1);
  EXPECT_EQ(exact.stream.loss_mask[9], 1);  // the document's own end keeps its mask
}

TEST(DocumentPacking, AnEndTokenInsideADocumentIsRefusedNamingIt) {
  TokenStream in = make_stream({4, 6});
  in.tokens[6] = kEnd;  // inside the second document
  try {
    pack_documents(in, {kEnd, 16, LongDocuments::kDrop});
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("doc1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--document-end"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pack_documents(make_stream({30}), {kEnd, 8, LongDocuments::kDrop}),
               InputError);  // nothing fits
}

TEST(DocumentPacking, TheHeldOutSplitIsAPartitionOfTheSizeAsked) {
  const TokenStream in = make_stream(random_lengths(200, 20, 5));
  const auto [train, held] = split_documents(in, 0.1, 42);
  EXPECT_EQ(held.documents, 20);
  EXPECT_EQ(train.documents, 180);
  const auto a = read_back(pack_documents(train, {kEnd, 0, LongDocuments::kDrop}).stream);
  const auto b = read_back(pack_documents(held, {kEnd, 0, LongDocuments::kDrop}).stream);
  for (const auto& [id, doc] : b) EXPECT_EQ(a.count(id), 0u) << "document " << id - 2 << " on both sides";
  EXPECT_EQ(a.size() + b.size(), 200u);
  // The same seed chooses the same documents; another seed others.
  EXPECT_EQ(split_documents(in, 0.1, 42).second.tokens, held.tokens);
  EXPECT_NE(split_documents(in, 0.1, 43).second.tokens, held.tokens);
  EXPECT_THROW(split_documents(in, 1.0, 0), InputError);
  // Empty documents are no documents to hold out: neither side is left without a token.
  const auto [rest, one] = split_documents(make_stream({0, 3, 0, 2}), 0.5, 1);
  EXPECT_EQ(rest.documents, 1);
  EXPECT_EQ(one.documents, 1);
  EXPECT_EQ(rest.tokens.size() + one.tokens.size(), 5u);
  EXPECT_THROW(split_documents(make_stream({3}), 0.5, 0), InputError);
}

TEST(DocumentPacking, ATokenFileThatLiesAboutItsPackingIsRefused) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {5, 6, kEnd, 7, 8, kEnd, kEnd};  // 2 sequences of 3 + 1
  write_token_file(dir / "ok.tok", tokens, {}, 10, TokenDtype::kUint16, {kEnd, 3});
  EXPECT_EQ(TokenDataset::open(dir / "ok.tok").documents().packed_seq_len, 3);
  EXPECT_THROW(write_token_file(dir / "bad.tok", tokens, {}, 10, TokenDtype::kUint16, {kEnd, 2}), InputError);
  // The same file with its header changed after writing: the reader checks the bins itself.
  std::string bytes = testing::read_bytes(dir / "ok.tok");
  bytes[40] = 2;  // packed_seq_len
  testing::write_bytes(dir / "lying.tok", bytes);
  try {
    TokenDataset::open(dir / "lying.tok");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("lying.tok: documents"), std::string::npos) << e.what();
  }
  bytes = testing::read_bytes(dir / "ok.tok");
  bytes[36] = 9;  // document_end, a token the bins do not end with
  testing::write_bytes(dir / "lying2.tok", bytes);
  EXPECT_THROW(TokenDataset::open(dir / "lying2.tok"), InputError);
}

}  // namespace
}  // namespace slidedp
