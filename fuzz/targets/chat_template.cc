// A chat template (tokenizer_config.json's chat_template, from a model folder): compiled, then rendered
// with a small conversation, tools and the special tokens. Either it renders or it is refused with an
// InputError naming the line; never a crash, a hang, an unbounded allocation or a stack overflow.
#include "fuzz/harness.h"
#include "text/jinja_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace slidedp::text::jinja;
  return slidedp::fuzz::check_input([&] {
    const Template t(slidedp::fuzz::as_text(data, size));
    static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "Hi <think>"},
                   {"role": "assistant", "content": "<think>\nr\n</think>\n\nHello!", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
                   {"role": "tool", "content": "{\"ok\": 1}"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
    t.render(*from_json(variables).map);
  });
}
