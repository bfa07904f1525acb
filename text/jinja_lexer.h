// Splitting a chat template into text and tags, and a tag into tokens, with the whitespace rules
// transformers renders templates under: `trim_blocks` (the newline after a block tag goes),
// `lstrip_blocks` (spaces and tabs before a block tag on its own line go), `-` inside a tag strips
// all whitespace on that side, `+` keeps it, and one newline at the very end of the template goes
// (Jinja's keep_trailing_newline off).
#pragma once

#include <string>
#include <vector>

namespace slidedp::text::jinja {

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;  // the text, or the tag's inside without its delimiters and whitespace signs
  int line = 1;      // where the piece starts in the template
};

// Throws InputError("chat template line N", ...) on an unclosed tag or comment.
std::vector<Piece> split_template(const std::string& source);

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // a name, an operator, or a string literal's value (escapes applied)
  int line = 1;
};

// The tokens of one tag's inside (a kEnd token last). Throws InputError naming the line.
std::vector<Token> tokenize_tag(const std::string& inside, int line);

}  // namespace slidedp::text::jinja
