// Raw inputs -> token streams; see token_import.h. The .npy header is a Python dict literal
// ({'descr': '<i4', 'fortran_order': False, 'shape': (123,), }); a small recursive-descent parser reads
// exactly that grammar (strings, True/False/None, integers, tuples) and nothing more.
#include "io/token_import.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strict_json.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace slidedp {
namespace {

using nlohmann::json;

void push_token(TokenStream& out, int64_t id, uint8_t mask, int64_t vocab_size, const std::string& where) {
  if (id < 0) throw InputError(where, fmt::format("token id {} is negative", id));
  if (id >= vocab_size)
    throw InputError(where, fmt::format("token id {} is >= vocab_size {}", id, vocab_size));
  out.tokens.push_back(static_cast<uint32_t>(id));
  out.loss_mask.push_back(mask);
}

void end_document(TokenStream& out, std::optional<uint32_t> eos, int64_t vocab_size,
                  const std::string& where) {
  if (eos) push_token(out, *eos, 1, vocab_size, where + ": --eos-id");
  ++out.documents;
  out.document_ends.push_back(static_cast<int64_t>(out.tokens.size()));
  out.document_sources.push_back(where);
}

// A value of the Python literal subset numpy writes.
struct PyValue {
  enum Kind { kString, kBool, kNone, kInt, kTuple } kind = kNone;
  std::string text;
  bool flag = false;
  int64_t integer = 0;
  std::vector<PyValue> items;
};

class PyLiteralParser {
 public:
  PyLiteralParser(std::string_view s, std::string where) : s_(s), where_(std::move(where)) {}

  std::map<std::string, PyValue> dict() {
    expect('{');
    std::map<std::string, PyValue> d;
    while (true) {
      skip();
      if (peek() == '}') break;
      PyValue key = value();
      if (key.kind != PyValue::kString) fail("dict keys must be strings");
      expect(':');
      d[key.text] = value();
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    skip();
    if (i_ != s_.size()) fail("unexpected text after the dict");
    return d;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(where_, fmt::format("{} at header offset {}", what, i_));
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    skip();
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  PyValue value() {
    skip();
    PyValue v;
    char c = peek();
    if (c == '\'' || c == '"') {
      ++i_;
      v.kind = PyValue::kString;
      while (i_ < s_.size() && s_[i_] != c) v.text += s_[i_++];
      if (i_ >= s_.size()) fail("unterminated string");
      ++i_;
    } else if (c == '(') {
      ++i_;
      v.kind = PyValue::kTuple;
      while (true) {
        skip();
        if (peek() == ')') break;
        v.items.push_back(value());
        skip();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        if (peek() != ')') fail("expected ',' or ')' in a tuple");
      }
      ++i_;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::kInt;
      std::size_t start = i_;
      if (c == '-') ++i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      std::string digits(s_.substr(start, i_ - start));
      if (digits == "-" || digits.size() > 18) fail("bad integer");
      v.integer = std::stoll(digits);
      if (peek() == 'L') ++i_;  // Python 2 long suffix in old files
    } else if (word("True")) {
      v.kind = PyValue::kBool;
      v.flag = true;
    } else if (word("False")) {
      v.kind = PyValue::kBool;
    } else if (word("None")) {
      v.kind = PyValue::kNone;
    } else {
      fail("unexpected character");
    }
    return v;
  }

  std::string_view s_;
  std::string where_;
  std::size_t i_ = 0;
};

template <typename T>
void append_npy_values(TokenStream& out, const uint8_t* p, int64_t n, int64_t vocab_size,
                       const std::string& path) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    const int64_t id = static_cast<int64_t>(v);
    if (id < 0 || id >= vocab_size)
      push_token(out, id, 1, vocab_size, fmt::format("{}: element {}", path, i));
    out.tokens.push_back(static_cast<uint32_t>(id));
    out.loss_mask.push_back(1);
  }
}

}  // namespace

InputFormat input_format_for(const std::string& format_name, const std::string& path) {
  if (format_name == "text") return InputFormat::kText;
  if (format_name == "jsonl") return InputFormat::kJsonl;
  if (format_name == "npy") return InputFormat::kNpy;
  if (format_name != "auto")
    throw InputError("--input-format", fmt::format("'{}' is not one of auto, text, jsonl, npy", format_name));
  auto ends = [&](const char* ext) {
    std::size_t n = std::strlen(ext);
    return path.size() >= n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends(".jsonl") || ends(".json")) return InputFormat::kJsonl;
  if (ends(".npy")) return InputFormat::kNpy;
  return InputFormat::kText;
}

const char* input_format_name(InputFormat format) {
  switch (format) {
    case InputFormat::kText:
      return "text";
    case InputFormat::kJsonl:
      return "jsonl";
    case InputFormat::kNpy:
      return "npy";
  }
  return "?";
}

