#include "text/jinja_builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/error.h"
#include "text/utf8.h"

namespace slidedp::text::jinja {
namespace {

// Python's str.isspace for one code point (what strip() and split() take away).
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw InputError(where, what); }

// What a template may build: no string past 64 MiB (a rendered conversation is kilobytes; a template
// that grows a string without bound is refused rather than left to exhaust memory).
void check_size(double bytes, const std::string& where) {
  if (bytes > 64.0 * 1024 * 1024) fail(where, "a string past 64 MiB");
}

const std::string& need_string(const Value& v, const std::string& where, const char* what) {
  if (!v.is_string()) fail(where, fmt::format("{} needs a string, got {}", what, v.type_name()));
  return v.s;
}

// str.strip / lstrip / rstrip: `chars` undefined or none: Python whitespace; else those code points.
std::string strip(const std::string& s, const Value& chars, bool left, bool right, const std::string& where) {
  std::vector<std::string> cps = code_points(s);
  std::set<std::string> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws)
    for (const std::string& c : code_points(need_string(chars, where, "strip's characters"))) set.insert(c);
  auto drop = [&](const std::string& c) {
    if (!ws) return set.count(c) > 0;
    std::size_t i = 0;
    return python_space(next_code_point(c, i));
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  std::string out;
  for (std::size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

// str.split(sep=None, maxsplit=-1).
List split(const std::string& s, const Value& sep, int64_t maxsplit, const std::string& where) {
  List out;
  if (sep.is_undefined() || sep.is_none()) {
    const std::vector<std::string> cps = code_points(s);
    std::size_t k = 0;
    auto space = [&](std::size_t j) {
      std::size_t i = 0;
      return python_space(next_code_point(cps[j], i));
    };
    while (true) {
      while (k < cps.size() && space(k)) ++k;
      if (k == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest;  // (Python keeps the remainder's trailing whitespace)
        for (std::size_t j = k; j < cps.size(); ++j) rest += cps[j];
        out.push_back(Value::string(rest));
        break;
      }
      std::string word;
      while (k < cps.size() && !space(k)) word += cps[k++];
      out.push_back(Value::string(word));
    }
    return out;
  }
  const std::string& d = need_string(sep, where, "split's separator");
  if (d.empty()) fail(where, "split: empty separator");
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) ? std::string::npos : s.find(d, pos);
    if (at == std::string::npos) {
      out.push_back(Value::string(s.substr(pos)));
      break;
    }
    out.push_back(Value::string(s.substr(pos, at - pos)));
    pos = at + d.size();
  }
  return out;
}

std::string replace_all(std::string s, const std::string& a, const std::string& b, int64_t count, const std::string& where) {
  const double matches = a.empty() ? static_cast<double>(s.size()) + 1 : static_cast<double>(s.size()) / static_cast<double>(a.size());
  check_size(static_cast<double>(s.size()) + matches * static_cast<double>(b.size()), where);
  if (a.empty()) {
    // Python inserts `b` around every code point.
    std::string out = b;
    int64_t n = 1;
    for (const std::string& c : code_points(s)) {
      out += c;
      if (count < 0 || n < count) out += b, ++n;
    }
    return out;
  }
  std::size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const std::size_t at = s.find(a, pos);
    if (at == std::string::npos) break;
    s.replace(at, a.size(), b);
    pos = at + b.size();
  }
  return s;
}

std::string upper_or_lower(const std::string& s, bool upper) {
  std::string out = s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(upper ? std::toupper(c) : std::tolower(c));
  return out;
}

Value method(Function f) { return Value::function(std::move(f)); }

// A Python tuple of two (dict.items() yields them).
Value pair(Value a, Value b) {
  Value t = Value::of_list({std::move(a), std::move(b)});
  t.tuple = true;
  return t;
}

int64_t int_arg(const Value& v, int64_t fallback) { return v.is_undefined() || v.is_none() ? fallback : v.as_int(); }

