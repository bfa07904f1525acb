#include "text/tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "common/strict_json.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace slidedp::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Words longer than this are encoded without caching (they are rarely repeated), as `tokenizers`.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCachedWords = 1 << 16;


// A token given in tokenizer_config.json as a string or as {"content": ...}.
std::optional<std::string> token_string(const json& j, const std::string& key, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  throw InputError(origin + ": " + key, "expected a string or {\"content\": string}");
}

std::optional<bool> optional_bool(const json& j, const std::string& key, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) throw InputError(origin + ": " + key, "expected true or false");
  return j[key].get<bool>();
}

TokenizerConfig read_tokenizer_config(const fs::path& dir) {
  TokenizerConfig config;
  const fs::path path = dir / "tokenizer_config.json";
  if (fs::exists(path)) {
    const std::string origin = path.string();
    const json j = parse_json_strict(read_text_file(path.string()), origin);
    if (!j.is_object()) throw InputError(origin, "expected a JSON object");
    config.bos_token = token_string(j, "bos_token", origin);
    config.eos_token = token_string(j, "eos_token", origin);
    config.pad_token = token_string(j, "pad_token", origin);
    config.add_bos_token = optional_bool(j, "add_bos_token", origin);
    config.add_eos_token = optional_bool(j, "add_eos_token", origin);
    if (j.contains("chat_template") && !j["chat_template"].is_null()) {
      const json& t = j["chat_template"];
      if (t.is_string()) {
        config.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const json& named : t)
          if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
              named["template"].is_string())
            config.chat_template = named["template"].get<std::string>();
        if (!config.chat_template) throw InputError(origin + ": chat_template", "a list of templates without a 'default' one");
      } else {
        throw InputError(origin + ": chat_template", "expected a string or a list of {name, template}");
      }
      config.chat_template_origin = origin + ": chat_template";
    }
  }
  // transformers prefers chat_template.jinja to the template inside tokenizer_config.json.
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    config.chat_template = read_text_file(jinja.string());
    config.chat_template_origin = jinja.string();
  }
  return config;
}

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw InputError(where, fmt::format("missing '{}'", key));
  return j[key];
}

// Converts a token string of the model's alphabet to raw bytes.
std::string model_bytes(const std::string& token, bool byte_level) {
  if (!byte_level) return token;
  if (auto bytes = byte_level_decode(token)) return *bytes;
  return token;  // outside the alphabet: plain text, as the byte-level decoder keeps it
}

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const size_t bad = first_invalid_utf8(bytes);
    if (bad == std::string_view::npos) {
      out.append(bytes);
      break;
    }
    out.append(bytes.substr(0, bad));
    // The maximal subpart: the lead byte and the continuation bytes that could still follow it.
    const auto lead = static_cast<uint8_t>(bytes[bad]);
    size_t skip = 1;
    const size_t need = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xF0 && lead <= 0xF4 ? 4 : 1;
    for (size_t k = 1; k < need && bad + k < bytes.size(); ++k) {
      const auto b = static_cast<uint8_t>(bytes[bad + k]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1 && lead == 0xE0) lo = 0xA0;
      if (k == 1 && lead == 0xED) hi = 0x9F;
      if (k == 1 && lead == 0xF0) lo = 0x90;
      if (k == 1 && lead == 0xF4) hi = 0x8F;
      if (b < lo || b > hi) break;
      skip = k + 1;
    }
    out.append("\xEF\xBF\xBD");
    bytes.remove_prefix(bad + skip);
  }
  return out;
}

}  // namespace