namespace {

// The 1-based line and column of byte `offset` in `text`.
std::string line_of(std::string_view text, size_t offset) {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  return fmt::format("line {}, byte {} of the line", line, offset - line_start + 1);
}

// Encodes one document with the model's tokenizer; `where` names the file (and line).
void append_encoded(TokenStream& out, std::string_view text, const std::string& where, int64_t vocab_size,
                    const TextEncoding& encoding, text::WordCache& cache) {
  if (const size_t bad = text::first_invalid_utf8(text); bad != std::string_view::npos)
    throw InputError(where, fmt::format("invalid UTF-8 at {}", line_of(text, bad)));
  const std::vector<int32_t> ids = encoding.tokenizer->encode(text, encoding.add_special_tokens, &cache);
  out.tokens.reserve(out.tokens.size() + ids.size());
  for (int32_t id : ids) push_token(out, id, 1, vocab_size, where);
}

}  // namespace

void append_text(TokenStream& out, std::string_view text, const std::string& path, int64_t vocab_size,
                 std::optional<uint32_t> eos, const TextEncoding& encoding) {
  if (text.empty()) throw InputError(path, "empty file");
  if (encoding.tokenizer) {
    text::WordCache cache;
    append_encoded(out, text, path, vocab_size, encoding, cache);
    end_document(out, eos, vocab_size, path);
    return;
  }
  if (vocab_size < 256)
    throw InputError(path, fmt::format("byte-level text needs vocab_size >= 256 (got {})", vocab_size));
  out.tokens.reserve(out.tokens.size() + text.size());
  out.loss_mask.reserve(out.loss_mask.size() + text.size());
  for (char c : text) {
    out.tokens.push_back(static_cast<unsigned char>(c));
    out.loss_mask.push_back(1);
  }
  end_document(out, eos, vocab_size, path);
}

void append_jsonl(TokenStream& out, std::string_view text, const std::string& path, int64_t vocab_size,
                  std::optional<uint32_t> eos, const TextEncoding& encoding) {
  if (text.empty()) throw InputError(path, "empty file");
  text::WordCache cache;
  int64_t line_no = 0;
  int64_t lines_read = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines separate nothing
    const std::string where = fmt::format("{}: line {}", path, line_no);
    const json j = parse_json_strict<json>(line, where);
    if (j.is_object() && j.contains("prompt") != j.contains("completion"))
      throw InputError(where, j.contains("prompt") ? "a prompt without completion (a pair needs both)"
                                                   : "a completion without prompt (a pair needs both)");
    if (j.is_object() && (j.contains("messages") || (j.contains("prompt") && j.contains("completion")))) {
      if (!encoding.chat)
        throw InputError(where, encoding.chat_unavailable.empty()
                                    ? std::string("a conversation needs the model's tokenizer and chat template (--tokenizer or --model DIR)")
                                    : "a conversation needs the model's chat template: " + encoding.chat_unavailable);
      // Parsed again keeping the keys' order: a template's tojson prints them as written.
      const text::ChatExample ex =
          encoding.chat->encode(parse_json_strict<nlohmann::ordered_json>(line, where), encoding.train_on_all, where, &cache);
      if (!encoding.train_on_all) out.has_mask = true;
      for (std::size_t k = 0; k < ex.ids.size(); ++k) push_token(out, ex.ids[k], ex.mask[k], vocab_size, where);
      end_document(out, eos, vocab_size, where);
      ++out.conversations;
      ++lines_read;
      continue;
    }
    const json* document = j.is_string() ? &j : j.is_object() && j.contains("text") ? &j["text"] : nullptr;
    if (document) {
      if (j.is_object() && j.size() != 1) throw InputError(where, "a text line is {\"text\": \"...\"} with no other key");
      if (!document->is_string()) throw InputError(where + ": text", "expected a string");
      if (!encoding.tokenizer)
        throw InputError(where, "a line of text needs the model's tokenizer (--tokenizer or --model DIR)");
      append_encoded(out, document->get_ref<const std::string&>(), where, vocab_size, encoding, cache);
      end_document(out, eos, vocab_size, where);
      ++lines_read;
      continue;
    }
    const json* ids = &j;
    const json* mask = nullptr;
    if (j.is_object()) {
      for (const auto& [k, _] : j.items())
        if (k != "input_ids" && k != "loss_mask")
          throw InputError(where,
                           fmt::format("unknown key '{}' (expected input_ids and optional loss_mask, or text)", k));
      if (!j.contains("input_ids")) throw InputError(where, "missing key 'input_ids'");
      ids = &j["input_ids"];
      if (j.contains("loss_mask")) mask = &j["loss_mask"];
    }
    if (!ids->is_array())
      throw InputError(
          where, "expected a list of token ids or an object {\"input_ids\": [...], \"loss_mask\": [...]}");
    if (mask != nullptr) {
      if (!mask->is_array() || mask->size() != ids->size())
        throw InputError(where + ": loss_mask",
                         fmt::format("expected a list of {} values (0/1)", ids->size()));
      if (!out.has_mask) out.has_mask = true;  // earlier documents keep their all-ones mask
    }
    for (std::size_t i = 0; i < ids->size(); ++i) {
      const json& v = (*ids)[i];
      const std::string at = fmt::format("{}: input_ids[{}]", where, i);
      if (!v.is_number_integer()) throw InputError(at, "expected an integer token id");
      uint8_t m = 1;
      if (mask != nullptr) {
        const json& mv = (*mask)[i];
        if (mv.is_boolean()) {
          m = mv.get<bool>() ? 1 : 0;
        } else if (mv.is_number_integer() && (mv.get<int64_t>() == 0 || mv.get<int64_t>() == 1)) {
          m = static_cast<uint8_t>(mv.get<int64_t>());
        } else {
          throw InputError(fmt::format("{}: loss_mask[{}]", where, i), "expected 0, 1, true or false");
        }
      }
      int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                       ? INT64_MAX
                       : v.get<int64_t>();
      push_token(out, id, m, vocab_size, at);
    }
    end_document(out, eos, vocab_size, where);
    ++lines_read;
  }
  if (lines_read == 0) throw InputError(path, "holds no JSON lines (only blank lines)");
}

