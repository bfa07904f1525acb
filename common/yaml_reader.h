// Strict reading of YAML maps (STYLE habit 6): every value is checked for type and range, errors name
// the file, the key path and the expected unit, and done() rejects keys nobody read, so a typo such
// as `chunk_numell` is an error instead of a silently ignored default.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace slidedp {

// yaml-cpp takes any node as a key and keeps the first of a repeated key silently; in a record of
// named fields both are bad input. Throws InputError at where_of(key) ("" for the map itself) with
// the key's line (1-based). YamlReader checks every map it reads; raw nodes merged elsewhere (sweep
// spec overrides) call it themselves.
void check_record_keys(const YAML::Node& map, const std::function<std::string(const std::string&)>& where_of);

class YamlReader {
 public:
  // Parses a file or a string; the origin names it in errors. Throws IoError / InputError.
  static YamlReader load_file(const std::string& path);
  static YamlReader load_string(const std::string& text, const std::string& origin);

  YamlReader(YAML::Node node, std::string file, std::string path);

  bool has(const std::string& key) const;
  // Numbers: `unit` is only for the message ("GB/s", "bytes", "seconds").
  double number(const std::string& key, double min, double max, const std::string& unit) const;
  double number_or(const std::string& key, double fallback, double min, double max,
                   const std::string& unit) const;
  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;
  // Byte sizes: a number or a string with a unit ("80GB", "70GiB", "512 MiB").
  int64_t bytes(const std::string& key, int64_t min = 0) const;
  int64_t bytes_or(const std::string& key, int64_t fallback, int64_t min = 0) const;
  bool boolean(const std::string& key) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  // Strings; a non-empty `allowed` restricts the value to that set.
  std::string text(const std::string& key, const std::vector<std::string>& allowed = {}) const;
  std::string text_or(const std::string& key, const std::string& fallback,
                      const std::vector<std::string>& allowed = {}) const;
  std::vector<std::string> text_list(const std::string& key) const;
  std::vector<double> number_list(const std::string& key, double min, double max,
                                  const std::string& unit) const;
  YamlReader map(const std::string& key) const;
  std::optional<YamlReader> optional_map(const std::string& key) const;
  std::vector<YamlReader> map_list(const std::string& key) const;
  // Keys of this map in document order (for maps whose keys are data, e.g. thread counts).
  std::vector<std::string> keys() const;
  // Marks a key as read without interpreting it (free-form notes such as `sources`).
  void skip(const std::string& key) const;
  // Raw node access for callers that interpret a value themselves; marks the key read.
  YAML::Node raw(const std::string& key) const;

  // Throws InputError naming every key that was present but never read.
  void done() const;

  // "file: path.key" for messages.
  std::string where(const std::string& key = "") const;
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  YAML::Node value(const std::string& key) const;  // throws if missing
  YAML::Node node_;
  std::string file_;
  std::string path_;
  mutable std::set<std::string> read_;
};

}  // namespace slidedp