Tokenizer Tokenizer::load(const fs::path& path) {
  const bool is_dir = fs::is_directory(path);
  const fs::path file = is_dir ? path / "tokenizer.json" : path;
  if (!fs::exists(file))
    throw IoError(file.string(), "not found (the model folder needs its tokenizer.json, as Hugging Face saves it)");
  Tokenizer t;
  t.origin_ = file.string();
  const json j = parse_json_strict(read_text_file(file.string()), t.origin_);
  if (!j.is_object()) throw InputError(t.origin_, "expected a JSON object");
  t.config_ = read_tokenizer_config(is_dir ? path : file.parent_path());

  t.normalizer_ = Normalizer::from_json(j.value("normalizer", json()), t.origin_ + ": normalizer");
  t.pre_tokenizer_ = PreTokenizer::from_json(j.value("pre_tokenizer", json()), t.origin_ + ": pre_tokenizer");

  const std::string where = t.origin_ + ": model";
  const json& model = field(j, "model", t.origin_);
  const std::string type = model.value("type", "");
  if (type != "BPE")
    throw InputError(where + ".type", fmt::format("'{}' is not supported: SlideDP encodes BPE tokenizers (Qwen, "
                                                  "Llama 3, Gemma, Mistral); WordPiece, Unigram and WordLevel are not",
                                                  type));
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
    throw InputError(where + ".dropout", "BPE dropout is for training tokenizers; a fine-tuning tokenizer has none");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      throw InputError(where + "." + key, "is not supported (no released tokenizer of our families uses it)");
  BpeOptions options;
  options.byte_level = t.pre_tokenizer_.byte_level();
  options.byte_fallback = model.value("byte_fallback", false);
  options.ignore_merges = model.value("ignore_merges", false);
  options.fuse_unk = model.value("fuse_unk", false);

  const json& vocab_json = field(model, "vocab", where);
  if (!vocab_json.is_object()) throw InputError(where + ".vocab", "expected an object of token: id");
  VocabMap vocab;
  vocab.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (int64_t{1} << 31))
      throw InputError(where + ".vocab." + it.key(), "expected an id in [0, 2^31)");
    if (!vocab.emplace(model_bytes(it.key(), options.byte_level), it.value().get<int32_t>()).second)
      throw InputError(where + ".vocab." + it.key(), "two entries stand for the same bytes");
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto unk = vocab.find(model["unk_token"].get<std::string>());
    if (unk == vocab.end()) throw InputError(where + ".unk_token", "is not in the vocabulary");
    options.unk_id = unk->second;
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& merges_json = field(model, "merges", where);
  if (!merges_json.is_array()) throw InputError(where + ".merges", "expected an array");
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& m = merges_json[i];
    std::string a, b;
    if (m.is_string()) {  // "left right"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw InputError(fmt::format("{}.merges[{}]", where, i), "expected two tokens separated by one space");
      a = s.substr(0, space), b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      throw InputError(fmt::format("{}.merges[{}]", where, i), "expected \"left right\" or [left, right]");
    }
    merges.emplace_back(model_bytes(a, options.byte_level), model_bytes(b, options.byte_level));
  }
  t.model_.emplace(std::move(vocab), merges, options, where);
  t.vocab_size_ = t.model_->max_id() + 1;

  t.read_added_tokens(j.value("added_tokens", json::array()));
  t.read_post_processor(j.value("post_processor", json()));
  t.read_decoder(j.value("decoder", json()), t.origin_ + ": decoder");
  return t;
}

void Tokenizer::read_added_tokens(const json& j) {
  const std::string where = origin_ + ": added_tokens";
  if (!j.is_array()) throw InputError(where, "expected an array");
  std::vector<AddedToken> raw, normalized;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const json& e = j[i];
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
        !e["content"].is_string())
      throw InputError(at, "expected {\"id\": integer, \"content\": string, ...}");
    AddedToken token;
    const int64_t id = e["id"].get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 31)) throw InputError(at + ".id", "expected an id in [0, 2^31)");
    token.id = static_cast<int32_t>(id);
    token.content = e["content"];
    if (token.content.empty()) throw InputError(at + ".content", "an added token cannot be empty");
    token.special = e.value("special", false);
    token.lstrip = e.value("lstrip", false);
    token.rstrip = e.value("rstrip", false);
    token.normalized = e.value("normalized", !token.special);
    if (e.value("single_word", false))
      throw InputError(at + ".single_word", "single_word added tokens are not supported (no released tokenizer of our "
                                            "families uses them)");
    added_index_of_id_[token.id] = added_.size();
    added_.push_back(token);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{token.id} + 1);
    if (token.normalized) {
      AddedToken n = token;
      n.content = normalizer_.apply(token.content);
      normalized.push_back(std::move(n));
    } else {
      raw.push_back(token);
    }
  }
  raw_matcher_ = AddedTokenMatcher(std::move(raw));
  normalized_matcher_ = AddedTokenMatcher(std::move(normalized));
}