NpyHeader parse_npy_header(std::span<const uint8_t> file, const std::string& path) {
  if (file.empty()) throw InputError(path, "empty file");
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (file.size() < 10 || std::memcmp(file.data(), kMagic, 6) != 0)
    throw InputError(path, "wrong magic: not a NumPy .npy file");
  const uint8_t major = file[6];
  std::size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = static_cast<std::size_t>(file[8]) | (static_cast<std::size_t>(file[9]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) throw IoError(path, "truncated .npy header");
    uint32_t n;
    std::memcpy(&n, file.data() + 8, 4);
    header_len = n;
    prefix = 12;
  } else {
    throw InputError(path, fmt::format(".npy format version {} is not supported (1, 2, 3)", major));
  }
  if (prefix + header_len > file.size())
    throw IoError(path, "truncated: the .npy header runs past the end of file");
  std::string_view text(reinterpret_cast<const char*>(file.data()) + prefix, header_len);
  auto dict = PyLiteralParser(text, path + ": .npy header").dict();
  NpyHeader h;
  h.data_offset = prefix + header_len;
  for (const auto& [k, v] : dict)
    if (k != "descr" && k != "fortran_order" && k != "shape")
      throw InputError(path + ": .npy header", fmt::format("unknown key '{}'", k));
  if (!dict.count("descr") || dict["descr"].kind != PyValue::kString)
    throw InputError(path + ": .npy header: descr",
                     "missing or not a string (structured arrays are not supported)");
  h.descr = dict["descr"].text;
  if (dict.count("fortran_order")) {
    if (dict["fortran_order"].kind != PyValue::kBool)
      throw InputError(path + ": .npy header: fortran_order", "expected True or False");
    h.fortran_order = dict["fortran_order"].flag;
  }
  if (!dict.count("shape") || dict["shape"].kind != PyValue::kTuple)
    throw InputError(path + ": .npy header: shape", "missing or not a tuple");
  for (const auto& d : dict["shape"].items) {
    if (d.kind != PyValue::kInt || d.integer < 0)
      throw InputError(path + ": .npy header: shape", "dimensions must be non-negative integers");
    h.shape.push_back(d.integer);
  }
  return h;
}

void append_npy(TokenStream& out, std::span<const uint8_t> file, const std::string& path, int64_t vocab_size,
                std::optional<uint32_t> eos) {
  NpyHeader h = parse_npy_header(file, path);
  if (h.shape.size() != 1)
    throw InputError(path + ": shape",
                     fmt::format("expected a 1-D array, got {} dimensions", h.shape.size()));
  const std::string& d = h.descr;
  std::size_t item = 0;
  if (d == "<i4" || d == "<u4")
    item = 4;
  else if (d == "<i8")
    item = 8;
  else if (d == "<u2")
    item = 2;
  else if (d.size() == 3 && d[0] == '>')
    throw InputError(
        path + ": descr",
        fmt::format("'{}' is big-endian; save it little-endian (arr.astype('<{}'))", d, d.substr(1)));
  else
    throw InputError(path + ": descr",
                     fmt::format("'{}' is not supported (int32 <i4, int64 <i8, uint16 <u2, uint32 <u4)", d));
  const int64_t n = h.shape[0];
  if (n == 0) throw InputError(path, "holds an empty array (no tokens)");
  const std::size_t available = file.size() - h.data_offset;
  if (static_cast<uint64_t>(n) > available / item)
    throw IoError(path, fmt::format("truncated: {} elements of {} bytes need {} bytes, {} follow the header",
                                    n, item, static_cast<uint64_t>(n) * item, available));
  if (static_cast<uint64_t>(n) * item != available)
    throw InputError(
        path, fmt::format("{} bytes after the array data", available - static_cast<uint64_t>(n) * item));
  const uint8_t* p = file.data() + h.data_offset;
  out.tokens.reserve(out.tokens.size() + static_cast<std::size_t>(n));
  if (d == "<i4")
    append_npy_values<int32_t>(out, p, n, vocab_size, path);
  else if (d == "<u4")
    append_npy_values<uint32_t>(out, p, n, vocab_size, path);
  else if (d == "<i8")
    append_npy_values<int64_t>(out, p, n, vocab_size, path);
  else
    append_npy_values<uint16_t>(out, p, n, vocab_size, path);
  end_document(out, eos, vocab_size, path);
}

}  // namespace slidedp
