#include "text/pre_tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace slidedp::text {
namespace {

// The split regex ByteLevel applies when `use_regex` is true (GPT-2's).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool is_match;
};

// The spans of `piece` between and at the matches, as `tokenizers`' Pattern::find_matches gives them.
std::vector<Span> match_spans(const std::vector<std::pair<size_t, size_t>>& matches, size_t size) {
  std::vector<Span> spans;
  if (size == 0) return {{0, 0, false}};
  size_t previous = 0;
  for (auto [b, e] : matches) {
    if (b != previous) spans.push_back({previous, b, false});
    spans.push_back({b, e, true});
    previous = e;
  }
  if (previous != size) spans.push_back({previous, size, false});
  return spans;
}

}  // namespace

void PreTokenizer::read_step(const nlohmann::json& j, const std::string& origin, PreTokenizer& into) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw InputError(origin, "expected an object with a string 'type'");
  const std::string type = j["type"];
  auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_boolean()) throw InputError(origin + "." + key, "expected true or false");
    return j[key].get<bool>();
  };
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      throw InputError(origin, "a Sequence needs the array 'pretokenizers'");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      read_step(j["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", origin, i), into);
    return;
  }
  Step step;
  if (type == "Split") {
    const std::string behavior = j.value("behavior", "");
    static const std::pair<const char*, Behavior> kBehaviors[] = {
        {"Removed", Behavior::kRemoved}, {"Isolated", Behavior::kIsolated},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious}, {"MergedWithNext", Behavior::kMergedWithNext},
        {"Contiguous", Behavior::kContiguous}};
    bool known = false;
    for (auto [name, value] : kBehaviors)
      if (behavior == name) step.behavior = value, known = true;
    if (!known)
      throw InputError(origin + ".behavior", fmt::format("'{}' is not a delimiter behaviour (Removed, Isolated, "
                                                         "MergedWithPrevious, MergedWithNext, Contiguous)", behavior));
    step.invert = flag("invert", false);
    const auto& pattern = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.kind = Step::Kind::kSplitRegex;
      step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), origin + ".pattern.Regex");
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
               !pattern["String"].get<std::string>().empty()) {
      step.kind = Step::Kind::kSplitString;
      step.literal = pattern["String"];
    } else {
      throw InputError(origin + ".pattern", "expected {\"Regex\": ...} or {\"String\": non-empty}");
    }
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space = flag("add_prefix_space", true);
    if (flag("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, origin);
    into.byte_level_ = true;
  } else {
    throw InputError(origin, fmt::format("the pre-tokenizer type '{}' is not supported (supported: Sequence, Split, "
                                         "ByteLevel)", type));
  }
  into.steps_.push_back(std::move(step));
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& origin) {
  PreTokenizer p;
  if (!j.is_null()) read_step(j, origin, p);
  return p;
}

void PreTokenizer::apply(const Step& step, std::string_view piece, std::vector<std::string>& out) {
  std::string prefixed;
  if (step.kind == Step::Kind::kByteLevel) {
    if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
      prefixed = " " + std::string(piece);
      piece = prefixed;
    }
    if (!step.regex) {
      out.emplace_back(piece);
      return;
    }
  }
  std::vector<std::pair<size_t, size_t>> matches;
  if (step.kind == Step::Kind::kSplitString) {
    for (size_t at = 0, hit; (hit = piece.find(step.literal, at)) != std::string_view::npos; at = hit + step.literal.size())
      matches.emplace_back(hit, hit + step.literal.size());
  } else {
    step.regex->find_all(piece, matches);
  }
  std::vector<Span> spans = match_spans(matches, piece.size());
  if (step.invert)
    for (Span& s : spans) s.is_match = !s.is_match;
  // The five behaviours, as `tokenizers`' NormalizedString::split folds them.
  std::vector<Span> kept;
  bool previous_match = false;
  switch (step.kind == Step::Kind::kByteLevel ? Behavior::kIsolated : step.behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) kept.push_back({s.begin, s.end, false});
      break;
    case Behavior::kRemoved:
      kept = spans;
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty()) kept.back().end = s.end;
        else kept.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) kept.back().end = s.end;
        else kept.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) kept.back().begin = it->begin;
        else kept.push_back({it->begin, it->end, false});
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Span& s : kept)
    if (!s.is_match && s.end > s.begin) out.emplace_back(piece.substr(s.begin, s.end - s.begin));
}

void PreTokenizer::split(std::string_view piece, std::vector<std::string>& words) const {
  std::vector<std::string> current{std::string(piece)}, next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& p : current) apply(step, p, next);
    current.swap(next);
  }
  for (std::string& w : current) words.push_back(std::move(w));
}

}  // namespace slidedp::text