Value string_method(const std::string& s, const std::string& name, const std::string& where) {
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method([s, start, where](Args& a) {
      const Value p = a.get(0, "prefix");
      auto one = [&](const Value& x) {
        const std::string& t = need_string(x, where, start ? "startswith" : "endswith");
        return start ? s.compare(0, t.size(), t) == 0 && s.size() >= t.size()
                     : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
      };
      if (p.is_list()) {
        for (const Value& x : *p.list)
          if (one(x)) return Value::boolean(true);
        return Value::boolean(false);
      }
      return Value::boolean(one(p));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r, where](Args& a) { return Value::string(strip(s, a.get(0, "chars"), l, r, where)); });
  }
  if (name == "split")
    return method([s, where](Args& a) { return Value::of_list(split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1), where)); });
  if (name == "replace")
    return method([s, where](Args& a) {
      return Value::string(replace_all(s, need_string(a.get(0, "old"), where, "replace"), need_string(a.get(1, "new"), where, "replace"),
                                       int_arg(a.get(2, "count"), -1), where));
    });
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return method([s, up](Args&) { return Value::string(upper_or_lower(s, up)); });
  }
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return method([s, title](Args&) {
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
        if (alpha && start) c = static_cast<char>(std::toupper(c));
        else if (alpha) c = static_cast<char>(std::tolower(c));
        start = title ? !alpha : false;
      }
      return Value::string(out);
    });
  }
  if (name == "find" || name == "count")
    return method([s, name, where](Args& a) {
      const Value sub = a.get(0, "sub");  // (held: need_string returns a reference into it)
      const std::string& t = need_string(sub, where, "find");
      if (name == "find") {
        const std::size_t at = s.find(t);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_points(s.substr(0, at)).size()));
      }
      int64_t n = 0;
      for (std::size_t at = s.find(t); at != std::string::npos && !t.empty(); at = s.find(t, at + t.size())) ++n;
      return Value::integer(n);
    });
  if (name == "join")
    return method([s, where](Args& a) {
      std::string out;
      bool first = true;
      for (const Value& x : iterate(a.get(0, "iterable"), where)) {
        out += (first ? "" : s) + need_string(x, where, "str.join");
        first = false;
      }
      return Value::string(out);
    });
  return Value::undefined(name);
}

Value dict_method(const std::shared_ptr<Map>& m, const std::string& name) {
  if (name == "items")
    return method([m](Args&) {
      List out;
      for (const auto& [k, v] : m->items) out.push_back(pair(Value::string(k), v));
      return Value::of_list(out);
    });
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return method([m, keys](Args&) {
      List out;
      for (const auto& [k, v] : m->items) out.push_back(keys ? Value::string(k) : v);
      return Value::of_list(out);
    });
  }
  if (name == "get")
    return method([m](Args& a) {
      const Value key = a.get(0, "key");
      const Value* v = key.is_string() ? m->find(key.s) : nullptr;
      return v ? *v : a.get(1, "default", Value::none());
    });
  return Value::undefined(name);
}

int64_t length_of(const Value& v, const std::string& where) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(code_points(v.s).size());
    case Value::Kind::kList: return static_cast<int64_t>(v.list->size());
    case Value::Kind::kMap: return static_cast<int64_t>(v.map->items.size());
    default: fail(where, fmt::format("length of a {}", v.type_name()));
  }
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {"trim", "tojson", "length", "count", "string", "upper", "lower", "title",
                                              "capitalize", "default", "d", "first", "last", "join", "replace", "list",
                                              "items", "reverse", "int", "float", "abs", "round", "unique", "map",
                                              "select", "reject", "selectattr", "rejectattr", "safe", "dictsort", "sum",
                                              "min", "max", "indent", "wordcount", "center", "batch", "sort"};
  return names;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                              "number", "string", "mapping", "iterable", "sequence", "callable", "even",
                                              "odd", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "<", "le",
                                              "<=", "gt", ">", "ge", ">=", "in", "lower", "upper", "sameas"};
  return names;
}

