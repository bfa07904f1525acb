// A Jinja template as chat templates use it, compiled once and rendered per conversation the way
// transformers' apply_chat_template renders it (Jinja2 with trim_blocks, lstrip_blocks, loop controls,
// its `{% generation %}` tag, and `tojson`, `raise_exception` and `strftime_now`). Supported, and
// nothing else (docs/FORMATS.md): text, {{ }}, {# #}, {% if/elif/else %}, {% for %} (tuple targets,
// an `if` filter, `else`, `loop.*`, break/continue), {% set %} (names, namespace attributes, blocks),
// {% macro %} and calls to it, {% generation %}, {% raw %}; expressions with Jinja's precedence,
// literals, attribute and item access, slices, calls, the filters and tests of jinja_builtins.h, and
// Python's str, list and dict methods that templates call. A construct outside that set is refused
// when the template is compiled, naming it and its line.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace slidedp::text::jinja {

struct Node;

struct Rendered {
  std::string text;
  // The output ranges inside {% generation %} ... {% endgeneration %} (the assistant's tokens, where a
  // template marks them), in order.
  std::vector<std::pair<std::size_t, std::size_t>> generation;
};

class Template {
 public:
  // Throws InputError("chat template line N", ...) naming an unsupported or malformed construct.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // `variables`: messages, add_generation_prompt, tools, the special tokens, ... Throws InputError for
  // an error the template raises (raise_exception) or hits (an undefined value used, a wrong type).
  Rendered render(const Map& variables) const;

 private:
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace slidedp::text::jinja
