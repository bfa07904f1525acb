#include "text/jinja_lexer.h"

#include <fmt/format.h>

#include <cctype>

#include "common/error.h"

namespace slidedp::text::jinja {
namespace {

std::string where(int line) { return fmt::format("chat template line {}", line); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int count_lines(const std::string& s, std::size_t from, std::size_t to) {
  int n = 0;
  for (std::size_t k = from; k < to && k < s.size(); ++k) n += s[k] == '\n';
  return n;
}

// The end of a tag opened before `from`: `close` ("}}" or "%}") outside string literals and outside
// brackets (Jinja's lexer balances them: `{{ {'a': {}} }}` ends at the last "}}").
std::size_t find_tag_end(const std::string& s, std::size_t from, const char* close) {
  char quote = 0;
  int depth = 0;
  for (std::size_t k = from; k < s.size(); ++k) {
    const char c = s[k];
    if (quote) {
      if (c == '\\') ++k;
      else if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && k + 1 < s.size() && c == close[0] && s[k + 1] == close[1]) {
      return k;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string::npos;
}

}  // namespace

std::vector<Piece> split_template(const std::string& source_in) {
  std::string source = source_in;
  // Jinja reads "\r\n" as one newline and drops a single trailing newline.
  for (std::size_t k = source.find("\r\n"); k != std::string::npos; k = source.find("\r\n", k)) source.erase(k, 1);
  if (!source.empty() && source.back() == '\n') source.pop_back();

  std::vector<Piece> pieces;
  std::size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the previous tag's end consumed a newline (or nothing came before)
  while (pos < source.size()) {
    std::size_t at = pos;
    char kind = 0;
    while ((at = source.find('{', at)) != std::string::npos) {
      if (at + 1 < source.size() && (source[at + 1] == '{' || source[at + 1] == '%' || source[at + 1] == '#')) {
        kind = source[at + 1];
        break;
      }
      ++at;
    }
    std::string text = source.substr(pos, at == std::string::npos ? std::string::npos : at - pos);
    const int text_line = line;
    if (at == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    line += count_lines(source, pos, at);
    const char sign = at + 2 < source.size() ? source[at + 2] : 0;
    if (sign == '-') {
      std::size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: spaces and tabs between the line's start and a block tag or comment.
      const std::size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) text.resize(l);
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});

    const std::size_t open_end = at + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    const int tag_line = line;
    std::size_t close;
    if (kind == '#') {
      close = source.find("#}", open_end);
      if (close == std::string::npos) throw InputError(where(tag_line), "a comment {# is never closed by #}");
    } else {
      close = find_tag_end(source, open_end, kind == '{' ? "}}" : "%}");
      if (close == std::string::npos)
        throw InputError(where(tag_line), fmt::format("a tag {}{} is never closed by {}", '{', kind, kind == '{' ? "}}" : "%}"));
    }
    std::string inside = source.substr(open_end, close - open_end);
    char end_sign = 0;
    if (!inside.empty() && (inside.back() == '-' || inside.back() == '+')) {
      end_sign = inside.back();
      inside.pop_back();
    }
    line += count_lines(source, at, close + 2);
    pos = close + 2;
    line_starting = false;
    if (end_sign == '-') {
      const std::size_t start = pos;
      while (pos < source.size() && is_space(source[pos])) ++pos;
      line_starting = pos > start && source[pos - 1] == '\n';
      line += count_lines(source, start, pos);
    } else if (end_sign != '+' && kind != '{' && pos < source.size() && source[pos] == '\n') {
      ++pos;  // trim_blocks
      ++line;
      line_starting = true;
    }
    if (kind == '#') continue;
    if (kind == '%') {
      // {% raw %} ... {% endraw %}: the text between, as it is.
      std::size_t b = inside.find_first_not_of(" \t\n");
      if (b != std::string::npos && inside.compare(b, 3, "raw") == 0 && inside.find_first_not_of(" \t\n", b + 3) == std::string::npos) {
        const std::size_t end = source.find("endraw", pos);
        const std::size_t open = end == std::string::npos ? end : source.rfind("{%", end);
        if (open == std::string::npos || source.find("%}", end) == std::string::npos)
          throw InputError(where(tag_line), "{% raw %} is never closed by {% endraw %}");
        std::string raw = source.substr(pos, open - pos);
        if (open + 2 < source.size() && source[open + 2] == '-')
          while (!raw.empty() && is_space(raw.back())) raw.pop_back();
        pieces.push_back({Piece::Kind::kText, raw, line});
        line += count_lines(source, pos, source.find("%}", end) + 2);
        pos = source.find("%}", end) + 2;
        if (pos < source.size() && source[pos] == '\n') ++pos, ++line;
        line_starting = true;
        continue;
      }
    }
    pieces.push_back({kind == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement, inside, tag_line});
  }
  return pieces;
}

std::vector<Token> tokenize_tag(const std::string& s, int line) {
  std::vector<Token> out;
  std::size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (is_space(c)) {
      line += c == '\n';
      ++k;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Token::Kind::kName, s.substr(k, e - k), line});
      k = e;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t e = k;
      bool fractional = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        fractional = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        std::size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit(static_cast<unsigned char>(s[x]))) {
          fractional = true;
          e = x;
          while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        }
      }
      std::string digits;
      for (std::size_t j = k; j < e; ++j)
        if (s[j] != '_') digits += s[j];
      out.push_back({fractional ? Token::Kind::kFloat : Token::Kind::kInt, digits, line});
      k = e;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      std::size_t e = k + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] != '\\' || e + 1 >= s.size()) {
          value += s[e];
          continue;
        }
        const char x = s[++e];
        switch (x) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case '0': value += '\0'; break;
          case '\\': value += '\\'; break;
          case '\'': value += '\''; break;
          case '"': value += '"'; break;
          case '\n': break;  // a continued line
          default: value += '\\', value += x;  // Python keeps unknown escapes as written
        }
      }
      if (e >= s.size()) throw InputError(where(line), "a string literal is never closed");
      out.push_back({Token::Kind::kString, value, line});
      k = e + 1;
      continue;
    }
    static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                       "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"};
    bool matched = false;
    for (const char* op : kOps) {
      const std::size_t n = std::char_traits<char>::length(op);
      if (s.compare(k, n, op) == 0) {
        out.push_back({Token::Kind::kOp, op, line});
        k += n;
        matched = true;
        break;
      }
    }
    if (!matched) throw InputError(where(line), fmt::format("unexpected character '{}' in a tag", c));
  }
  out.push_back({Token::Kind::kEnd, "", line});
  return out;
}

}  // namespace slidedp::text::jinja