bool less(const Value& a, const Value& b, const std::string& where) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.s < b.s;
  fail(where, fmt::format("'<' between {} and {}", a.type_name(), b.type_name()));
}

}  // namespace

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = std::min(utf8_length(static_cast<uint8_t>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool is_test(const std::string& name) { return test_names().count(name) > 0; }

List iterate(const Value& v, const std::string& where) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kMap: {
      List out;
      for (const auto& [k, x] : v.map->items) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::kString: {
      List out;
      for (const std::string& c : code_points(v.s)) out.push_back(Value::string(c));
      return out;
    }
    default: fail(where, fmt::format("a {} is not iterable", v.type_name()));
  }
}

Value get_attr(const Value& obj, const std::string& name, const std::string& where) {
  switch (obj.kind) {
    case Value::Kind::kUndefined:
      fail(where, fmt::format("'{}' is undefined (its attribute '{}' was asked for)", obj.s.empty() ? "a value" : obj.s, name));
    case Value::Kind::kString: return string_method(obj.s, name, where);
    case Value::Kind::kMap: {
      if (!obj.map->is_namespace) {
        const Value m = dict_method(obj.map, name);
        if (!m.is_undefined()) return m;
      }
      const Value* v = obj.map->find(name);
      return v ? *v : Value::undefined(name);
    }
    default: return Value::undefined(name);
  }
}

Value get_item(const Value& obj, const Value& key, const std::string& where) {
  if (obj.is_undefined())
    fail(where, fmt::format("'{}' is undefined (an item of it was asked for)", obj.s.empty() ? "a value" : obj.s));
  if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
    const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(code_points(obj.s).size());
    int64_t k = key.kind == Value::Kind::kBool ? key.b : key.i;
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined();
    return obj.is_list() ? (*obj.list)[static_cast<std::size_t>(k)] : Value::string(code_points(obj.s)[static_cast<std::size_t>(k)]);
  }
  if (obj.is_map() && key.is_string()) {
    const Value* v = obj.map->find(key.s);
    if (v) return *v;
  }
  if (key.is_string()) return get_attr(obj, key.s, where);
  return Value::undefined();
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v, const std::string& where) {
  if (!obj.is_list() && !obj.is_string()) fail(where, fmt::format("a {} cannot be sliced", obj.type_name()));
  const std::vector<std::string> cps = obj.is_string() ? code_points(obj.s) : std::vector<std::string>{};
  const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(cps.size());
  const int64_t step = int_arg(step_v, 1);
  if (step == 0) fail(where, "slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    int64_t k = int_arg(v, 0);
    if (k < 0) {
      k += n;
      if (k < 0) k = step < 0 ? -1 : 0;
    } else if (k >= n) {
      k = step < 0 ? n - 1 : n;
    }
    return k;
  };
  const int64_t b = adjust(start, step < 0 ? n - 1 : 0), e = adjust(stop, step < 0 ? -1 : n);
  // Counted, not stepped to the end: b + step may pass int64 for a huge step.
  const uint64_t magnitude = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
  const int64_t span = step > 0 ? e - b : b - e;
  const int64_t count = span > 0 ? static_cast<int64_t>((static_cast<uint64_t>(span) - 1) / magnitude + 1) : 0;
  List items;
  std::string text;
  int64_t k = b;
  for (int64_t i = 0; i < count; ++i) {
    if (obj.is_list()) items.push_back((*obj.list)[static_cast<std::size_t>(k)]);
    else text += cps[static_cast<std::size_t>(k)];
    if (i + 1 < count) k += step;
  }
  return obj.is_list() ? Value::of_list(std::move(items)) : Value::string(text);
}

bool apply_test(const std::string& name, const Value& v, Args& a, const std::string& where) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_map();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_map();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_map();
  if (name == "callable") return v.kind == K::kFunction;
  if (name == "lower") return v.is_string() && upper_or_lower(v.s, false) == v.s;
  if (name == "upper") return v.is_string() && upper_or_lower(v.s, true) == v.s;
  if (name == "even" || name == "odd") {
    if (v.kind != K::kInt) fail(where, fmt::format("'{}' test of a {}", name, v.type_name()));
    return (((v.i % 2) + 2) % 2 == 0) == (name == "even");
  }
  const Value x = a.get(0, "value");
  if (name == "divisibleby") {
    const int64_t d = int_arg(x, 1);
    return d != 0 && (d == -1 || int_arg(v, 0) % d == 0);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, x);
  if (name == "ne" || name == "!=") return !equal(v, x);
  if (name == "lt" || name == "<") return less(v, x, where);
  if (name == "le" || name == "<=") return !less(x, v, where);
  if (name == "gt" || name == ">") return less(x, v, where);
  if (name == "ge" || name == ">=") return !less(v, x, where);
  if (name == "sameas") return v.kind == x.kind && (v.kind == K::kNone || v.kind == K::kUndefined || equal(v, x));
  if (name == "in") {
    if (x.is_string()) return v.is_string() && x.s.find(v.s) != std::string::npos;
    for (const Value& y : iterate(x, where))
      if (equal(v, y)) return true;
    return false;
  }
  fail(where, fmt::format("unknown test '{}'", name));
}

