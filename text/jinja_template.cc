// The compiler (pieces -> statement tree, tokens -> expression tree, Jinja's precedence) and the
// renderer (scopes as Jinja has them: a for loop's iteration and a macro call are scopes, an if is not).
#include "text/jinja_template.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "common/error.h"
#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"

namespace slidedp::text::jinja {

namespace {
std::string line_where(int line) { return fmt::format("chat template line {}", line); }
}  // namespace

struct Expr {
  enum class Kind { kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kAnd, kOr, kCond, kList, kDict };
  Kind kind = Kind::kLiteral;
  int line = 1;
  Value literal;
  std::string name;  // a name, attribute, filter, test or operator
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> kids;  // operands; slices: object, start, stop, step (null: omitted)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kGeneration };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;  // text; set / macro: the name
  std::string attr;  // set: the namespace attribute
  std::vector<std::string> names;  // for: its targets; macro: its parameters
  std::vector<std::unique_ptr<Expr>> exprs;  // output; if: conditions; for: iterable, filter; set: value; macro: defaults
  std::vector<std::vector<std::unique_ptr<Node>>> bodies;  // if: one per condition, then else; for: body, else
};

namespace {

using ExprPtr = std::unique_ptr<Expr>;
using Body = std::vector<std::unique_ptr<Node>>;

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(k_ + ahead, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  bool is_op(const char* op, std::size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::kOp && peek(ahead).text == op; }
  bool is_name(const char* n, std::size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == n; }
  Token next() { return t_[std::min(k_++, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& what) const { throw InputError(line_where(peek().line), what); }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(fmt::format("expected '{}', found '{}'", op, peek().text));
    ++k_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail(fmt::format("expected a name, found '{}'", peek().text));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(fmt::format("unexpected '{}' at the end of the tag", peek().text));
  }

  ExprPtr expression() {
    ExprPtr e = or_expr();
    if (!is_name("if")) return e;
    const int line = next().line;
    auto c = make(Expr::Kind::kCond, line);
    ExprPtr cond = or_expr();
    ExprPtr otherwise = is_name("else") ? (next(), expression()) : nullptr;
    c->kids.push_back(std::move(e));
    c->kids.push_back(std::move(cond));
    c->kids.push_back(std::move(otherwise));
    return c;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      next();
      ExprPtr rhs = and_expr();
      e = binary(Expr::Kind::kOr, "or", std::move(e), std::move(rhs));
    }
    return e;
  }

 private:
  ExprPtr binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(kind, a->line);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      next();
      ExprPtr rhs = not_expr();
      e = binary(Expr::Kind::kAnd, "and", std::move(e), std::move(rhs));
    }
    return e;
  }
  ExprPtr not_expr() {
    const Nesting guard(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::kNot, next().line);
      e->kids.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    static const char* const kOps[] = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      std::string op;
      for (const char* o : kOps)
        if (is_op(o)) op = o;
      if (op.empty() && is_name("in")) op = "in";
      if (op.empty() && is_name("not") && is_name("in", 1)) op = "not in", next();
      if (op.empty()) return e;
      next();
      ExprPtr rhs = math1();
      e = binary(Expr::Kind::kBinary, op, std::move(e), std::move(rhs));
    }
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      ExprPtr rhs = concat();
      e = binary(Expr::Kind::kBinary, op, std::move(e), std::move(rhs));
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      next();
      ExprPtr rhs = math2();
      e = binary(Expr::Kind::kBinary, "~", std::move(e), std::move(rhs));
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      ExprPtr rhs = power();
      e = binary(Expr::Kind::kBinary, op, std::move(e), std::move(rhs));
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      next();
      ExprPtr rhs = unary(true);
      e = binary(Expr::Kind::kBinary, "**", std::move(e), std::move(rhs));
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    const Nesting guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      ExprPtr x = unary(false);
      if (op.text == "+") {
        e = std::move(x);
      } else {
        e = make(Expr::Kind::kNeg, op.line);
        e->kids.push_back(std::move(x));
      }
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }
  ExprPtr primary() {
    const Token t = next();
    switch (t.kind) {
      case Token::Kind::kName: {
        auto e = make(Expr::Kind::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") e->literal = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else e->kind = Expr::Kind::kName, e->name = t.text;
        return e;
      }
      case Token::Kind::kString: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals join
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::string(s);
        return e;
      }
      case Token::Kind::kInt: {
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::integer(int_literal(t));
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::number(std::strtod(t.text.c_str(), nullptr));  // past the range: inf, as Python reads it
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          ExprPtr e = expression();
          if (is_op(",")) {  // a tuple
            auto l = make(Expr::Kind::kList, t.line);
            l->name = "tuple";
            l->kids.push_back(std::move(e));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              l->kids.push_back(expression());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto l = make(Expr::Kind::kList, t.line);
          while (!is_op("]")) {
            l->kids.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return l;
        }
        if (t.text == "{") {
          auto d = make(Expr::Kind::kDict, t.line);
          while (!is_op("}")) {
            d->kids.push_back(expression());
            expect_op(":");
            d->kids.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    throw InputError(line_where(t.line), fmt::format("unexpected '{}' in an expression", t.kind == Token::Kind::kEnd ? "end of tag" : t.text));
  }
  // Python's integers have no bound; ours are 64 bits: a larger literal is refused, not wrapped.
  static int64_t int_literal(const Token& t) {
    int64_t v = 0;
    const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
      throw InputError(line_where(t.line), fmt::format("the integer {} is past 64 bits", t.text));
    return v;
  }

  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument after a keyword argument");
        e.kids.push_back(expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        const Token n = next();
        if (n.kind == Token::Kind::kInt) {
          auto item = make(Expr::Kind::kItem, line);
          auto key = make(Expr::Kind::kLiteral, line);
          key->literal = Value::integer(int_literal(n));
          item->kids.push_back(std::move(e));
          item->kids.push_back(std::move(key));
          e = std::move(item);
          continue;
        }
        if (n.kind != Token::Kind::kName) throw InputError(line_where(line), "expected an attribute name after '.'");
        auto a = make(Expr::Kind::kAttr, line);
        a->name = n.text;
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        bool sliced = false;
        for (int p = 0; p < 3; ++p) {
          if (!is_op(":") && !is_op("]")) parts[p] = expression();
          if (p < 2 && is_op(":")) {
            next();
            sliced = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto s = make(sliced ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        s->kids.push_back(std::move(e));
        for (int p = 0; p < (sliced ? 3 : 1); ++p) s->kids.push_back(std::move(parts[p]));
        if (!sliced && !s->kids[1]) throw InputError(line_where(line), "an empty subscript []");
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::kCall, peek().line);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto f = make(Expr::Kind::kFilter, line);
        f->name = expect_name();
        if (!is_filter(f->name)) throw InputError(line_where(line), fmt::format("the filter '{}' is not supported", f->name));
        f->kids.push_back(std::move(e));
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::Kind::kTest, line);
        if (is_name("not")) next(), t->negated = true;
        t->name = peek().kind == Token::Kind::kOp ? next().text : expect_name();
        if (!is_test(t->name)) throw InputError(line_where(line), fmt::format("the test '{}' is not supported", t->name));
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          call_args(*t);
        } else if (!at_end() && !is_name("else") && !is_name("and") && !is_name("or") && !is_name("if") &&
                   (peek().kind != Token::Kind::kOp || is_op("[") || is_op("{") || is_op("-"))) {
          t->kids.push_back(unary(false));  // `is divisibleby 3`, `is sameas none`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  // Nested brackets and unary operators recurse: bounded so that no tag can exhaust the stack.
  struct Nesting {
    explicit Nesting(ExprParser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.fail(fmt::format("expressions nested deeper than {}", kMaxNesting));
    }
    ~Nesting() { --p_.depth_; }
    ExprParser& p_;
  };
  static constexpr int kMaxNesting = 64;

  std::vector<Token> t_;
  std::size_t k_ = 0;
  int depth_ = 0;
};

// ---- the statement tree ----

class Compiler {
 public:
  explicit Compiler(const std::string& source) : pieces_(split_template(source)) {}

  Body compile() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // Parses nodes until a statement whose keyword is in `stops` (returned in `stop`, its tag's parser
  // left after the keyword in `tag_`); at the template's end when `stops` is empty.
  Body parse_body(const std::vector<std::string>& stops, std::string* stop) {
    if (++depth_ > 64) throw InputError(line_where(at_ < pieces_.size() ? pieces_[at_].line : 0), "blocks nested deeper than 64");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    Body body;
    while (at_ < pieces_.size()) {
      const Piece& p = pieces_[at_++];
      if (p.kind == Piece::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = p.line;
        n->text = p.text;
        body.push_back(std::move(n));
        continue;
      }
      std::vector<Token> tokens = tokenize_tag(p.text, p.line);
      // A chain of operators builds a tree as deep as it is long, which rendering walks recursively.
      if (tokens.size() > 4096) throw InputError(line_where(p.line), "a tag of more than 4096 tokens");
      tag_ = std::make_unique<ExprParser>(std::move(tokens));
      if (p.kind == Piece::Kind::kOutput) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = p.line;
        n->exprs.push_back(tag_->expression());
        tag_->expect_end();
        body.push_back(std::move(n));
        continue;
      }
      const std::string kw = tag_->expect_name();
      for (const std::string& s : stops)
        if (kw == s) {
          *stop = kw;
          return body;
        }
      body.push_back(statement(kw, p.line));
    }
    if (!stops.empty())
      throw InputError("chat template", fmt::format("the template ends inside a block: expected {{% {} %}}", stops.back()));
    return body;
  }

  std::unique_ptr<Node> statement(const std::string& kw, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    ExprParser& t = *tag_;
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      n->exprs.push_back(t.expression());
      t.expect_end();
      std::string stop;
      while (true) {
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, &stop));
        if (stop == "elif") {
          n->exprs.push_back(tag_->expression());
          tag_->expect_end();
        } else if (stop == "else") {
          tag_->expect_end();
          n->bodies.push_back(parse_body({"endif"}, &stop));
          tag_->expect_end();
          break;
        } else {
          tag_->expect_end();
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      n->kind = Node::Kind::kFor;
      n->names.push_back(t.expect_name());
      while (t.is_op(",")) t.next(), n->names.push_back(t.expect_name());
      if (!t.is_name("in")) t.fail("expected 'in' in a for loop");
      t.next();
      n->exprs.push_back(t.or_expr());
      if (t.is_name("if")) t.next(), n->exprs.push_back(t.expression());
      if (t.is_name("recursive")) t.fail("recursive for loops are not supported");
      t.expect_end();
      std::string stop;
      n->bodies.push_back(parse_body({"else", "endfor"}, &stop));
      tag_->expect_end();
      if (stop == "else") {
        n->bodies.push_back(parse_body({"endfor"}, &stop));
        tag_->expect_end();
      }
      return n;
    }
    if (kw == "set") {
      n->text = t.expect_name();
      if (t.is_op(".")) t.next(), n->attr = t.expect_name();
      if (t.is_op(",")) t.fail("set with several targets is not supported");
      if (t.at_end()) {
        n->kind = Node::Kind::kSetBlock;
        std::string stop;
        n->bodies.push_back(parse_body({"endset"}, &stop));
        tag_->expect_end();
        return n;
      }
      n->kind = Node::Kind::kSet;
      t.expect_op("=");
      n->exprs.push_back(t.expression());
      if (t.is_op(",")) t.fail("set to a tuple is not supported");
      t.expect_end();
      return n;
    }
    if (kw == "macro") {
      n->kind = Node::Kind::kMacro;
      n->text = t.expect_name();
      t.expect_op("(");
      while (!t.is_op(")")) {
        n->names.push_back(t.expect_name());
        n->exprs.push_back(t.is_op("=") ? (t.next(), t.expression()) : nullptr);
        if (!t.is_op(",")) break;
        t.next();
      }
      t.expect_op(")");
      t.expect_end();
      std::string stop;
      n->bodies.push_back(parse_body({"endmacro"}, &stop));
      tag_->expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      t.expect_end();
      return n;
    }
    if (kw == "generation") {
      n->kind = Node::Kind::kGeneration;
      t.expect_end();
      std::string stop;
      n->bodies.push_back(parse_body({"endgeneration"}, &stop));
      tag_->expect_end();
      return n;
    }
    throw InputError(line_where(line), fmt::format("the statement {{% {} %}} is not supported", kw));
  }

  std::vector<Piece> pieces_;
  std::size_t at_ = 0;
  int depth_ = 0;
  std::unique_ptr<ExprParser> tag_;
};

// ---- rendering ----

using Scope = std::unordered_map<std::string, Value>;

// Bounds a template cannot pass (a conversation's rendering is kilobytes; a template that loops or
// recurses without end is refused, not left to exhaust memory or the stack).
constexpr std::size_t kMaxDepth = 256;
constexpr double kMaxOutputBytes = 64.0 * 1024 * 1024;
// Loops nest (a range of 100,000 in a range of 100,000): a rendering is also bounded in work. A
// released template spends hundreds of steps per message.
constexpr int64_t kMaxSteps = 2'000'000;

Value strftime_now(Args& a) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[256];
  const std::string format = a.get(0, "format").is_string() ? a.get(0, "format").s : "";
  const std::size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  return Value::string(std::string(buf, n));
}

class Renderer {
 public:
  explicit Renderer(const Map& variables) {
    Scope globals;
    globals["raise_exception"] = Value::function([](Args& a) -> Value {
      throw InputError("chat template", "the template raised: " + to_str(a.get(0, "message")));
    });
    globals["namespace"] = Value::function([](Args& a) {
      Map m;
      m.is_namespace = true;
      for (const auto& [k, v] : a.keyword) m.set(k, v);
      return Value::of_map(std::move(m));
    });
    globals["strftime_now"] = Value::function(strftime_now);
    globals["range"] = Value::function([](Args& a) {
      int64_t b = 0, e = 0, s = 1;
      auto as_int = [](const Value& v) { return v.as_int(); };
      if (a.positional.size() == 1) e = as_int(a.positional[0]);
      if (a.positional.size() >= 2) b = as_int(a.positional[0]), e = as_int(a.positional[1]);
      if (a.positional.size() >= 3) s = as_int(a.positional[2]);
      if (s == 0) throw InputError("chat template", "range() step cannot be zero");
      // Jinja's sandbox refuses ranges over 100,000 items (MAX_RANGE); so do we, before allocating.
      const double count = std::ceil((static_cast<double>(e) - static_cast<double>(b)) / static_cast<double>(s));
      if (count > 100000) throw InputError("chat template", "range() of more than 100000 items");
      List out;
      int64_t k = b;
      for (int64_t i = 0; i < static_cast<int64_t>(std::max(0.0, count)); ++i) {
        out.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, s, &k)) break;  // (the last item: a huge step passes int64 after it)
      }
      return Value::of_list(out);
    });
    globals["dict"] = Value::function([](Args& a) {
      Map m;
      for (const auto& [k, v] : a.keyword) m.set(k, v);
      return Value::of_map(std::move(m));
    });
    for (const auto& [k, v] : variables.items) globals[k] = v;
    scopes_.push_back(std::move(globals));
  }

  Rendered run(const Body& body) {
    block(body);
    return std::move(out_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      const auto it = s->find(name);
      if (it != s->end()) return it->second;
    }
    return Value::undefined(name);
  }

  Flow block(const Body& body) {
    for (const auto& n : body) {
      const Flow f = node(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow node(const Node& n) {
    if (++steps_ > kMaxSteps) throw InputError(line_where(n.line), fmt::format("the template runs past {} steps", kMaxSteps));
    switch (n.kind) {
      case Node::Kind::kText: append(n.text, n.line); return Flow::kNormal;
      case Node::Kind::kOutput: append(to_str(eval(*n.exprs[0])), n.line); return Flow::kNormal;
      case Node::Kind::kIf:
        for (std::size_t k = 0; k < n.exprs.size(); ++k)
          if (eval(*n.exprs[k]).truthy()) return block(n.bodies[k]);
        return n.bodies.size() > n.exprs.size() ? block(n.bodies.back()) : Flow::kNormal;
      case Node::Kind::kFor: return for_loop(n);
      case Node::Kind::kSet: {
        Value v = eval(*n.exprs[0]);
        assign(n, std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string saved = std::move(out_.text);
        out_.text.clear();
        block(n.bodies[0]);
        Value v = Value::string(std::move(out_.text));
        out_.text = std::move(saved);
        assign(n, std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        const Node* def = &n;
        scopes_.back()[n.text] = Value::function([this, def](Args& a) { return call_macro(*def, a); });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kGeneration: {
        const std::size_t begin = out_.text.size();
        const Flow f = block(n.bodies[0]);
        out_.generation.emplace_back(begin, out_.text.size());
        return f;
      }
    }
    return Flow::kNormal;
  }

  void append(const std::string& text, int line) {
    if (out_.text.size() + text.size() > kMaxOutputBytes) throw InputError(line_where(line), "the template's output passes 64 MiB");
    out_.text += text;
  }

  void assign(const Node& n, Value v) {
    if (n.attr.empty()) {
      scopes_.back()[n.text] = std::move(v);
      return;
    }
    const Value ns = lookup(n.text);
    if (!ns.is_map() || !ns.map->is_namespace)
      throw InputError(line_where(n.line), fmt::format("set {}.{}: '{}' is not a namespace()", n.text, n.attr, n.text));
    // A namespace inside itself would be a cycle (printing it would not end, nor would freeing it).
    if (holds(v, ns.map.get())) throw InputError(line_where(n.line), fmt::format("set {}.{}: a value holding '{}' itself", n.text, n.attr, n.text));
    ns.map->set(n.attr, std::move(v));
  }

  static bool holds(const Value& v, const Map* target) {
    if (v.is_map()) {
      if (v.map.get() == target) return true;
      for (const auto& [k, x] : v.map->items)
        if (holds(x, target)) return true;
    }
    if (v.is_list())
      for (const Value& x : *v.list)
        if (holds(x, target)) return true;
    return false;
  }

  Value call_macro(const Node& def, Args& a) {
    // Jinja2 stops a runaway recursion with Python's recursion limit; we stop at a depth templates
    // never reach, before the stack does.
    if (scopes_.size() > kMaxDepth) throw InputError(line_where(def.line), fmt::format("macro calls nested deeper than {}", kMaxDepth));
    Scope s;
    for (std::size_t k = 0; k < def.names.size(); ++k) {
      Value v = a.get(k, def.names[k]);
      if (v.is_undefined() && def.exprs[k]) v = eval(*def.exprs[k]);
      s[def.names[k]] = std::move(v);
    }
    std::string saved = std::move(out_.text);
    out_.text.clear();
    scopes_.push_back(std::move(s));
    block(def.bodies[0]);
    scopes_.pop_back();
    Value result = Value::string(std::move(out_.text));
    out_.text = std::move(saved);
    return result;
  }

  Flow for_loop(const Node& n) {
    const std::string where = line_where(n.line);
    List items;
    for (const Value& x : iterate(eval(*n.exprs[0]), where)) {
      if (n.exprs.size() > 1) {
        scopes_.emplace_back();
        bind_targets(n, x, where);
        const bool keep = eval(*n.exprs[1]).truthy();
        scopes_.pop_back();
        if (!keep) continue;
      }
      items.push_back(x);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (++steps_ > kMaxSteps) throw InputError(where, fmt::format("the template runs past {} steps", kMaxSteps));
      scopes_.emplace_back();
      bind_targets(n, items[static_cast<std::size_t>(k)], where);
      Map loop;
      loop.set("index0", Value::integer(k));
      loop.set("index", Value::integer(k + 1));
      loop.set("revindex0", Value::integer(len - k - 1));
      loop.set("revindex", Value::integer(len - k));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == len - 1));
      loop.set("length", Value::integer(len));
      loop.set("previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined("loop.previtem"));
      loop.set("nextitem", k + 1 < len ? items[static_cast<std::size_t>(k + 1)] : Value::undefined("loop.nextitem"));
      loop.set("cycle", Value::function([k](Args& a) {
        return a.positional.empty() ? Value::undefined() : a.positional[static_cast<std::size_t>(k) % a.positional.size()];
      }));
      scopes_.back()["loop"] = Value::of_map(std::move(loop));
      const Flow f = block(n.bodies[0]);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (len == 0 && n.bodies.size() > 1) return block(n.bodies[1]);
    return Flow::kNormal;
  }

  void bind_targets(const Node& n, const Value& x, const std::string& where) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = x;
      return;
    }
    const List parts = iterate(x, where);
    if (parts.size() != n.names.size())
      throw InputError(where, fmt::format("cannot unpack {} values into {} loop variables", parts.size(), n.names.size()));
    for (std::size_t k = 0; k < parts.size(); ++k) scopes_.back()[n.names[k]] = parts[k];
  }

  Args arguments(const Expr& e, std::size_t first) {
    Args a;
    for (std::size_t k = first; k < e.kids.size(); ++k) a.positional.push_back(eval(*e.kids[k]));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x));
    return a;
  }

  // "chat template line N", made once per line (every evaluation passes it on for errors).
  const std::string& where_of(int line) {
    const std::size_t k = static_cast<std::size_t>(std::max(0, line));
    if (k >= wheres_.size()) wheres_.resize(k + 1);
    if (wheres_[k].empty()) wheres_[k] = line_where(line);
    return wheres_[k];
  }

  Value eval(const Expr& e) {
    if (++steps_ > kMaxSteps) throw InputError(line_where(e.line), fmt::format("the template runs past {} steps", kMaxSteps));
    const std::string& where = where_of(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: return get_attr(eval(*e.kids[0]), e.name, where);
      case Expr::Kind::kItem: return get_item(eval(*e.kids[0]), eval(*e.kids[1]), where);
      case Expr::Kind::kSlice: {
        auto part = [&](std::size_t k) { return e.kids[k] ? eval(*e.kids[k]) : Value::undefined(); };
        return slice(eval(*e.kids[0]), part(1), part(2), part(3), where);
      }
      case Expr::Kind::kCall: {
        const Value f = eval(*e.kids[0]);
        if (f.kind != Value::Kind::kFunction)
          throw InputError(where, fmt::format("'{}' is not callable", f.is_undefined() && !f.s.empty() ? f.s : f.type_name()));
        Args a = arguments(e, 1);
        return (*f.fn)(a);
      }
      case Expr::Kind::kFilter: {
        const Value v = eval(*e.kids[0]);
        Args a = arguments(e, 1);
        return apply_filter(e.name, v, a, where);
      }
      case Expr::Kind::kTest: {
        const Value v = eval(*e.kids[0]);
        Args a = arguments(e, 1);
        return Value::boolean(apply_test(e.name, v, a, where) != e.negated);
      }
      case Expr::Kind::kNot: return Value::boolean(!eval(*e.kids[0]).truthy());
      case Expr::Kind::kNeg: {
        const Value v = eval(*e.kids[0]);
        if (v.kind == Value::Kind::kInt && v.i == INT64_MIN) throw InputError(where, "integer overflow in '-'");
        if (v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool) return Value::integer(-(v.kind == Value::Kind::kBool ? v.b : v.i));
        if (v.kind == Value::Kind::kFloat) return Value::number(-v.f);
        throw InputError(where, fmt::format("'-' of a {}", v.type_name()));
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.kids[0]);
        return a.truthy() ? eval(*e.kids[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.kids[0]);
        return a.truthy() ? a : eval(*e.kids[1]);
      }
      case Expr::Kind::kCond:
        if (eval(*e.kids[1]).truthy()) return eval(*e.kids[0]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined();
      case Expr::Kind::kList: {
        List l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        Value v = Value::of_list(std::move(l));
        v.tuple = e.name == "tuple";
        return v;
      }
      case Expr::Kind::kDict: {
        Map m;
        for (std::size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          const Value key = eval(*e.kids[k]);
          m.set(key.is_string() ? key.s : to_str(key), eval(*e.kids[k + 1]));
        }
        return Value::of_map(std::move(m));
      }
      case Expr::Kind::kBinary: return binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]), where);
    }
    return Value::undefined();
  }

  static Value binary(const std::string& op, const Value& a, const Value& b, const std::string& where) {
    using K = Value::Kind;
    auto bad = [&]() -> Value {
      if (a.is_undefined() || b.is_undefined())
        throw InputError(where, fmt::format("'{}' is undefined", (a.is_undefined() ? a : b).s.empty() ? "a value" : (a.is_undefined() ? a : b).s));
      throw InputError(where, fmt::format("unsupported operand types for {}: {} and {}", op, a.type_name(), b.type_name()));
    };
    auto joined = [&](const std::string& x, const std::string& y) {
      if (static_cast<double>(x.size() + y.size()) > kMaxOutputBytes) throw InputError(where, "a string past 64 MiB");
      return Value::string(x + y);
    };
    if (op == "~") return joined(to_str(a), to_str(b));
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) bad();
        found = b.s.find(a.s) != std::string::npos;
      } else if (b.is_map()) {
        found = a.is_string() && b.map->find(a.s);
      } else if (b.is_list()) {
        for (const Value& x : *b.list) found = found || equal(a, x);
      } else {
        bad();
      }
      return Value::boolean(found == (op == "in"));
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c;
      if (a.is_number() && b.is_number()) c = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      else if (a.is_string() && b.is_string()) c = a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
      else return bad();
      return Value::boolean(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (op == "+" && a.is_string() && b.is_string()) return joined(a.s, b.s);
    if (op == "+" && a.is_list() && b.is_list()) {
      if (a.list->size() + b.list->size() > 10'000'000) throw InputError(where, "a list past 10,000,000 items");
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(l));
    }
    if (op == "*" && ((a.is_string() && b.kind == K::kInt) || (a.kind == K::kInt && b.is_string()))) {
      const std::string& s = a.is_string() ? a.s : b.s;
      const int64_t n = a.is_string() ? b.i : a.i;
      if (n > 0 && static_cast<double>(s.size()) * static_cast<double>(n) > kMaxOutputBytes)
        throw InputError(where, "a string repeated past 64 MiB");
      std::string out;
      for (int64_t k = 0; k < n && !s.empty(); ++k) out += s;
      return Value::string(out);
    }
    if (!a.is_number() || !b.is_number()) return bad();
    const bool ints = a.kind != K::kFloat && b.kind != K::kFloat;
    const int64_t x = a.kind == K::kBool ? a.b : a.i, y = b.kind == K::kBool ? b.b : b.i;
    const double p = a.as_double(), q = b.as_double();
    int64_t r = 0;
    auto overflow = [&]() -> Value { throw InputError(where, fmt::format("integer overflow in {}", op)); };
    if (op == "+") return ints ? (__builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r)) : Value::number(p + q);
    if (op == "-") return ints ? (__builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r)) : Value::number(p - q);
    if (op == "*") return ints ? (__builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r)) : Value::number(p * q);
    if ((op == "/" || op == "//" || op == "%") && q == 0) throw InputError(where, "division by zero");
    if (op == "/") return Value::number(p / q);
    if (op == "//") {
      if (ints && x == INT64_MIN && y == -1) return overflow();
      if (ints) return Value::integer(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
      return Value::number(std::floor(p / q));
    }
    if (op == "%") {
      if (ints) {
        const int64_t m = y == -1 ? 0 : x % y;  // Python's: the sign of the divisor (no overflow: signs differ)
        return Value::integer(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
      }
      const double m = std::fmod(p, q);
      return Value::number(m != 0 && ((m < 0) != (q < 0)) ? m + q : m);
    }
    if (op == "**") {
      if (ints && y >= 0 && (x == 0 || x == 1 || x == -1)) return Value::integer(x == 0 ? (y == 0 ? 1 : 0) : x == 1 ? 1 : (y % 2 ? -1 : 1));
      if (ints && y >= 0) {
        r = 1;
        for (int64_t k = 0; k < y && r != 0; ++k)
          if (__builtin_mul_overflow(r, x, &r)) return overflow();
        return Value::integer(r);
      }
      return Value::number(std::pow(p, q));
    }
    return bad();
  }

  std::vector<Scope> scopes_;
  Rendered out_;
  int64_t steps_ = 0;
  std::vector<std::string> wheres_;
};

}  // namespace

Template::Template(const std::string& source) : body_(Compiler(source).compile()) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Rendered Template::render(const Map& variables) const { return Renderer(variables).run(body_); }

}  // namespace slidedp::text::jinja
