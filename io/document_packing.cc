// Ending, packing and splitting documents; see document_packing.h.
#include "io/document_packing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "common/error.h"
#include "common/hash.h"

namespace slidedp {
namespace {

struct DocumentView {
  int64_t index = 0;  // in the input stream
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

std::vector<DocumentView> documents_of(const TokenStream& in) {
  std::vector<DocumentView> docs;
  int64_t begin = 0;
  for (std::size_t d = 0; d < in.document_ends.size(); ++d) {
    docs.push_back({static_cast<int64_t>(d), begin, in.document_ends[d]});
    begin = in.document_ends[d];
  }
  return docs;
}

const std::string& source_of(const TokenStream& in, int64_t d) {
  return in.document_sources[static_cast<size_t>(d)];
}

// A document as written: its tokens (the end token it already carries, if any, stays counted as the
// input says) and whether an end token must follow.
struct Piece {
  int64_t document = 0;  // the input document it comes from
  int64_t begin = 0, end = 0;
  bool add_end = false;
  int64_t written() const { return end - begin + (add_end ? 1 : 0); }
};

void write_piece(const TokenStream& in, const Piece& p, uint32_t end_id, TokenStream& out) {
  out.tokens.insert(out.tokens.end(), in.tokens.begin() + p.begin, in.tokens.begin() + p.end);
  out.loss_mask.insert(out.loss_mask.end(), in.loss_mask.begin() + p.begin, in.loss_mask.begin() + p.end);
  if (p.add_end) {
    out.tokens.push_back(end_id);
    out.loss_mask.push_back(0);
  }
}

// The pieces a document becomes in bins of T tokens (each piece plus its end token fits in T).
std::vector<Piece> pieces_of(const TokenStream& in, const DocumentView& d, const PackOptions& o,
                             PackSummary& s) {
  const bool ends = in.tokens[static_cast<size_t>(d.end - 1)] == o.document_end;
  const int64_t body = ends ? d.size() - 1 : d.size();  // tokens before the end token
  if (o.seq_len == 0 || body + 1 <= o.seq_len) return {Piece{d.index, d.begin, d.end, !ends}};
  switch (o.long_documents) {
    case LongDocuments::kDrop:
      ++s.dropped_documents;
      s.dropped_tokens += d.size();
      return {};
    case LongDocuments::kTruncate:
      ++s.truncated_documents;
      s.truncated_tokens += body - (o.seq_len - 1);
      return {Piece{d.index, d.begin, d.begin + o.seq_len - 1, true}};
    case LongDocuments::kSplit: {
      ++s.split_documents;
      std::vector<Piece> pieces;
      for (int64_t b = 0; b < body; b += o.seq_len - 1)
        pieces.push_back(Piece{d.index, d.begin + b, d.begin + std::min(body, b + o.seq_len - 1), true});
      return pieces;
    }
  }
  return {};
}

void refuse_end_inside(const TokenStream& in, const DocumentView& d, uint32_t end_id) {
  for (int64_t i = d.begin; i + 1 < d.end; ++i)
    if (in.tokens[static_cast<size_t>(i)] == end_id)
      throw InputError(
          source_of(in, d.index) + ": --document-end",
          fmt::format("the document end token {} occurs inside this document (token {} of {}): the run "
                      "would start a new document there; choose a token the documents do not use",
                      end_id, i - d.begin, d.size()));
}

}  // namespace

LongDocuments long_documents_from_name(const std::string& name) {
  if (name == "drop") return LongDocuments::kDrop;
  if (name == "truncate") return LongDocuments::kTruncate;
  if (name == "split") return LongDocuments::kSplit;
  throw InputError("--long-documents", fmt::format("'{}' is not one of drop, truncate, split", name));
}

const char* long_documents_name(LongDocuments policy) {
  switch (policy) {
    case LongDocuments::kDrop:
      return "drop";
    case LongDocuments::kTruncate:
      return "truncate";
    case LongDocuments::kSplit:
      return "split";
  }
  return "?";
}

PackedTokens pack_documents(const TokenStream& in, const PackOptions& o) {
  if (o.seq_len < 0 || o.seq_len == 1)
    throw InputError("--pack", fmt::format("{} is not a sequence length of at least 2", o.seq_len));
  PackedTokens r;
  TokenStream& out = r.stream;
  PackSummary& s = r.summary;
  out.has_mask = true;
  std::vector<Piece> pieces;
  for (const DocumentView& d : documents_of(in)) {
    if (d.size() == 0) continue;
    refuse_end_inside(in, d, o.document_end);
    for (const Piece& p : pieces_of(in, d, o, s)) pieces.push_back(p);
  }
  if (pieces.empty() && o.seq_len == 0) throw InputError("--document-end", "no document holds a token");
  if (pieces.empty())
    throw InputError("--pack",
                     fmt::format("no document fits a sequence of {} tokens (with its end token): nothing "
                                 "to write ({} dropped; --long-documents truncate or split keeps them)",
                                 o.seq_len, s.dropped_documents));
  for (const Piece& p : pieces) s.ends_added += p.add_end ? 1 : 0;
  s.documents = static_cast<int64_t>(pieces.size());
  auto finish_document = [&](const Piece& p) {
    out.document_ends.push_back(static_cast<int64_t>(out.tokens.size()));
    out.document_sources.push_back(source_of(in, p.document));
    ++out.documents;
  };
  if (o.seq_len == 0) {
    for (const Piece& p : pieces) {
      write_piece(in, p, o.document_end, out);
      finish_document(p);
    }
    return r;
  }
  // Best-fit decreasing: the longest piece first (ties in input order), each into the bin with the
  // least room that still holds it, else a new bin.
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pieces[a].written() > pieces[b].written(); });
  std::vector<std::vector<size_t>> bins;
  std::multimap<int64_t, size_t> room;  // room left -> bin
  for (size_t i : order) {
    const int64_t need = pieces[i].written();
    auto it = room.lower_bound(need);
    size_t bin = bins.size();
    int64_t left = o.seq_len;
    if (it != room.end()) {
      bin = it->second;
      left = it->first;
      room.erase(it);
    } else {
      bins.emplace_back();
    }
    bins[bin].push_back(i);
    room.emplace(left - need, bin);
  }
  for (const auto& bin : bins) {
    const size_t start = out.tokens.size();
    for (size_t i : bin) {
      write_piece(in, pieces[i], o.document_end, out);
      finish_document(pieces[i]);
    }
    const int64_t pad = o.seq_len - static_cast<int64_t>(out.tokens.size() - start);
    out.tokens.insert(out.tokens.end(), static_cast<size_t>(pad), o.document_end);
    out.loss_mask.insert(out.loss_mask.end(), static_cast<size_t>(pad), uint8_t{0});
    s.padding_tokens += pad;
  }
  // One more end token: the last sequence's last target (ignored, as it follows an end token).
  out.tokens.push_back(o.document_end);
  out.loss_mask.push_back(0);
  s.padding_tokens += 1;
  s.sequences = static_cast<int64_t>(bins.size());
  return r;
}