namespace {

Value filter_tojson(const Value& v, Args& a, const std::string& where) {
  const Value indent = a.get(0, "indent");
  if (indent.is_undefined() || indent.is_none()) return Value::string(to_json(v));
  // (json.dumps reads a negative indent as 0: newlines, no spaces; past 1024 it is refused here.)
  const int64_t spaces = std::max<int64_t>(0, int_arg(indent, 0));
  if (spaces > 1024) fail(where, fmt::format("tojson indent {} (at most 1024)", spaces));
  return Value::string(to_json(v, static_cast<int>(spaces)));
}

Value filter_join(const Value& v, Args& a, const std::string& where) {
  const std::string sep =
      a.get(0, "d", Value::string("")).is_string() ? a.get(0, "d", Value::string("")).s : "";
  const Value attr = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v, where)) {
    out += (first ? "" : sep) + to_str(attr.is_undefined() ? x : get_item(x, attr, where));
    first = false;
  }
  return Value::string(out);
}

Value filter_dictsort(const Value& v, const std::string& where) {
  if (!v.is_map()) fail(where, fmt::format("dictsort of a {}", v.type_name()));
  List out;
  for (const auto& [k, x] : v.map->items) out.push_back(pair(Value::string(k), x));
  std::stable_sort(out.begin(), out.end(), [](const Value& p, const Value& q) {
    return upper_or_lower((*p.list)[0].s, false) < upper_or_lower((*q.list)[0].s, false);
  });
  return Value::of_list(out);
}

Value filter_reverse(const Value& v, const std::string& where) {
  if (v.is_string()) return slice(v, Value::undefined(), Value::undefined(), Value::integer(-1), where);
  List items = iterate(v, where);
  std::reverse(items.begin(), items.end());
  return Value::of_list(items);
}

Value filter_int(const Value& v, Args& a) {
  using K = Value::Kind;
  if (v.kind == K::kInt) return v;
  if (v.is_number()) return Value::integer(v.as_int());
  try {
    return Value::integer(std::stoll(to_str(v)));
  } catch (...) {
    return a.get(0, "default", Value::integer(0));
  }
}

Value filter_float(const Value& v, Args& a) {
  if (v.is_number()) return Value::number(v.as_double());
  try {
    return Value::number(std::stod(to_str(v)));
  } catch (...) {
    return a.get(0, "default", Value::number(0));
  }
}

Value filter_abs(const Value& v, const std::string& where) {
  using K = Value::Kind;
  if (v.kind == K::kInt && v.i == INT64_MIN) fail(where, "integer overflow in abs");
  if (v.kind == K::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
  return Value::number(std::fabs(v.as_double()));
}

Value filter_sum(const Value& v, const std::string& where) {
  using K = Value::Kind;
  double total = 0;
  bool all_int = true;
  int64_t itotal = 0;
  for (const Value& x : iterate(v, where)) {
    if (!x.is_number()) fail(where, "sum of a non-number");
    all_int = all_int && x.kind != K::kFloat;
    if (x.kind != K::kFloat && __builtin_add_overflow(itotal, x.as_int(), &itotal))
      fail(where, "integer overflow in sum");
    total += x.as_double();
  }
  return all_int ? Value::integer(itotal) : Value::number(total);
}

Value filter_ordering(const std::string& name, const Value& v, Args& a, const std::string& where) {
  List items = iterate(v, where);
  if (name == "unique") {
    List out;
    for (const Value& x : items)
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value::of_list(out);
  }
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& p, const Value& q) { return less(p, q, where); });
  if (name == "sort") {
    if (a.get(0, "reverse").truthy()) std::reverse(items.begin(), items.end());
    return Value::of_list(items);
  }
  if (items.empty()) return Value::undefined();
  return name == "min" ? items.front() : items.back();
}

Value filter_map_or_select(const std::string& name, const Value& v, Args& a, const std::string& where) {
  const List items = iterate(v, where);
  List out;
  const bool by_attr = name == "selectattr" || name == "rejectattr" ||
                       (name == "map" && !a.get(0, "attribute").is_undefined() && a.positional.empty());
  for (const Value& x : items) {
    if (name == "map") {
      if (by_attr) {
        out.push_back(get_item(x, a.get(0, "attribute"), where));
      } else {
        Args rest;
        rest.positional.assign(a.positional.begin() + 1, a.positional.end());
        rest.keyword = a.keyword;
        out.push_back(apply_filter(to_str(a.get(0, "filter")), x, rest, where));
      }
      continue;
    }
    const Value subject = by_attr ? get_item(x, a.get(0, "attribute"), where) : x;
    const std::size_t test_at = by_attr ? 1 : 0;
    bool ok;
    if (a.positional.size() <= test_at) {
      ok = subject.truthy();
    } else {
      Args rest;
      rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(test_at) + 1,
                             a.positional.end());
      ok = apply_test(to_str(a.positional[test_at]), subject, rest, where);
    }
    if (ok == (name == "select" || name == "selectattr")) out.push_back(x);
  }
  return Value::of_list(out);
}

