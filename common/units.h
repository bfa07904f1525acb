// Parsing and printing of quantities with units: byte sizes ("70GiB", "80GB"), durations and rates.
// Decimal prefixes (GB = 1e9) and binary prefixes (GiB = 2^30) are both accepted, as users write both.
#pragma once

#include <cstdint>
#include <string>

namespace slidedp {

// "123", "1.5e9", "80GB", "70 GiB", "512MiB", "4k" -> bytes. Throws InputError on anything else.
int64_t parse_bytes(const std::string& text);
// The same for the value of a command-line flag, named in the error.
int64_t parse_bytes_flag(const std::string& text, const std::string& flag);

std::string format_bytes(double bytes);         // "1.50 GiB"
std::string format_seconds(double seconds);     // "12.3 ms", "4.56 s", "1h 02m"
std::string format_si(double value, const std::string& unit);  // "1.23 G" + unit
std::string format_count(double value);         // "14.77 B" for parameter counts

constexpr double kGB = 1e9;    // links and bandwidths are quoted in decimal GB/s everywhere
constexpr double kGiB = 1073741824.0;
constexpr double kBf16Bytes = 2.0;  // bytes of one bf16 element, in byte counts held as doubles
constexpr double kFp32Bytes = 4.0;

}  // namespace slidedp