std::pair<TokenStream, TokenStream> split_documents(const TokenStream& in, double fraction, uint64_t seed) {
  if (!(fraction > 0 && fraction < 1))
    throw InputError("--eval-fraction", fmt::format("{} is outside (0, 1)", fraction));
  std::vector<DocumentView> docs;  // the documents that hold a token: an empty one is no document to hold out
  for (const DocumentView& d : documents_of(in))
    if (d.size() > 0) docs.push_back(d);
  const int64_t n = static_cast<int64_t>(docs.size());
  const int64_t held = std::max<int64_t>(1, std::llround(fraction * static_cast<double>(n)));
  if (held >= n)
    throw InputError("--eval-fraction",
                     fmt::format("{} of {} documents leaves none to train on", fraction, n));
  // Fisher-Yates with splitmix64 draws: the same choice on every platform.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  uint64_t state = splitmix64(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    state = splitmix64(state);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(state % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<bool> is_held(static_cast<size_t>(n), false);  // by position in `docs`
  for (int64_t k = 0; k < held; ++k) is_held[static_cast<size_t>(perm[static_cast<size_t>(k)])] = true;
  std::pair<TokenStream, TokenStream> r;
  for (size_t i = 0; i < docs.size(); ++i) {
    const DocumentView& d = docs[i];
    TokenStream& out = is_held[i] ? r.second : r.first;
    out.tokens.insert(out.tokens.end(), in.tokens.begin() + d.begin, in.tokens.begin() + d.end);
    out.loss_mask.insert(out.loss_mask.end(), in.loss_mask.begin() + d.begin, in.loss_mask.begin() + d.end);
    out.document_ends.push_back(static_cast<int64_t>(out.tokens.size()));
    out.document_sources.push_back(source_of(in, d.index));
    ++out.documents;
  }
  for (TokenStream* out : {&r.first, &r.second}) out->has_mask = in.has_mask;
  return r;
}

}  // namespace slidedp
