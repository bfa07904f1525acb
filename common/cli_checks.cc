// Numeric flag checks; see cli_checks.h.
#include "common/cli_checks.h"

#include "common/error.h"
#include "common/units.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace slidedp {

CLI::Validator finite_in(double lo, double hi, const std::string& unit, bool hi_open) {
  const std::string range = fmt::format("a number from {:g} to {:g}{}{}", lo, hi, hi_open ? " (exclusive)" : "",
                                        unit.empty() ? "" : " " + unit);
  const std::string in_help = fmt::format("{:g}..{:g}", lo, hi);  // after the type name: FLOAT:0..1000
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = end != text.c_str() && *end == '\0';
        if (!parsed || !std::isfinite(v) || v < lo || v > hi || (hi_open && v >= hi))
          return fmt::format("must be {} (got {})", range, text);
        return "";
      },
      in_help);
}

CLI::Validator integer_in(long long lo, long long hi, const std::string& unit) {
  const std::string range = fmt::format("a whole number from {} to {}{}", lo, hi, unit.empty() ? "" : " " + unit);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (end == text.c_str() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return fmt::format("must be {} (got {})", range, text);
        return "";
      },
      fmt::format("{}..{}", lo, hi));
}

int64_t budget_bytes_flag(const std::string& text, const char* flag) {
  const int64_t bytes = parse_bytes_flag(text, flag);
  if (bytes <= 0) throw InputError(flag, "must be more than 0 bytes; leave the flag out for the default");
  return bytes;
}

}  // namespace slidedp