Value filter_indent(const Value& v, Args& a, const std::string& where) {
  const int64_t width = int_arg(a.get(0, "width"), 4);
  check_size(static_cast<double>(width) * static_cast<double>(to_str(v).size() + 1), where);
  const bool first = a.get(1, "first", Value::boolean(false)).truthy();
  const bool blank = a.get(2, "blank", Value::boolean(false)).truthy();
  const std::string pad(static_cast<std::size_t>(std::max<int64_t>(0, width)), ' ');
  const std::string s = to_str(v);
  std::string out;
  std::size_t pos = 0;
  bool first_line = true;
  while (true) {
    const std::size_t nl = s.find('\n', pos);
    const std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if ((first_line ? first : true) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    pos = nl + 1;
    first_line = false;
  }
  return Value::string(out);
}

Value filter_center(const Value& v, Args& a, const std::string& where) {
  const int64_t width = int_arg(a.get(0, "width"), 80);
  check_size(static_cast<double>(width), where);
  const std::string s = to_str(v);
  const int64_t n = static_cast<int64_t>(code_points(s).size());
  if (n >= width) return Value::string(s);
  const int64_t left = (width - n) / 2 + ((width - n) % 2 & width % 2);
  return Value::string(std::string(static_cast<std::size_t>(left), ' ') + s +
                       std::string(static_cast<std::size_t>(width - n - left), ' '));
}

Value filter_batch(const Value& v, Args& a, const std::string& where) {
  const int64_t size = std::max<int64_t>(1, int_arg(a.get(0, "linecount"), 1));
  List out, cur;
  for (const Value& x : iterate(v, where)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == size) out.push_back(Value::of_list(cur)), cur.clear();
  }
  if (!cur.empty()) out.push_back(Value::of_list(cur));
  return Value::of_list(out);
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, Args& a, const std::string& where) {
  if (name == "safe") return v;
  if (name == "trim")
    return Value::string(strip(need_string(v, where, "trim"), a.get(0, "chars"), true, true, where));
  if (name == "tojson") return filter_tojson(v, a, where);
  if (name == "length" || name == "count") return Value::integer(length_of(v, where));
  if (name == "string") return Value::string(to_str(v));
  if (name == "upper" || name == "lower") return Value::string(upper_or_lower(to_str(v), name == "upper"));
  if (name == "title" || name == "capitalize") {
    Args none;
    return (*string_method(to_str(v), name, where).fn)(none);
  }
  if (name == "default" || name == "d") {
    const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
    return (v.is_undefined() || (boolean && !v.truthy())) ? a.get(0, "default_value", Value::string("")) : v;
  }
  if (name == "first" || name == "last") {
    const List items = iterate(v, where);
    if (items.empty()) return Value::undefined();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") return filter_join(v, a, where);
  if (name == "replace")
    return Value::string(replace_all(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                     int_arg(a.get(2, "count"), -1), where));
  if (name == "list") return Value::of_list(iterate(v, where));
  if (name == "items") {
    if (!v.is_map()) fail(where, fmt::format("items of a {}", v.type_name()));
    Args none;
    return (*get_attr(v, "items", where).fn)(none);
  }
  if (name == "dictsort") return filter_dictsort(v, where);
  if (name == "reverse") return filter_reverse(v, where);
  if (name == "int") return filter_int(v, a);
  if (name == "float") return filter_float(v, a);
  if (name == "abs") return filter_abs(v, where);
  if (name == "round") {
    const int64_t digits = int_arg(a.get(0, "precision"), 0);
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Value::number(std::nearbyint(v.as_double() * scale) / scale);
  }
  if (name == "sum") return filter_sum(v, where);
  if (name == "min" || name == "max" || name == "sort" || name == "unique")
    return filter_ordering(name, v, a, where);
  if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return filter_map_or_select(name, v, a, where);
  if (name == "indent") return filter_indent(v, a, where);
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(split(to_str(v), Value::undefined(), -1, where).size()));
  if (name == "center") return filter_center(v, a, where);
  if (name == "batch") return filter_batch(v, a, where);
  fail(where, fmt::format("unknown filter '{}'", name));
}

}  // namespace slidedp::text::jinja
