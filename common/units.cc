// Quantity parsing and formatting; see units.h.
#include "common/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <string_view>

#include "common/error.h"

namespace slidedp {

int64_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    throw InputError("", fmt::format("'{}' is not a byte size (examples: 80GB, 70GiB, 1.5e9)", text));
  }
  std::string unit;
  for (std::size_t i = pos; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit.push_back(text[i]);
  double scale = 0;
  struct Suffix {
    std::string_view name;
    double scale;
  };
  static constexpr Suffix kSuffixes[] = {
      {"", 1},           {"B", 1},          {"k", 1e3},         {"K", 1e3},         {"kB", 1e3},
      {"KB", 1e3},       {"M", 1e6},        {"MB", 1e6},        {"G", 1e9},         {"GB", 1e9},
      {"T", 1e12},       {"TB", 1e12},      {"KiB", 1024.0},    {"MiB", 1048576.0}, {"GiB", kGiB},
      {"TiB", kGiB * 1024.0},
  };
  for (const auto& s : kSuffixes)
    if (unit == s.name) scale = s.scale;
  if (scale == 0 || !std::isfinite(value) || value < 0)
    throw InputError("", fmt::format("'{}' is not a byte size (examples: 80GB, 70GiB, 1.5e9)", text));
  double bytes = value * scale;
  if (bytes > 9.0e18) throw InputError("", fmt::format("'{}' is too large", text));
  return static_cast<int64_t>(std::llround(bytes));
}

int64_t parse_bytes_flag(const std::string& text, const std::string& flag) {
  try {
    return parse_bytes(text);
  } catch (const InputError& e) {
    throw InputError(flag, e.what());
  }
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.2f} {}", v, units[i]);
}

std::string format_seconds(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s < 1e-6) return fmt::format("{:.1f} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 120.0) return fmt::format("{:.2f} s", s);
  if (s < 7200.0) return fmt::format("{}m {:02d}s", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  return fmt::format("{}h {:02d}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

std::string format_si(double v, const std::string& unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 6) {
    v /= 1000.0;
    ++i;
  }
  return fmt::format("{:.3g} {}{}", v, prefixes[i], unit);
}

std::string format_count(double v) {
  if (v >= 1e9) return fmt::format("{:.2f} B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

}  // namespace slidedp