void Tokenizer::read_post_processor(const json& j) {
  const std::string where = origin_ + ": post_processor";
  auto special_id = [&](const std::string& content, const std::string& at) {
    auto id = token_id(content);
    if (!id) throw InputError(at, fmt::format("names '{}', which is not a token of this tokenizer", content));
    return *id;
  };
  if (!j.is_null()) {
    const std::string type = j.value("type", "");
    if (type == "TemplateProcessing") {
      const json& single = field(j, "single", where);
      bool after_sequence = false;
      for (size_t i = 0; single.is_array() && i < single.size(); ++i) {
        const json& item = single[i];
        const std::string at = fmt::format("{}.single[{}]", where, i);
        if (item.contains("Sequence")) {
          after_sequence = true;
        } else if (item.contains("SpecialToken")) {
          const std::string name = item["SpecialToken"].value("id", "");
          const json& tokens = field(j, "special_tokens", where);
          if (!tokens.contains(name)) throw InputError(at, fmt::format("special token '{}' missing from special_tokens", name));
          for (const json& id : field(tokens[name], "ids", at))
            (after_sequence ? suffix_ids_ : prefix_ids_).push_back(id.get<int32_t>());
        } else {
          throw InputError(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
      }
    } else if (type != "ByteLevel") {
      throw InputError(where + ".type", fmt::format("'{}' is not supported (supported: TemplateProcessing, ByteLevel)", type));
    }
  }
  // tokenizer_config.json's explicit add_bos_token / add_eos_token decide, as transformers' Llama and
  // Gemma tokenizers rebuild their post-processor from them.
  if (config_.add_bos_token) {
    prefix_ids_.clear();
    if (*config_.add_bos_token) {
      if (!config_.bos_token) throw InputError(origin_, "tokenizer_config.json sets add_bos_token without a bos_token");
      prefix_ids_.push_back(special_id(*config_.bos_token, "tokenizer_config.json: bos_token"));
    }
  }
  if (config_.add_eos_token) {
    suffix_ids_.clear();
    if (*config_.add_eos_token) {
      if (!config_.eos_token) throw InputError(origin_, "tokenizer_config.json sets add_eos_token without an eos_token");
      suffix_ids_.push_back(special_id(*config_.eos_token, "tokenizer_config.json: eos_token"));
    }
  }
}

void Tokenizer::read_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    const json& steps = field(j, "decoders", where);
    for (size_t i = 0; i < steps.size(); ++i) read_decoder(steps[i], fmt::format("{}.decoders[{}]", where, i));
  } else if (type == "ByteLevel") {
    if (!model_->options().byte_level)
      throw InputError(where, "a ByteLevel decoder needs a ByteLevel pre-tokenizer (the vocabulary's alphabet)");
    decoder_.byte_level = true;
  } else if (type == "Replace") {
    const json& pattern = field(j, "pattern", where);
    if (!pattern.contains("String") || !pattern["String"].is_string() || pattern["String"].get<std::string>().empty())
      throw InputError(where + ".pattern", "only {\"String\": non-empty} patterns are supported in decoders");
    decoder_.steps.push_back({DecoderStep::kReplace, pattern["String"], field(j, "content", where), 0, 0, 0});
  } else if (type == "ByteFallback") {
    decoder_.steps.push_back({DecoderStep::kByteFallback, "", "", 0, 0, 0});
  } else if (type == "Fuse") {
    decoder_.steps.push_back({DecoderStep::kFuse, "", "", 0, 0, 0});
  } else if (type == "Strip") {
    const std::string content = field(j, "content", where);
    size_t i = 0;
    if (content.empty()) throw InputError(where + ".content", "expected one character");
    const char32_t c = next_code_point(content, i);
    decoder_.steps.push_back({DecoderStep::kStrip, "", "", c, field(j, "start", where).get<size_t>(),
                              field(j, "stop", where).get<size_t>()});
  } else {
    throw InputError(where + ".type", fmt::format("'{}' is not supported (supported: Sequence, ByteLevel, Replace, "
                                                  "ByteFallback, Fuse, Strip)", type));
  }
}

