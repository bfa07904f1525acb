// Strict YAML map reader; see yaml_reader.h.
#include "common/yaml_reader.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/units.h"

namespace slidedp {
namespace {

std::string join_path(const std::string& path, const std::string& key) {
  if (key.empty()) return path;
  return path.empty() ? key : path + "." + key;
}

}  // namespace

YamlReader YamlReader::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(path, "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_string(ss.str(), path);
}

YamlReader YamlReader::load_string(const std::string& text, const std::string& origin) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(origin, fmt::format("malformed YAML at line {}, column {}: {}", e.mark.line + 1,
                                         e.mark.column + 1, e.msg));
  }
  if (!node.IsMap()) throw InputError(origin, "expected a YAML map at the top level");
  return YamlReader(node, origin, "");
}

YamlReader::YamlReader(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {
  // yaml-cpp keeps the first of a repeated key silently and takes any node as a key; every map here
  // is a record of named fields, so both are bad input (the key's line, 1-based, in the message).
  check_record_keys(node_, [this](const std::string& key) { return where(key); });
}

void check_record_keys(const YAML::Node& map, const std::function<std::string(const std::string&)>& where_of) {
  if (!map.IsMap()) return;
  std::map<std::string, int> line_of;
  for (const auto& kv : map) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar())
      throw InputError(where_of(""), fmt::format("line {}: a key must be a plain name, not a {}", line,
                                                 kv.first.IsSequence() ? "sequence" : "map"));
    const std::string key = kv.first.Scalar();
    const auto [it, fresh] = line_of.emplace(key, line);
    if (!fresh) throw InputError(where_of(key), fmt::format("given twice (lines {} and {})", it->second, line));
  }
}

std::string YamlReader::where(const std::string& key) const {
  std::string p = join_path(path_, key);
  if (p.empty()) return file_;
  return file_.empty() ? p : file_ + ": " + p;
}

bool YamlReader::has(const std::string& key) const {
  return node_.IsMap() && node_[key] && !node_[key].IsNull();
}

YAML::Node YamlReader::value(const std::string& key) const {
  if (!has(key)) throw InputError(where(key), "missing required key");
  read_.insert(key);
  return node_[key];
}

void YamlReader::skip(const std::string& key) const { read_.insert(key); }

YAML::Node YamlReader::raw(const std::string& key) const { return value(key); }

double YamlReader::number(const std::string& key, double min, double max,
                          const std::string& unit) const {
  YAML::Node v = value(key);
  double x = 0;
  if (!v.IsScalar() || !YAML::convert<double>::decode(v, x) || !std::isfinite(x))
    throw InputError(where(key), fmt::format("expected a finite number in {}", unit));
  if (x < min || x > max)
    throw InputError(where(key), fmt::format("{} {} is out of range [{}, {}]", x, unit, min, max));
  return x;
}

double YamlReader::number_or(const std::string& key, double fallback, double min, double max,
                             const std::string& unit) const {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return number(key, min, max, unit);
}

int64_t YamlReader::integer(const std::string& key, int64_t min, int64_t max) const {
  YAML::Node v = value(key);
  int64_t x = 0;
  double d = 0;
  if (v.IsScalar() && YAML::convert<int64_t>::decode(v, x)) {
  } else if (v.IsScalar() && YAML::convert<double>::decode(v, d) && std::isfinite(d) &&
             d == std::floor(d) && std::fabs(d) < 9.0e18) {
    x = static_cast<int64_t>(d);  // accept 1e6 style integers
  } else {
    throw InputError(where(key), "expected an integer");
  }
  if (x < min || x > max)
    throw InputError(where(key), fmt::format("{} is out of range [{}, {}]", x, min, max));
  return x;
}

int64_t YamlReader::integer_or(const std::string& key, int64_t fallback, int64_t min,
                               int64_t max) const {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return integer(key, min, max);
}

