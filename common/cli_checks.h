// Range checks of numeric flags that say the range in plain numbers. CLI11's PositiveNumber lets NaN
// and infinities through and its Range prints DBL_MAX in full; a value the code then divides by or
// paces with must be finite and inside what keeps clocks and divisions making progress.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace slidedp {

// A finite number in [lo, hi] ([lo, hi) when `hi_open`), `unit` appended to the message ("seconds").
CLI::Validator finite_in(double lo, double hi, const std::string& unit = "", bool hi_open = false);

// A whole number in [lo, hi], written without a fraction or an exponent; a number beyond the range of a
// 64-bit integer is refused rather than clamped.
CLI::Validator integer_in(long long lo, long long hi, const std::string& unit = "");

// A memory budget given to `flag` (bytes, or with a unit: 70GiB), more than 0: inside, 0 means "no
// budget given", which a user's 0 must not silently become. Throws InputError naming `flag`.
int64_t budget_bytes_flag(const std::string& text, const char* flag);

}  // namespace slidedp