std::optional<int32_t> Tokenizer::token_id(std::string_view content) const {
  for (const AddedToken& a : added_)
    if (a.content == content) return a.id;
  return model_->id_of(model_bytes(std::string(content), model_->options().byte_level));
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = added_index_of_id_.find(id);
  return it != added_index_of_id_.end() && added_[it->second].special;
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids, WordCache* cache) const {
  if (cache && word.size() <= kMaxCachedWordBytes) {
    if (auto it = cache->find(word); it != cache->end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
    const size_t before = ids.size();
    model_->encode_word(word, ids);
    if (cache->size() < kMaxCachedWords) cache->emplace(std::string(word), std::vector<int32_t>(ids.begin() + before, ids.end()));
    return;
  }
  model_->encode_word(word, ids);
}

void Tokenizer::encode_text(std::string_view piece, std::vector<int32_t>& ids, WordCache* cache) const {
  const std::string normalized = normalizer_.apply(piece);
  std::vector<TextPiece> pieces;
  if (normalized_matcher_.empty()) {
    pieces.push_back({normalized, -1});
  } else {
    normalized_matcher_.split(normalized, pieces);
  }
  std::vector<std::string> words;
  for (const TextPiece& p : pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    words.clear();
    pre_tokenizer_.split(p.text, words);
    for (const std::string& w : words) encode_word(w, ids, cache);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, WordCache* cache) const {
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos)
    throw InputError("", fmt::format("invalid UTF-8 at byte {}", bad));
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  std::vector<TextPiece> pieces;
  raw_matcher_.split(text, pieces);
  for (const TextPiece& p : pieces) {
    if (p.added_id >= 0) ids.push_back(p.added_id);
    else encode_text(p.text, ids, cache);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (auto it = added_index_of_id_.find(id); it != added_index_of_id_.end()) return added_[it->second].content;
  return model_->token_bytes(id);
}

std::string Tokenizer::token_surface(int32_t id) const {
  if (id < 0 || id >= vocab_size_) throw InputError("", fmt::format("token id {} is not in the vocabulary (size {})", id, vocab_size_));
  std::string t = token_text(id);
  if (decoder_.byte_level) return t;
  const bool added = added_index_of_id_.count(id) > 0;  // (the decoder replaces in added tokens too, as decode does)
  for (const Decoder::Step& step : decoder_.steps) {
    if (step.kind == DecoderStep::kReplace) t = replace_all(t, step.from, step.to);
    if (step.kind == DecoderStep::kByteFallback && !added) {
      const int byte = model_->byte_of_fallback_token(id);
      if (byte >= 0) t = std::string(1, static_cast<char>(byte));
    }
  }
  return t;
}

std::vector<std::string> Tokenizer::special_token_contents() const {
  std::vector<std::string> out;
  for (const AddedToken& t : added_)
    if (t.special) out.push_back(t.content);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  std::vector<int32_t> kept;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_ || (model_->token_bytes(id).empty() && !added_index_of_id_.count(id)))
      throw InputError("", fmt::format("token id {} is not in the vocabulary (size {})", id, vocab_size_));
    if (skip_special_tokens && is_special(id)) continue;
    tokens.push_back(token_text(id));
    kept.push_back(id);
  }
  if (decoder_.byte_level) {
    std::string bytes;
    for (const std::string& t : tokens) bytes += t;
    return utf8_lossy(bytes);
  }
  for (const Decoder::Step& step : decoder_.steps) {
    switch (step.kind) {
      case DecoderStep::kReplace:
        for (std::string& t : tokens) t = replace_all(t, step.from, step.to);
        break;
      case DecoderStep::kByteFallback: {
        // Runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one U+FFFD per token.
        std::vector<std::string> out;
        std::string run;
        size_t run_tokens = 0;
        auto flush = [&] {
          if (run_tokens == 0) return;
          if (first_invalid_utf8(run) == std::string_view::npos) {
            out.push_back(run);
          } else {
            for (size_t k = 0; k < run_tokens; ++k) out.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_tokens = 0;
        };
        for (size_t k = 0; k < tokens.size(); ++k) {
          const int byte = model_->byte_of_fallback_token(kept[k]);
          if (byte >= 0 && !added_index_of_id_.count(kept[k])) {
            run.push_back(static_cast<char>(byte));
            ++run_tokens;
          } else {
            flush();
            out.push_back(tokens[k]);
          }
        }
        flush();
        tokens = std::move(out);
        kept.assign(tokens.size(), -1);
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, all);
        kept.assign(1, -1);
        break;
      }
      case DecoderStep::kStrip:
        for (std::string& t : tokens) {
          std::string c;
          append_utf8(c, step.strip_char);
          for (size_t k = 0; k < step.strip_start && t.compare(0, c.size(), c) == 0; ++k) t.erase(0, c.size());
          for (size_t k = 0; k < step.strip_stop && t.size() >= c.size() && t.compare(t.size() - c.size(), c.size(), c) == 0; ++k)
            t.erase(t.size() - c.size());
        }
        break;
    }
  }
  std::string text;
  for (const std::string& t : tokens) text += t;
  return utf8_lossy(text);
}

}  // namespace slidedp::text