int64_t YamlReader::bytes(const std::string& key, int64_t min) const {
  YAML::Node v = value(key);
  if (!v.IsScalar()) throw InputError(where(key), "expected a byte size such as 80GB or 70GiB");
  int64_t x = 0;
  try {
    x = parse_bytes(v.Scalar());
  } catch (const InputError& e) {
    throw InputError(where(key), e.what());
  }
  if (x < min) throw InputError(where(key), fmt::format("{} bytes is below the minimum {}", x, min));
  return x;
}

int64_t YamlReader::bytes_or(const std::string& key, int64_t fallback, int64_t min) const {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return bytes(key, min);
}

bool YamlReader::boolean(const std::string& key) const {
  YAML::Node v = value(key);
  bool b = false;
  if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b))
    throw InputError(where(key), "expected true or false");
  return b;
}

bool YamlReader::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return boolean(key);
}

std::string YamlReader::text(const std::string& key, const std::vector<std::string>& allowed) const {
  YAML::Node v = value(key);
  if (!v.IsScalar()) throw InputError(where(key), "expected a string");
  std::string s = v.Scalar();
  if (!allowed.empty()) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == s;
    if (!ok) throw InputError(where(key), fmt::format("'{}' is not one of: {}", s, fmt::join(allowed, ", ")));
  }
  return s;
}

std::string YamlReader::text_or(const std::string& key, const std::string& fallback,
                                const std::vector<std::string>& allowed) const {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return text(key, allowed);
}

std::vector<std::string> YamlReader::text_list(const std::string& key) const {
  YAML::Node v = value(key);
  std::vector<std::string> out;
  if (v.IsScalar()) return {v.Scalar()};
  if (!v.IsSequence()) throw InputError(where(key), "expected a list of strings");
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].IsScalar()) throw InputError(where(key) + fmt::format("[{}]", i), "expected a string");
    out.push_back(v[i].Scalar());
  }
  return out;
}

std::vector<double> YamlReader::number_list(const std::string& key, double min, double max,
                                            const std::string& unit) const {
  YAML::Node v = value(key);
  std::vector<double> out;
  auto parse_one = [&](const YAML::Node& n, const std::string& at) {
    double x = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, x) || !std::isfinite(x))
      throw InputError(at, fmt::format("expected a finite number in {}", unit));
    if (x < min || x > max)
      throw InputError(at, fmt::format("{} {} is out of range [{}, {}]", x, unit, min, max));
    out.push_back(x);
  };
  if (v.IsScalar()) {
    parse_one(v, where(key));
  } else if (v.IsSequence()) {
    for (std::size_t i = 0; i < v.size(); ++i) parse_one(v[i], where(key) + fmt::format("[{}]", i));
  } else {
    throw InputError(where(key), "expected a number or a list of numbers");
  }
  return out;
}

YamlReader YamlReader::map(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsMap()) throw InputError(where(key), "expected a map");
  return YamlReader(v, file_, join_path(path_, key));
}

std::optional<YamlReader> YamlReader::optional_map(const std::string& key) const {
  if (!has(key)) {
    read_.insert(key);
    return std::nullopt;
  }
  return map(key);
}

std::vector<YamlReader> YamlReader::map_list(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsSequence()) throw InputError(where(key), "expected a list of maps");
  std::vector<YamlReader> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string p = join_path(path_, key) + fmt::format("[{}]", i);
    if (!v[i].IsMap()) throw InputError(file_ + ": " + p, "expected a map");
    out.emplace_back(v[i], file_, p);
  }
  return out;
}

std::vector<std::string> YamlReader::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : node_) out.push_back(kv.first.as<std::string>());
  return out;
}

void YamlReader::done() const {
  std::vector<std::string> unknown;
  for (const auto& kv : node_) {
    std::string k = kv.first.as<std::string>();
    if (!read_.count(k)) unknown.push_back(k);
  }
  if (unknown.empty()) return;
  std::vector<std::string> known(read_.begin(), read_.end());
  std::string also = unknown.size() > 1 ? fmt::format(" (also unknown: {})",
      fmt::join(std::vector<std::string>(unknown.begin() + 1, unknown.end()), ", ")) : "";
  throw InputError(where(unknown[0]), fmt::format("unknown key{}; accepted keys here: {}", also,
                                                  fmt::join(known, ", ")));
}

}  // namespace slidedp
