#include "text/chat_encoding.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "common/error.h"
#include "text/jinja_builtins.h"
#include "text/utf8.h"

namespace slidedp::text {
namespace {

using json = nlohmann::ordered_json;

std::string template_source(const Tokenizer& t) {
  if (!t.config().chat_template)
    throw InputError(t.origin(), "the tokenizer has no chat template (tokenizer_config.json: chat_template, or "
                                 "chat_template.jinja beside it): conversations need one");
  return *t.config().chat_template;
}

jinja::Template compile(const std::string& source, const std::string& origin) {
  // The rendered text goes to the tokenizer, which reads UTF-8 only: a template that is not is named here.
  if (const size_t bad = first_invalid_utf8(source); bad != std::string::npos)
    throw InputError(origin, fmt::format("the chat template is not valid UTF-8 (byte {})", bad));
  try {
    return jinja::Template(source);
  } catch (const InputError& e) {
    throw InputError(origin, e.what());
  }
}

// The conversation's messages, checked: objects with a string role and a content.
json messages_of(const json& line, const std::string& where) {
  json messages = json::array();
  auto add = [&](const json& m, const std::string& at) {
    if (!m.is_object()) throw InputError(at, "expected a message object {\"role\": ..., \"content\": ...}");
    if (!m.contains("role") || !m["role"].is_string()) throw InputError(at + ".role", "expected a string");
    // The roles the released templates of our families know; another would be rendered by a template
    // that does not check (Llama 3's prints any header) and train on a turn the model never sees.
    static const std::set<std::string> kRoles = {"system", "developer", "user",    "assistant",
                                                 "tool",   "ipython",   "function"};
    if (!kRoles.count(m["role"].get<std::string>()))
      throw InputError(at + ".role",
                       fmt::format("unknown role '{}' (one of system, developer, user, assistant, tool, "
                                   "ipython, function)",
                                   m["role"].get<std::string>()));
    if (!m.contains("content") && !m.contains("tool_calls")) throw InputError(at + ".content", "missing");
    if (m.contains("tool_calls") && !m["tool_calls"].is_array())
      throw InputError(at + ".tool_calls", "expected a list");
    if (m.contains("content")) {
      const json& c = m["content"];
      if (!(c.is_string() || c.is_array() || (c.is_null() && m.contains("tool_calls"))))
        throw InputError(
            at + ".content",
            fmt::format("expected a string or a list of parts, got {} (null only beside tool_calls)",
                        c.type_name()));
    }
    messages.push_back(m);
  };
  if (line.contains("messages")) {
    const json& ms = line["messages"];
    if (!ms.is_array() || ms.empty()) throw InputError(where + ": messages", "expected a non-empty list of messages");
    for (std::size_t i = 0; i < ms.size(); ++i) add(ms[i], fmt::format("{}: messages[{}]", where, i));
    return messages;
  }
  for (const char* part : {"prompt", "completion"}) {
    const json& p = line[part];
    const std::string at = fmt::format("{}: {}", where, part);
    if (p.is_string()) {
      add(json{{"role", std::string(part) == "prompt" ? "user" : "assistant"}, {"content", p}}, at);
    } else if (p.is_array()) {
      for (std::size_t i = 0; i < p.size(); ++i) add(p[i], fmt::format("{}[{}]", at, i));
    } else {
      throw InputError(at, "expected a string or a list of messages");
    }
  }
  return messages;
}

// Python's str.strip() of whitespace (what a template's trim does).
std::string py_strip(const std::string& s) {
  jinja::Args none;
  return jinja::apply_filter("trim", jinja::Value::string(s), none, "").s;
}

}  // namespace

ChatEncoder::ChatEncoder(const Tokenizer& tokenizer)
    : ChatEncoder(tokenizer, template_source(tokenizer), tokenizer.config().chat_template_origin) {}

ChatEncoder::ChatEncoder(const Tokenizer& tokenizer, const std::string& source, const std::string& origin)
    : tokenizer_(tokenizer), origin_(origin), template_(compile(source, origin)) {
  turn_ends_ = tokenizer.special_token_contents();
  std::sort(turn_ends_.begin(), turn_ends_.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

bool ChatEncoder::is_conversation(const json& line) {
  return line.is_object() && (line.contains("messages") || (line.contains("prompt") && line.contains("completion")));
}

// Where each assistant turn lies in `text`, the template's output for `variables`: the conversation
// is rendered again with that message's content replaced by a sentinel; the turn starts where the two
// renderings part (the sentinel's place, or earlier where the template printed something else for
// this content, e.g. a thinking block), extended back over a <think> block of the same turn, and ends
// after the answer (as written, or trimmed) and the special token that closes the turn.
std::vector<std::pair<std::size_t, std::size_t>> ChatEncoder::find_assistant_spans(const json& messages, const json& variables,
                                                                                  const std::string& text,
                                                                                  const std::string& where) const {
  static const std::string kSentinel = "SLIDEDPASSISTANTTURN7F3A";
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  std::size_t cursor = 0;
  auto next_special = [&](std::size_t from) {
    std::size_t at = std::string::npos, len = 0;
    for (const std::string& te : turn_ends_) {
      const std::size_t p = text.find(te, from);
      if (p != std::string::npos && (p < at || (p == at && te.size() > len))) at = p, len = te.size();
    }
    return std::pair{at, len};
  };
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (m["role"] != "assistant") continue;
    json probe = variables;
    probe["messages"][i]["content"] = kSentinel;
    const std::string other = template_.render(*jinja::from_json(probe).map).text;
    const std::size_t sentinel = other.find(kSentinel);
    if (sentinel == std::string::npos)
      throw InputError(fmt::format("{}: messages[{}]", where, i),
                       "the template does not print this assistant message's content: the assistant mask cannot be placed; "
                       "mark the template's assistant output with {% generation %} or use --train-on-all");
    std::size_t start = 0;
    while (start < sentinel && start < text.size() && text[start] == other[start]) ++start;
    std::size_t begin = start;
    const std::size_t think = begin >= 7 ? text.rfind("<think>", begin - 7) : std::string::npos;
    if (think != std::string::npos && think >= cursor && next_special(think).first >= begin) begin = think;
    // The answer: the content after its thinking block, as written or trimmed, from `start` on.
    // The answer as text: the content, or the last text part of a list of parts.
    std::string answer;
    if (m.contains("content") && m["content"].is_string()) answer = m["content"].get<std::string>();
    if (m.contains("content") && m["content"].is_array())
      for (const json& part : m["content"])
        if (part.is_object() && part.contains("text") && part["text"].is_string()) answer = part["text"].get<std::string>();
    if (answer.find("</think>") != std::string::npos) {
      answer = answer.substr(answer.rfind("</think>") + 8);
      answer.erase(0, std::min(answer.size(), answer.find_first_not_of('\n')));
    }
    std::size_t end = start;
    const std::size_t turn_close = next_special(start).first;
    for (const std::string& candidate : {answer, py_strip(answer)}) {
      const std::size_t p = candidate.empty() ? std::string::npos : text.find(candidate, start);
      // (At the turn's start the answer may hold special tokens' text itself.)
      if (p != std::string::npos && (p == start || turn_close == std::string::npos || p + candidate.size() <= turn_close))
        end = std::max(end, p + candidate.size());
    }
    const auto [close, close_len] = next_special(end);
    if (close != std::string::npos) end = close + close_len;
    spans.emplace_back(begin, end);
    cursor = end;
  }
  return spans;
}

// The deepest nesting of `j`, counted without recursion (a line of a million brackets must be refused,
// not overflow the stack of whatever walks it next).
std::size_t json_depth(const json& j) {
  std::size_t deepest = 0;
  std::vector<std::pair<const json*, std::size_t>> stack{{&j, 1}};
  while (!stack.empty()) {
    const auto [x, d] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, d);
    if (x->is_structured())
      for (const auto& child : *x) stack.emplace_back(&child, d + 1);
  }
  return deepest;
}

ChatExample ChatEncoder::encode(const json& line, bool train_on_all, const std::string& where, WordCache* cache) const {
  if (json_depth(line) > 64) throw InputError(where, "a conversation nested deeper than 64 levels");
  if (line.contains("messages") && (line.contains("prompt") || line.contains("completion")))
    throw InputError(where, "both messages and prompt/completion: give one of them");
  for (const auto& [k, _] : line.items())
    if (k != "messages" && k != "prompt" && k != "completion" && k != "tools" && k != "chat_template_kwargs")
      throw InputError(where, fmt::format("unknown key '{}' (a conversation has messages, or prompt and completion; "
                                          "optionally tools and chat_template_kwargs)", k));
  const json messages = messages_of(line, where);
  json variables = {{"messages", messages}, {"add_generation_prompt", false}, {"tools", nullptr}, {"documents", nullptr}};
  if (line.contains("tools")) {
    if (!line["tools"].is_array()) throw InputError(where + ": tools", "expected a list of tool definitions");
    variables["tools"] = line["tools"];
  }
  const TokenizerConfig& c = tokenizer_.config();
  if (c.bos_token) variables["bos_token"] = *c.bos_token;
  if (c.eos_token) variables["eos_token"] = *c.eos_token;
  if (c.pad_token) variables["pad_token"] = *c.pad_token;
  if (line.contains("chat_template_kwargs")) {
    if (!line["chat_template_kwargs"].is_object()) throw InputError(where + ": chat_template_kwargs", "expected an object");
    for (const auto& [k, v] : line["chat_template_kwargs"].items()) variables[k] = v;
  }

  ChatExample ex;
  jinja::Rendered r;
  try {
    r = template_.render(*jinja::from_json(variables).map);
  } catch (const InputError& e) {
    throw InputError(where, fmt::format("the chat template ({}) refused the conversation: {}", origin_, e.what()));
  }
  ex.rendered = r.text;
  ex.ids = tokenizer_.encode(r.text, /*add_special_tokens=*/false, cache);
  for (const json& m : messages) ex.assistant_turns += m["role"] == "assistant";
  if (train_on_all) {
    ex.mask.assign(ex.ids.size(), 1);
    return ex;
  }

  // The assistant's character ranges.
  std::vector<std::pair<std::size_t, std::size_t>> spans = r.generation;
  if (spans.empty()) spans = find_assistant_spans(messages, variables, r.text, where);

  // Characters to tokens: the tokens' surfaces spell the text where the tokenizer is lossless.
  std::vector<std::size_t> starts;
  std::string spelled;
  for (int32_t id : ex.ids) {
    starts.push_back(spelled.size());
    spelled += tokenizer_.token_surface(id);
  }
  if (spelled != r.text)
    throw InputError(where, "the tokens do not spell the rendered conversation (the tokenizer normalizes this text, "
                            "e.g. characters not in NFC): the assistant mask cannot be placed; normalize the data or "
                            "use --train-on-all");
  starts.push_back(spelled.size());
  ex.mask.assign(ex.ids.size(), 0);
  for (const auto& [b, e] : spans)
    for (std::size_t k = 0; k < ex.ids.size(); ++k)
      if (starts[k] < e && starts[k + 1] > b) ex.mask[k] = 1;
  if (std::find(ex.mask.begin(), ex.mask.end(), uint8_t{1}) == ex.mask.end())
    throw InputError(where + ": messages",
                     "no assistant turn: nothing of this conversation would count in the loss "
                     "(--train-on-all trains on every token)");
  return ex;
}

}  // namespace slidedp::text
