// bfloat16 scalar conversions: the reference every SIMD and CUDA path is tested against.
// fp32 -> bf16 rounds to nearest, ties to even (what PyTorch and CUDA's __float2bfloat16_rn do);
// NaN stays NaN (made quiet, sign kept), +-Inf and signed zeros are exact, subnormals round like
// any other value. bf16 -> fp32 is exact (a shift).
#pragma once

#include <bit>
#include <cstdint>

namespace slidedp {

using bf16_bits = uint16_t;  // raw bfloat16 bits; no arithmetic on them

// An fp32 bit pattern that is a NaN: exponent all ones, mantissa not zero.
inline bool is_nan_bits(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0; }

inline bf16_bits float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (is_nan_bits(u)) {
    return static_cast<bf16_bits>((u >> 16) | 0x0040u);  // NaN: keep sign and top payload, force quiet
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return static_cast<bf16_bits>((u + rounding_bias) >> 16);
}

inline float bf16_to_float(bf16_bits b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Rounds an fp32 value to the nearest bf16-representable fp32 value.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace slidedp
