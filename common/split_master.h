// An fp32 master weight held as two 16-bit halves: the bf16 mirror the GPUs receive anyway and a
// remainder from which the fp32 value is rebuilt bit for bit, so host state needs 4 bytes per
// parameter for master + mirror instead of 6 (the approach of Transformer Engine's parameter
// remainders).
//
// The trap: with torch's cast (round to nearest, ties to even) the pair cannot be exact. An exact
// tie (low half 0x8000) rounds down from an even upper half and up from an odd one, and both leave an
// even mirror, so the patterns half a bf16 step above and below that mirror would share one pair: 2^16
// + 1 cases for 16 bits. Here the mirror rounds ties toward zero (down in magnitude) instead: the low
// half alone then says which way the value was rounded (above 0x8000: up), and the remainder is
// that low half. The mirror differs from torch's cast only on exact ties with an odd upper half: 32,640
// of the 2^32 patterns (one in 2^17; tests/common/split_master_test.cc checks every pattern).
// +-Inf and signed zeros are exact; a NaN rebuilds as a NaN of the same sign (its mirror is made
// quiet, as torch's cast does), not bit for bit: master weights are never NaN (refused on load).
#pragma once

#include <bit>
#include <cstdint>

#include "common/bf16.h"

namespace slidedp {

struct SplitMaster {
  bf16_bits mirror = 0;     // the value rounded to bf16, ties toward zero
  uint16_t remainder = 0;   // the fp32 pattern's low 16 bits
};

inline SplitMaster split_master(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto low = static_cast<uint16_t>(u & 0xffffu);
  if (is_nan_bits(u)) return {float_to_bf16(f), low};
  // Adding one to the upper half raises the magnitude for either sign (sign-magnitude), carrying into
  // the exponent where the mantissa is full (up to Inf, as torch's cast).
  const auto upper = static_cast<bf16_bits>(u >> 16);
  return {static_cast<bf16_bits>(low > 0x8000u ? upper + 1u : upper), low};
}

inline float join_master(bf16_bits mirror, uint16_t remainder) {
  const uint32_t upper = static_cast<uint32_t>(mirror) << 16;
  if (is_nan_bits(upper)) return std::bit_cast<float>(upper | remainder);  // a NaN mirror: still NaN
  return std::bit_cast<float>(remainder > 0x8000u ? upper - 0x10000u + remainder : upper + remainder);
}

}  // namespace slidedp
