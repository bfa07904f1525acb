// The values a chat template computes with, as Jinja (on Python) has them: undefined, none, booleans,
// integers, floats, strings, lists, mappings that keep their insertion order (Python dicts), a
// namespace() (a mapping whose attributes may be set), and callables (globals such as
// raise_exception, bound methods such as str.split). Printing and tojson follow Python's str() and
// json.dumps byte for byte, since what a template prints is what gets tokenized.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace slidedp::text::jinja {

struct Value;
using List = std::vector<Value>;
struct Map;
struct Args;

// A builtin function or a bound method.
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kMap, kFunction };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                  // kString; kUndefined: the name that was not defined (for messages)
  std::shared_ptr<List> list;     // kList
  std::shared_ptr<Map> map;       // kMap (a namespace is a map with `is_namespace`)
  std::shared_ptr<Function> fn;   // kFunction
  bool tuple = false;             // kList written as a tuple: printed (a, b), otherwise a list
  // Lists and mappings inside one another, this one counted (0: a scalar). Printing, comparing and
  // freeing recurse, so a template cannot nest them past 256 (of_list, of_map throw).
  uint32_t nesting = 0;

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value of_list(List v);
  static Value of_map(Map v);
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_map() const { return kind == Kind::kMap; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i); }
  // An integer argument: ints as they are, floats truncated as Python's int() does, clamped to 64
  // bits (NaN: 0) where Python's would be larger.
  int64_t as_int() const;

  bool truthy() const;
  const char* type_name() const;  // Python's: "str", "int", "list", "dict", "NoneType", ...
};

struct Map {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, keys unique
  bool is_namespace = false;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// A call's arguments: positional, then keyword.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Positional `index`, else keyword `name`, else `fallback`.
  Value get(std::size_t index, const std::string& name, Value fallback = Value::undefined()) const;
};

// Python's str(v) (what {{ v }} prints) and repr(v) (inside lists and dicts).
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// Python's repr of a float: the shortest digits that read back, fixed between 1e-4 and 1e16.
std::string float_repr(double v);
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=False): `indent` < 0 is None.
std::string to_json(const Value& v, int indent = -1);
// Python ==: numbers by value (True == 1), strings, lists and mappings element by element.
bool equal(const Value& a, const Value& b);

// JSON (a conversation line) to a value and back: objects keep their key order.
Value from_json(const nlohmann::ordered_json& j);

}  // namespace slidedp::text::jinja
