// Jinja's filters, tests and attribute lookup, and the Python methods on str, list and dict that chat
// templates call, with Python's results (str.split, str.strip, dict.items, ...). Each throws
// InputError naming `where` (the template line) when given what Python would refuse.
#pragma once

#include <string>

#include "text/jinja_value.h"

namespace slidedp::text::jinja {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);

Value apply_filter(const std::string& name, const Value& v, Args& args, const std::string& where);
bool apply_test(const std::string& name, const Value& v, Args& args, const std::string& where);

// `obj.name` as Jinja resolves it: a method of the Python type first (dict.items, str.split, ...),
// then the mapping's key; missing: undefined. Throws on an attribute of an undefined value.
Value get_attr(const Value& obj, const std::string& name, const std::string& where);
// `obj[key]`: the item first (negative list indexes count from the end), then an attribute.
Value get_item(const Value& obj, const Value& key, const std::string& where);
// `obj[start:stop:step]` on a list or a string (Python's slice; an undefined part is omitted).
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, const std::string& where);

// Iteration as a for loop sees it: a list's items, a dict's keys, a string's characters; undefined: none.
List iterate(const Value& v, const std::string& where);

// The characters (code points, as UTF-8 strings) of `s`.
std::vector<std::string> code_points(const std::string& s);

}  // namespace slidedp::text::jinja
