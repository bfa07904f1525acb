// Turning raw inputs into token streams for slidedp-data: text through the model's tokenizer (or the
// byte-level one without a model), already tokenized ids in JSON lines (a list of ints per line, or
// {"input_ids": [...], "loss_mask": [...]}), text in JSON lines ("..." or {"text": "..."}, with a
// tokenizer), conversations in JSON lines (with the model's chat template), and 1-D NumPy .npy arrays (int32/int64/uint16/uint32; the header is parsed
// here, no NumPy needed). Every id is checked against the vocabulary as it is read; errors name the
// file and, for JSON lines, the line number.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slidedp {
namespace text {
class Tokenizer;
class ChatEncoder;
}

// How text becomes ids: the model's tokenizer, or none (byte-level for text files; JSON-lines text refused).
struct TextEncoding {
  const text::Tokenizer* tokenizer = nullptr;
  bool add_special_tokens = true;  // the tokenizer's post-processor tokens (e.g. BOS) around each document
  // Conversations (JSON lines {"messages": ...} or {"prompt": ..., "completion": ...}) through the model's
  // chat template, the loss on the assistant's turns (text/chat_encoding.h), or on every token.
  const text::ChatEncoder* chat = nullptr;
  std::string chat_unavailable;  // why there is no `chat` (no template, one we cannot render): named on use
  bool train_on_all = false;
};

struct TokenStream {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> loss_mask;  // one 0/1 byte per token, kept in step with tokens
  bool has_mask = false;           // some input carried an explicit loss mask
  int64_t documents = 0;           // text files, JSON lines or arrays appended
  int64_t conversations = 0;       // of them, conversations rendered with the chat template
  // Document d is tokens [document_ends[d - 1], document_ends[d]) (from 0 for d = 0); its file (and line).
  std::vector<int64_t> document_ends;
  std::vector<std::string> document_sources;
};

enum class InputFormat { kText, kJsonl, kNpy };
// "text" | "jsonl" | "npy"; "auto" picks by extension (.jsonl/.json -> jsonl, .npy -> npy, else text).
InputFormat input_format_for(const std::string& format_name, const std::string& path);
const char* input_format_name(InputFormat format);

// Each appends one or more documents; `eos` (when set) is appended after every document, counted in
// the loss. Throws InputError naming `path` (and the line) on bad input.
void append_text(TokenStream& out, std::string_view text, const std::string& path, int64_t vocab_size,
                 std::optional<uint32_t> eos, const TextEncoding& encoding = {});
void append_jsonl(TokenStream& out, std::string_view text, const std::string& path, int64_t vocab_size,
                  std::optional<uint32_t> eos, const TextEncoding& encoding = {});
void append_npy(TokenStream& out, std::span<const uint8_t> file, const std::string& path, int64_t vocab_size,
                std::optional<uint32_t> eos);

// The .npy header, parsed (exposed for tests).
struct NpyHeader {
  std::string descr;  // e.g. "<i4"
  bool fortran_order = false;
  std::vector<int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the array data
};
NpyHeader parse_npy_header(std::span<const uint8_t> file, const std::string& path);

}  // namespace slidedp
