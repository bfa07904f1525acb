#include "text/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace slidedp::text::jinja {

namespace {
Value of_kind(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}
}  // namespace

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() { return of_kind(Kind::kNone); }
Value Value::boolean(bool x) {
  Value v = of_kind(Kind::kBool);
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v = of_kind(Kind::kInt);
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v = of_kind(Kind::kFloat);
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v = of_kind(Kind::kString);
  v.s = std::move(x);
  return v;
}
namespace {
uint32_t nesting_of(uint32_t deepest_child) {
  if (deepest_child >= 256) throw InputError("chat template", "lists and mappings nested deeper than 256");
  return deepest_child + 1;
}
}  // namespace

Value Value::of_list(List x) {
  Value v = of_kind(Kind::kList);
  uint32_t deepest = 0;
  for (const Value& e : x) deepest = std::max(deepest, e.nesting);
  v.nesting = nesting_of(deepest);
  v.list = std::make_shared<List>(std::move(x));
  return v;
}
Value Value::of_map(Map x) {
  Value v = of_kind(Kind::kMap);
  uint32_t deepest = 0;
  for (const auto& [k, e] : x.items) deepest = std::max(deepest, e.nesting);
  v.nesting = nesting_of(deepest);
  v.map = std::make_shared<Map>(std::move(x));
  return v;
}
Value Value::function(Function f) {
  Value v = of_kind(Kind::kFunction);
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

int64_t Value::as_int() const {
  if (kind == Kind::kInt) return i;
  if (kind == Kind::kBool) return b;
  const double x = as_double();
  if (std::isnan(x)) return 0;
  if (x >= 9.2233720368547758e18) return INT64_MAX;
  if (x <= -9.2233720368547758e18) return INT64_MIN;
  return static_cast<int64_t>(x);
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0;
    case Kind::kString: return !s.empty();
    case Kind::kList: return !list->empty();
    case Kind::kMap: return map->is_namespace || !map->items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kMap: return map->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

const Value* Map::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Map::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Args::get(std::size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest digits that read back, then Python's layout of them (float_repr_style 'short').
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const std::size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  bool negative = false;
  for (char c : sci.substr(0, e)) {
    if (c == '-') negative = true;
    else if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<std::size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp + 1)) + "." + digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

namespace {

// Python's repr of a string: single quotes unless the text has one and no double quote.
std::string string_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::Kind::kString: json_string(out, v.s); return;
    case Value::Kind::kFunction: out += "null"; return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_value(out, (*v.list)[k], indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kMap: {
      if (v.map->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.map->items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(out, k);
        out += ": ";
        json_value(out, x, indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return string_repr(v.s);
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + to_repr((*v.list)[k]);
      return out + (v.tuple ? (v.list->size() == 1 ? ",)" : ")") : "]");
    }
    case Value::Kind::kMap: {
      if (v.map->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.map->items) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + to_repr(x);
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: return float_repr(v.f);
    case Value::Kind::kString: return v.s;
    case Value::Kind::kFunction: return "<function>";
    default: return to_repr(v);
  }
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_value(out, v, indent, 0);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat) return a.as_double() == b.as_double();
    return (a.kind == Value::Kind::kBool ? a.b : a.i) == (b.kind == Value::Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::kMap:
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, x] : a.map->items) {
        const Value* y = b.map->find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case Value::Kind::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Map m;
      for (const auto& [k, x] : j.items()) m.items.emplace_back(k, from_json(x));
      return Value::of_map(std::move(m));
    }
    default: return Value::none();
  }
}

}  // namespace slidedp::text::jinja
