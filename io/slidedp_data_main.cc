// slidedp-data: builds SlideDP token files (docs/FORMATS.md) from raw text (byte-level tokenizer),
// JSON lines of token ids, or NumPy .npy arrays, and inspects existing ones. Every input is validated
// while it is read (ids below the vocabulary, well-formed lines), and the output appears atomically.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/cli_main.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/progress.h"
#include "io/default_corpus.h"
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
};

struct InspectArgs {
  std::string path;
  int64_t seq_len = 0;
  int64_t head = 0;
  std::string tokenizer;
  bool decode = false;
  bool json = false;
};

int run_build(const BuildArgs& a) {
  if (a.inputs.empty() && !a.embedded)
    throw InputError("slidedp-data build", "give INPUT files or --embedded");
  // The output is replaced at the end: it must be neither an input nor a folder, checked before reading.
  check_output_file_target({"--out", a.out});
  std::vector<NamedPath> inputs;
  for (const auto& in : a.inputs) inputs.push_back({"INPUT", in});
  refuse_output_over_inputs({"--out", a.out}, inputs);
  refuse_output_in_checkpoints({"--out", a.out});
  std::vector<InputFormat> formats;
  bool any_ids = false;
  for (const auto& in : a.inputs) {
    formats.push_back(input_format_for(a.input_format, in));
    any_ids = any_ids || formats.back() != InputFormat::kText;
  }
  std::optional<text::Tokenizer> tokenizer;
  if (!a.tokenizer.empty()) tokenizer.emplace(text::Tokenizer::load(a.tokenizer));
  if (a.append_eos && !tokenizer) throw InputError("--append-eos", "needs --tokenizer (whose EOS it appends)");
  if (a.no_special_tokens && !tokenizer) throw InputError("--no-special-tokens", "needs --tokenizer");
  int64_t vocab = a.vocab_size;
  if (tokenizer) {
    if (vocab == 0) vocab = tokenizer->vocab_size();
    if (vocab < tokenizer->vocab_size())
      throw InputError("--vocab-size", fmt::format("{} is below the tokenizer's {} ({})", vocab, tokenizer->vocab_size(),
                                                   tokenizer->origin()));
    any_ids = false;
  }
  if (vocab == 0) {
    if (any_ids) throw InputError("--vocab-size", "is required for token ids (jsonl, npy inputs)");
    vocab = kByteVocabSize;
  }
  if (vocab < 0 || vocab > kMaxVocabSize)
    throw InputError("--vocab-size", fmt::format("{} is outside [1, 2^31]", vocab));
  std::optional<uint32_t> eos;
  if (a.append_eos) {
    if (a.eos_id >= 0) throw InputError("--append-eos", "give either --append-eos or --eos-id");
    const auto& name = tokenizer->config().eos_token;
    const auto id = name ? tokenizer->token_id(*name) : std::nullopt;
    if (!id) throw InputError("--append-eos", fmt::format("{} names no EOS token (tokenizer_config.json: eos_token)",
                                                          tokenizer->origin()));
    eos = static_cast<uint32_t>(*id);
  }
  if (a.eos_id >= 0) {
    if (a.eos_id >= vocab)
      throw InputError("--eos-id", fmt::format("{} is >= vocab_size {}", a.eos_id, vocab));
    eos = static_cast<uint32_t>(a.eos_id);
  }
  TokenDtype dtype = token_dtype_for_vocab(vocab);
  if (a.dtype == "uint16")
    dtype = TokenDtype::kUint16;
  else if (a.dtype == "uint32")
    dtype = TokenDtype::kUint32;
  else if (a.dtype != "auto")
    throw InputError("--dtype", fmt::format("'{}' is not one of auto, uint16, uint32", a.dtype));
  if (dtype == TokenDtype::kUint16 && vocab > 65536)
    throw InputError("--dtype", fmt::format("uint16 cannot hold ids of a vocabulary of {}", vocab));

  if (a.train_on_all && !tokenizer) throw InputError("--train-on-all", "needs --tokenizer (conversations use its chat template)");
  TextEncoding encoding;
  encoding.tokenizer = tokenizer ? &*tokenizer : nullptr;
  encoding.add_special_tokens = !a.no_special_tokens;
  encoding.train_on_all = a.train_on_all;
  // The chat template is compiled up front, but only conversations need it: text inputs build without one.
  std::optional<text::ChatEncoder> chat;
  if (tokenizer) {
    try {
      chat.emplace(*tokenizer);
      encoding.chat = &*chat;
    } catch (const InputError& e) {
      encoding.chat_unavailable = e.what();
    }
  }
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
  std::span<const uint8_t> mask;
  if (stream.has_mask) mask = stream.loss_mask;
  write_token_file(a.out, stream.tokens, mask, vocab, dtype);

  int64_t counted = 0;
  for (uint8_t m : stream.loss_mask) counted += m;
  const auto file_bytes = std::filesystem::file_size(a.out);
  if (a.json) {
    nlohmann::json j = {
        {"out", a.out},           {"num_tokens", stream.tokens.size()}, {"documents", stream.documents},
        {"conversations", stream.conversations},
        {"vocab_size", vocab},    {"dtype", token_dtype_name(dtype)},   {"has_loss_mask", stream.has_mask},
        {"loss_tokens", counted}, {"file_bytes", file_bytes},           {"inputs", nlohmann::json::array()},
        {"tokenizer", tokenizer ? nlohmann::json(tokenizer->origin()) : nlohmann::json()}};
    if (a.embedded) j["inputs"].push_back({{"path", "<embedded tiny_corpus.txt>"}, {"format", "text"}});
    for (std::size_t i = 0; i < a.inputs.size(); ++i)
      j["inputs"].push_back({{"path", a.inputs[i]}, {"format", input_format_name(formats[i])}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "wrote %s: %zu tokens in %lld documents (%lld conversations), vocab %lld, %s, loss mask %s (%lld tokens count), %llu "
        "bytes\n",
        a.out.c_str(), stream.tokens.size(), static_cast<long long>(stream.documents), static_cast<long long>(stream.conversations),
        static_cast<long long>(vocab), token_dtype_name(dtype), stream.has_mask ? "yes" : "no",
        static_cast<long long>(counted), static_cast<unsigned long long>(file_bytes));
  }
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help (rc 0) or the usage error
    return rc == 0 ? 0 : static_cast<int>(ErrorKind::kInput);
  }
  if (*build) return run_build(b);
  return run_inspect(ins);
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  return slidedp::run_cli("slidedp-data", [&] { return slidedp::main_body(argc, argv); });
}
