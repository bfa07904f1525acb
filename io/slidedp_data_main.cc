// slidedp-data: builds SlideDP token files (docs/FORMATS.md) from raw text (byte-level tokenizer),
// JSON lines of token ids, or NumPy .npy arrays, and inspects existing ones. Every input is validated
// while it is read (ids below the vocabulary, well-formed lines), and the output appears atomically.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/cli_main.h"
#include "common/cli_parse.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/progress.h"
#include "io/default_corpus.h"
#include "io/document_packing.h"
#include "io/posix_file.h"
#include "io/sequence_sampler.h"
#include "io/token_dataset.h"
#include "io/token_import.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"

namespace slidedp {
namespace {

struct BuildArgs {
  std::vector<std::string> inputs;
  std::string out;
  std::string input_format = "auto";
  int64_t vocab_size = 0;
  std::string dtype = "auto";
  int64_t eos_id = -1;
  std::string tokenizer;  // model folder or tokenizer.json
  bool append_eos = false;
  bool no_special_tokens = false;
  bool train_on_all = false;
  bool embedded = false;
  bool json = false;
  std::string document_end;  // a token of the tokenizer or an id; empty: none (or chosen by --pack)
  int64_t pack = 0;          // sequence length to pack to; 0: no packing
  std::string long_documents = "drop";
  double eval_fraction = 0;
  std::string eval_out;
  uint64_t split_seed = 0;
};

struct InspectArgs {
  std::string path;
  int64_t seq_len = 0;
  int64_t head = 0;
  std::string tokenizer;
  bool decode = false;
  bool json = false;
};

// The token that ends every document: --document-end as an id or a token's text; else, when packing,
// the end the documents already carry (--append-eos, --eos-id) or the first of the tokenizer's EOS and
// pad tokens that no document holds inside.
std::optional<uint32_t> resolve_document_end(const BuildArgs& a, const text::Tokenizer* tokenizer,
                                             std::optional<uint32_t> eos, int64_t vocab,
                                             const TokenStream& stream) {
  if (!a.document_end.empty()) {
    int64_t id = -1;
    const auto [end, ec] =
        std::from_chars(a.document_end.data(), a.document_end.data() + a.document_end.size(), id);
    if (ec == std::errc() && end == a.document_end.data() + a.document_end.size()) {
      if (id < 0 || id >= vocab)
        throw InputError("--document-end", fmt::format("{} is outside the vocabulary [0, {})", id, vocab));
      return static_cast<uint32_t>(id);
    }
    if (!tokenizer)
      throw InputError("--document-end",
                       fmt::format("'{}' is not an id (a token's text needs --tokenizer)", a.document_end));
    const auto found = tokenizer->token_id(a.document_end);
    if (!found)
      throw InputError("--document-end",
                       fmt::format("'{}' is no token of {}", a.document_end, tokenizer->origin()));
    return static_cast<uint32_t>(*found);
  }
  if (a.pack == 0) return std::nullopt;
  if (eos) return eos;
  std::vector<std::string> tried;
  if (tokenizer)
    for (const auto& name : {tokenizer->config().eos_token, tokenizer->config().pad_token}) {
      const auto id = name ? tokenizer->token_id(*name) : std::nullopt;
      if (!id) continue;
      tried.push_back(fmt::format("{} ({})", *name, *id));
      bool inside = false;
      int64_t begin = 0;
      for (const int64_t end : stream.document_ends) {
        for (int64_t i = begin; i + 1 < end && !inside; ++i)
          inside = stream.tokens[static_cast<size_t>(i)] == static_cast<uint32_t>(*id);
        begin = end;
      }
      if (!inside) return static_cast<uint32_t>(*id);
    }
  throw InputError(
      "--pack", tried.empty() ? std::string("needs --document-end (the token that ends every document)")
                              : fmt::format("the tokenizer's {} occur inside documents; give --document-end "
                                            "(a token no document holds)",
                                            fmt::join(tried, " and ")));
}

struct WrittenFile {
  std::string path;
  TokenStream stream;
  PackSummary pack;
};

nlohmann::json pack_json(const PackSummary& p) {
  return {{"sequences", p.sequences},
          {"ends_added", p.ends_added},
          {"padding_tokens", p.padding_tokens},
          {"dropped_documents", p.dropped_documents},
          {"dropped_tokens", p.dropped_tokens},
          {"truncated_documents", p.truncated_documents},
          {"truncated_tokens", p.truncated_tokens},
          {"split_documents", p.split_documents}};
}

// The longest sequence slidedp-run trains (its --seq).
constexpr int64_t kMaxPackedSeqLen = int64_t{1} << 24;

// Every output is checked before anything is read: neither an input nor a folder, not over another.
void check_build_outputs(const BuildArgs& a) {
  if (a.inputs.empty() && !a.embedded)
    throw InputError("slidedp-data build", "give INPUT files or --embedded");
  check_output_file_target({"--out", a.out});
  std::vector<NamedPath> inputs;
  for (const auto& in : a.inputs) inputs.push_back({"INPUT", in});
  refuse_output_over_inputs({"--out", a.out}, inputs);
  refuse_output_in_checkpoints({"--out", a.out});
  if (!a.eval_out.empty() && !(a.eval_fraction > 0 && a.eval_fraction < 1))
    throw InputError(
        "--eval-fraction",
        fmt::format("{} is outside (0, 1) (--eval-out needs a fraction to hold out)", a.eval_fraction));
  if (a.eval_fraction != 0 && a.eval_out.empty())
    throw InputError("--eval-out",
                     "--eval-fraction F needs --eval-out FILE (the held-out documents are written there)");
  if (!a.eval_out.empty()) {
    check_output_file_target({"--eval-out", a.eval_out});
    inputs.push_back({"--out", a.out});
    refuse_output_over_inputs({"--eval-out", a.eval_out}, inputs);
    refuse_output_in_checkpoints({"--eval-out", a.eval_out});
  }
  if (a.pack < 0 || a.pack == 1 || a.pack > kMaxPackedSeqLen)
    throw InputError("--pack", fmt::format("{} is not a sequence length in [2, {}] (0: no packing)", a.pack,
                                           kMaxPackedSeqLen));
}

// The vocabulary every id must be below: --vocab-size, else the tokenizer's, else bytes for text.
int64_t build_vocab(const BuildArgs& a, const text::Tokenizer* tokenizer, bool any_ids) {
  int64_t vocab = a.vocab_size;
  if (tokenizer) {
    if (vocab == 0) vocab = tokenizer->vocab_size();
    if (vocab < tokenizer->vocab_size())
      throw InputError("--vocab-size", fmt::format("{} is below the tokenizer's {} ({})", vocab,
                                                   tokenizer->vocab_size(), tokenizer->origin()));
    any_ids = false;
  }
  if (vocab == 0) {
    if (any_ids)
      throw InputError("--vocab-size",
                       "is required for token ids in JSON lines or .npy (text and conversations take "
                       "theirs from the model's tokenizer: --tokenizer or --model DIR)");
    vocab = kByteVocabSize;
  }
  if (vocab < 0 || vocab > kMaxVocabSize)
    throw InputError("--vocab-size", fmt::format("{} is outside [1, 2^31]", vocab));
  return vocab;
}

// The token appended after every document: --append-eos's (the tokenizer's EOS) or --eos-id.
std::optional<uint32_t> build_eos(const BuildArgs& a, const text::Tokenizer* tokenizer, int64_t vocab) {
  if (a.append_eos) {
    if (!tokenizer) throw InputError("--append-eos", "needs --tokenizer (whose EOS it appends)");
    if (a.eos_id >= 0) throw InputError("--append-eos", "give either --append-eos or --eos-id");
    const auto& name = tokenizer->config().eos_token;
    const auto id = name ? tokenizer->token_id(*name) : std::nullopt;
    if (!id)
      throw InputError("--append-eos", fmt::format("{} names no EOS token (tokenizer_config.json: eos_token)",
                                                   tokenizer->origin()));
    return static_cast<uint32_t>(*id);
  }
  if (a.eos_id < 0) return std::nullopt;
  if (a.eos_id >= vocab) throw InputError("--eos-id", fmt::format("{} is >= vocab_size {}", a.eos_id, vocab));
  return static_cast<uint32_t>(a.eos_id);
}

TokenDtype build_dtype(const BuildArgs& a, int64_t vocab) {
  TokenDtype dtype = token_dtype_for_vocab(vocab);
  if (a.dtype == "uint16")
    dtype = TokenDtype::kUint16;
  else if (a.dtype == "uint32")
    dtype = TokenDtype::kUint32;
  else if (a.dtype != "auto")
    throw InputError("--dtype", fmt::format("'{}' is not one of auto, uint16, uint32", a.dtype));
  if (dtype == TokenDtype::kUint16 && vocab > 65536)
    throw InputError("--dtype", fmt::format("uint16 cannot hold ids of a vocabulary of {}", vocab));
  return dtype;
}

// Every input in order (the embedded corpus first when asked), as one stream of documents.
TokenStream read_inputs(const BuildArgs& a, const std::vector<InputFormat>& formats, int64_t vocab,
                        std::optional<uint32_t> eos, const TextEncoding& encoding) {
  TokenStream stream;
  Progress progress("slidedp-data", static_cast<double>(a.inputs.size()), "files",
                    !a.json && a.inputs.size() > 1);
  if (a.embedded) append_text(stream, default_corpus_text(), "<embedded tiny_corpus.txt>", vocab, eos, encoding);
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    const std::string& in = a.inputs[i];
    switch (formats[i]) {
      case InputFormat::kText:
        append_text(stream, read_text_file(in), in, vocab, eos, encoding);
        break;
      case InputFormat::kJsonl:
        append_jsonl(stream, read_text_file(in), in, vocab, eos, encoding);
        break;
      case InputFormat::kNpy: {
        MappedFile f(in);
        append_npy(stream, f.bytes(), in, vocab, eos);
        break;
      }
    }
    progress.update(static_cast<double>(i + 1), in);
  }
  if (stream.tokens.empty()) throw InputError("slidedp-data build", "the inputs hold no tokens");
  return stream;
}

// The files to write, fully built before the first is written (an error leaves no output behind):
// the stream, or its training and held-out documents, each ended (and packed) when a document end is set.
std::vector<WrittenFile> make_outputs(const BuildArgs& a, TokenStream stream,
                                      std::optional<uint32_t> document_end) {
  std::vector<WrittenFile> files;
  if (a.eval_fraction != 0) {
    auto [train, held] = split_documents(stream, a.eval_fraction, a.split_seed);
    files.push_back({a.out, std::move(train)});
    files.push_back({a.eval_out, std::move(held)});
  } else {
    files.push_back({a.out, std::move(stream)});
  }
  if (!document_end) return files;
  const LongDocuments long_documents = long_documents_from_name(a.long_documents);
  for (WrittenFile& f : files) {
    PackedTokens packed = pack_documents(f.stream, {*document_end, a.pack, long_documents});
    f.stream = std::move(packed.stream);
    f.pack = packed.summary;
  }
  return files;
}

// One file's summary line and what packing did to it.
void print_written(const WrittenFile& f, const nlohmann::json& j, int64_t pack) {
  std::printf(
      "wrote %s: %zu tokens in %lld documents, vocab %lld, %s, loss mask %s (%lld tokens count), %llu "
      "bytes\n",
      f.path.c_str(), f.stream.tokens.size(), static_cast<long long>(f.stream.documents),
      static_cast<long long>(j["vocab_size"].get<int64_t>()), j["dtype"].get<std::string>().c_str(),
      f.stream.has_mask ? "yes" : "no", static_cast<long long>(j["loss_tokens"].get<int64_t>()),
      static_cast<unsigned long long>(j["file_bytes"].get<uint64_t>()));
  if (!j.contains("document_end")) return;
  const PackSummary& p = f.pack;
  std::printf("  documents end with token %u (slidedp-run reads it from the file as --document-end)\n",
              j["document_end"].get<uint32_t>());
  if (pack > 0)
    std::printf(
        "  packed into %lld sequences of %lld tokens: %lld padding tokens (%.1f%%), %lld end tokens added\n",
        static_cast<long long>(p.sequences), static_cast<long long>(pack),
        static_cast<long long>(p.padding_tokens),
        100.0 * static_cast<double>(p.padding_tokens) / static_cast<double>(f.stream.tokens.size()),
        static_cast<long long>(p.ends_added));
  if (p.dropped_documents > 0)
    std::printf(
        "  dropped %lld documents longer than a sequence (%lld tokens; --long-documents truncate|split "
        "keeps them)\n",
        static_cast<long long>(p.dropped_documents), static_cast<long long>(p.dropped_tokens));
  if (p.truncated_documents > 0)
    std::printf("  truncated %lld documents (%lld tokens cut off)\n",
                static_cast<long long>(p.truncated_documents), static_cast<long long>(p.truncated_tokens));
  if (p.split_documents > 0)
    std::printf("  split %lld documents across sequences\n", static_cast<long long>(p.split_documents));
}

nlohmann::json written_json(const WrittenFile& f, int64_t vocab, TokenDtype dtype, int64_t pack,
                            std::optional<uint32_t> document_end) {
  const TokenStream& st = f.stream;
  int64_t counted = 0;
  for (uint8_t m : st.loss_mask) counted += m;
  nlohmann::json j = {{"out", f.path},
                      {"num_tokens", st.tokens.size()},
                      {"documents", st.documents},
                      {"vocab_size", vocab},
                      {"dtype", token_dtype_name(dtype)},
                      {"has_loss_mask", st.has_mask},
                      {"loss_tokens", counted},
                      {"file_bytes", std::filesystem::file_size(f.path)}};
  if (document_end) {
    j["document_end"] = *document_end;
    if (pack > 0) j["packed_seq_len"] = pack;
    j["packing"] = pack_json(f.pack);
  }
  return j;
}

int run_build(const BuildArgs& a) {
  check_build_outputs(a);
  std::vector<InputFormat> formats;
  bool any_ids = false;
  for (const auto& in : a.inputs) {
    formats.push_back(input_format_for(a.input_format, in));
    any_ids = any_ids || formats.back() != InputFormat::kText;
  }
  long_documents_from_name(a.long_documents);  // a bad name is refused before the inputs are read
  std::optional<text::Tokenizer> tokenizer;
  if (!a.tokenizer.empty()) tokenizer.emplace(text::Tokenizer::load(a.tokenizer));
  const text::Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  if (a.no_special_tokens && !tok) throw InputError("--no-special-tokens", "needs --tokenizer");
  if (a.train_on_all && !tok)
    throw InputError("--train-on-all", "needs --tokenizer (conversations use its chat template)");
  const int64_t vocab = build_vocab(a, tok, any_ids);
  const std::optional<uint32_t> eos = build_eos(a, tok, vocab);
  const TokenDtype dtype = build_dtype(a, vocab);

  TextEncoding encoding;
  encoding.tokenizer = tok;
  encoding.add_special_tokens = !a.no_special_tokens;
  encoding.train_on_all = a.train_on_all;
  // The chat template is compiled up front, but only conversations need it: text inputs build without one.
  std::optional<text::ChatEncoder> chat;
  if (tok) {
    try {
      chat.emplace(*tok);
      encoding.chat = &*chat;
    } catch (const InputError& e) {
      encoding.chat_unavailable = e.what();
    }
  }
  TokenStream stream = read_inputs(a, formats, vocab, eos, encoding);
  const std::optional<uint32_t> document_end = resolve_document_end(a, tok, eos, vocab, stream);
  const int64_t documents_read = stream.documents, conversations_read = stream.conversations;
  const std::vector<WrittenFile> files = make_outputs(a, std::move(stream), document_end);
  TokenFileDocuments layout;
  layout.document_end = document_end;
  if (document_end) layout.packed_seq_len = a.pack;
  for (const WrittenFile& f : files) {
    std::span<const uint8_t> mask;
    if (f.stream.has_mask) mask = f.stream.loss_mask;
    write_token_file(f.path, f.stream.tokens, mask, vocab, dtype, layout);
  }

  std::vector<nlohmann::json> written;
  for (const WrittenFile& f : files) written.push_back(written_json(f, vocab, dtype, a.pack, document_end));
  if (!a.json) {
    std::printf("read %lld documents (%lld conversations)\n", static_cast<long long>(documents_read),
                static_cast<long long>(conversations_read));
    for (size_t i = 0; i < files.size(); ++i) print_written(files[i], written[i], a.pack);
    return 0;
  }
  nlohmann::json j = written[0];
  if (written.size() > 1) j["eval"] = written[1];
  j["documents_read"] = documents_read;
  j["conversations"] = conversations_read;
  j["inputs"] = nlohmann::json::array();
  j["tokenizer"] = tok ? nlohmann::json(tok->origin()) : nlohmann::json();
  if (a.embedded) j["inputs"].push_back({{"path", "<embedded tiny_corpus.txt>"}, {"format", "text"}});
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    j["inputs"].push_back({{"path", a.inputs[i]}, {"format", input_format_name(formats[i])}});
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

int run_inspect(const InspectArgs& a) {
  if (a.decode && a.tokenizer.empty()) throw InputError("--decode", "needs --tokenizer (the model folder)");
  TokenDataset d = TokenDataset::open(a.path);
  std::optional<text::Tokenizer> tokenizer;
  if (!a.tokenizer.empty()) tokenizer.emplace(text::Tokenizer::load(a.tokenizer));
  const int64_t head_tokens = a.decode && a.head == 0 ? 64 : a.head;
  int64_t counted = 0;
  for (int64_t i = 0; i < d.num_tokens(); ++i) counted += d.counts_in_loss(i) ? 1 : 0;
  int64_t sequences = a.seq_len > 0 && d.num_tokens() > a.seq_len ? (d.num_tokens() - 1) / a.seq_len : 0;
  std::vector<uint32_t> head;
  for (int64_t i = 0; i < std::min(head_tokens, d.num_tokens()); ++i) head.push_back(d.token(i));
  std::optional<std::string> decoded;
  if (a.decode) {
    const std::vector<int32_t> ids(head.begin(), head.end());
    decoded = tokenizer->decode(ids);
  }
  if (a.json) {
    nlohmann::json j = {{"path", a.path},
                        {"num_tokens", d.num_tokens()},
                        {"vocab_size", d.vocab_size()},
                        {"dtype", token_dtype_name(d.dtype())},
                        {"has_loss_mask", d.has_loss_mask()},
                        {"loss_tokens", counted},
                        {"head", head}};
    if (decoded) j["decoded"] = *decoded;
    const TokenFileDocuments& docs = d.documents();
    if (docs.document_end) j["document_end"] = *docs.document_end;
    if (docs.packed_seq_len > 0) j["packed_seq_len"] = docs.packed_seq_len;
    if (a.seq_len > 0) {
      j["seq_len"] = a.seq_len;
      j["sequences"] = sequences;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s: %lld tokens, vocab %lld, %s, loss mask %s (%lld tokens count)\n", a.path.c_str(),
                static_cast<long long>(d.num_tokens()), static_cast<long long>(d.vocab_size()),
                token_dtype_name(d.dtype()), d.has_loss_mask() ? "yes" : "no",
                static_cast<long long>(counted));
    const TokenFileDocuments& docs = d.documents();
    if (docs.document_end) std::printf("  documents end with token %u\n", *docs.document_end);
    if (docs.packed_seq_len > 0)
      std::printf("  packed: sequences of %lld tokens hold whole documents\n",
                  static_cast<long long>(docs.packed_seq_len));
    if (a.seq_len > 0)
      std::printf("  %lld sequences of %lld tokens (+1 shifted target)\n", static_cast<long long>(sequences),
                  static_cast<long long>(a.seq_len));
    if (!head.empty()) std::printf("  head: %s\n", fmt::format("{}", fmt::join(head, " ")).c_str());
    if (decoded) std::printf("  decoded: %s\n", nlohmann::json(*decoded).dump().c_str());
  }
  return 0;
}

int main_body(int argc, char** argv) {
  CLI::App app{
      "slidedp-data: build and inspect SlideDP token files (format: docs/FORMATS.md).\n"
      "Exit codes: 0 ok, 2 bad input or usage, 4 I/O error."};
  app.require_subcommand(1);

  BuildArgs b;
  CLI::App* build = app.add_subcommand(
      "build",
      "Tokenize or convert INPUT files (concatenated in order) into one token file.\n"
      "  text : one document per file, through the model's tokenizer (--tokenizer), else one token per byte (vocab 256)\n"
      "  jsonl: one document per line, [id, ...] or {\"input_ids\": [...], \"loss_mask\": [0/1, ...]},\n"
      "         or text (\"...\" or {\"text\": \"...\"}) through the model's tokenizer, or a conversation\n"
      "         ({\"messages\": [{\"role\": ..., \"content\": ...}, ...]} or {\"prompt\": ..., \"completion\": ...})\n"
      "         through the model's chat template, the loss on the assistant's turns (--train-on-all: on all)\n"
      "  npy  : a 1-D NumPy array of int32, int64, uint16 or uint32 ids");
  build->add_option("inputs", b.inputs, "Input files (text, .jsonl or .npy)");
  build->add_option("--out,-o", b.out, "Token file to write (replaced atomically)")->required();
  build->add_option("--input-format", b.input_format,
                    "auto (by extension: .jsonl/.json -> jsonl, .npy -> npy, else text), text, jsonl or npy");
  build->add_option(
      "--vocab-size", b.vocab_size,
      "Vocabulary size; every id must be below it. Default 256 for text, required for jsonl/npy");
  build->add_option("--dtype", b.dtype,
                    "Token width: auto (uint16 when vocab <= 65536, else uint32), uint16, uint32");
  build->add_option("--eos-id", b.eos_id,
                    "Append this token id after every document (text file, JSON line, array)");
  build->add_option("--tokenizer,--model", b.tokenizer,
                    "The model's tokenizer: a Hugging Face model folder (tokenizer.json, tokenizer_config.json) or a "
                    "tokenizer.json; vocab size and special tokens come from it");
  build->add_flag("--append-eos", b.append_eos,
                  "Append the tokenizer's EOS token (tokenizer_config.json: eos_token) after every document");
  build->add_flag("--train-on-all", b.train_on_all,
                  "Conversations: the loss on every token, not only the assistant's turns (the default, as TRL's "
                  "assistant-only loss and torchtune's train_on_input=False)");
  build->add_flag("--no-special-tokens", b.no_special_tokens,
                  "Do not add the tokenizer's post-processor tokens (e.g. Gemma's BOS) around each document");
  build->add_flag("--embedded", b.embedded,
                  "Also include the embedded default corpus (byte-level text) first");
  build->add_option(
      "--document-end", b.document_end,
      "End every document with this token (its text, e.g. \"<|endoftext|>\", or an id) unless it "
      "already ends with it; the file records it and slidedp-run restarts attention, positions and "
      "state after it. The token must occur inside no document");
  build->add_option(
      "--pack", b.pack,
      "Pack whole documents into sequences of this many tokens (slidedp-run --seq-len), best-fit "
      "decreasing, padding with the document end (no loss); implies a document end (default: "
      "--append-eos/--eos-id's, else the tokenizer's EOS or pad token that no document holds)");
  build->add_option("--long-documents", b.long_documents,
                    "With --pack, a document longer than a sequence: drop (default, counted in the summary), "
                    "truncate, or split across sequences");
  build->add_option(
      "--eval-fraction", b.eval_fraction,
      "Hold out this fraction of the documents (0 < F < 1, chosen by --split-seed) into --eval-out, "
      "for slidedp-run --eval-data");
  build->add_option("--eval-out", b.eval_out, "Token file for the held-out documents of --eval-fraction");
  build->add_option("--split-seed", b.split_seed, "Seed of the held-out documents' choice (default 0)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "'" + v + "' is not an integer in [0, 10^19)";
          },
          "UINT"));
  build->add_flag("--json", b.json, "Print the summary as JSON on stdout");

  InspectArgs ins;
  CLI::App* inspect = app.add_subcommand("inspect", "Validate a token file and print its header and counts");
  inspect->add_option("path", ins.path, "Token file")->required();
  inspect->add_option("--seq-len", ins.seq_len,
                      "Also report how many packed sequences of this length it makes");
  inspect->add_option("--head", ins.head, "Print the first N token ids");
  inspect->add_option("--tokenizer,--model", ins.tokenizer, "The model folder whose tokenizer --decode uses");
  inspect->add_flag("--decode", ins.decode, "Also print the first --head tokens (default 64) as text");
  inspect->add_flag("--json", ins.json, "Print the summary as JSON on stdout");

  if (const std::optional<int> done = parse_command_line(app, argc, argv)) return *done;
  if (*build && build->count("--document-end") && b.document_end.empty())
    throw InputError("--document-end", "is empty (give a token's text or an id)");
  if (*build) return run_build(b);
  return run_inspect(ins);
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  return slidedp::run_cli("slidedp-data", [&] { return slidedp::main_body(argc, argv); });
}
