#include "text/normalizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace slidedp::text {
namespace {

// Code points below U+0300 never change under NFC: they are NFC already and compose with nothing
// unless a combining mark (U+0300 or above) follows. Their UTF-8 lead bytes are below 0xCC.
bool below_combining_marks(std::string_view text) {
  for (unsigned char b : text)
    if (b >= 0xCC) return false;
  return true;
}

std::string unicode_normal_form(std::string_view text, utf8proc_option_t form) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(form | UTF8PROC_STABLE));
  if (n < 0) throw InputError("", fmt::format("Unicode normalization failed: {}", utf8proc_errmsg(n)));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

}  // namespace

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string_view::npos; at = hit + from.size()) {
    out.append(text.substr(at, hit - at));
    out.append(to);
  }
  out.append(text.substr(at));
  return out;
}

void Normalizer::read_step(const nlohmann::json& j, const std::string& origin, std::vector<Step>& steps) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw InputError(origin, "expected an object with a string 'type'");
  const std::string type = j["type"];
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      throw InputError(origin, "a Sequence needs the array 'normalizers'");
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      read_step(j["normalizers"][i], fmt::format("{}.normalizers[{}]", origin, i), steps);
  } else if (type == "NFC") {
    steps.push_back({Step::Kind::kNfc, "", "", nullptr});
  } else if (type == "NFD") {
    steps.push_back({Step::Kind::kNfd, "", "", nullptr});
  } else if (type == "NFKC") {
    steps.push_back({Step::Kind::kNfkc, "", "", nullptr});
  } else if (type == "NFKD") {
    steps.push_back({Step::Kind::kNfkd, "", "", nullptr});
  } else if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string()) throw InputError(origin, "Prepend needs the string 'prepend'");
    steps.push_back({Step::Kind::kPrepend, j["prepend"], "", nullptr});
  } else if (type == "Replace") {
    if (!j.contains("content") || !j["content"].is_string() || !j.contains("pattern") || !j["pattern"].is_object())
      throw InputError(origin, "Replace needs 'pattern' ({\"String\": ...} or {\"Regex\": ...}) and the string 'content'");
    const auto& pattern = j["pattern"];
    if (pattern.contains("String") && pattern["String"].is_string() && !pattern["String"].get<std::string>().empty()) {
      steps.push_back({Step::Kind::kReplaceString, pattern["String"], j["content"], nullptr});
    } else if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      steps.push_back({Step::Kind::kReplaceRegex, pattern["Regex"], j["content"],
                       std::make_shared<Regex>(pattern["Regex"].get<std::string>(), origin + ".pattern.Regex")});
    } else {
      throw InputError(origin + ".pattern", "expected {\"String\": non-empty} or {\"Regex\": ...}");
    }
  } else {
    throw InputError(origin, fmt::format("the normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, "
                                         "NFKD, Replace, Prepend)", type));
  }
}

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& origin) {
  Normalizer n;
  if (!j.is_null()) read_step(j, origin, n.steps_);
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kNfc:
        if (!below_combining_marks(s)) s = unicode_normal_form(s, UTF8PROC_COMPOSE);
        break;
      case Step::Kind::kNfd:
        s = unicode_normal_form(s, UTF8PROC_DECOMPOSE);
        break;
      case Step::Kind::kNfkc:
        s = unicode_normal_form(s, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
        break;
      case Step::Kind::kNfkd:
        s = unicode_normal_form(s, static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
        break;
      case Step::Kind::kPrepend:
        // `tokenizers` prepends only to non-empty text
        if (!s.empty()) s = step.pattern + s;
        break;
      case Step::Kind::kReplaceString:
        s = replace_all(s, step.pattern, step.content);
        break;
      case Step::Kind::kReplaceRegex: {
        std::vector<std::pair<size_t, size_t>> hits;
        step.regex->find_all(s, hits);
        std::string out;
        size_t at = 0;
        for (auto [b, e] : hits) {
          out.append(s, at, b - at);
          out.append(step.content);
          at = e;
        }
        out.append(s, at);
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

}  // namespace slidedp::text
