// IEEE binary16 (safetensors "F16") scalar conversions, the reference for F16 checkpoints.
// half -> float is exact; float -> half rounds to nearest, ties to even, overflows to +-Inf and keeps
// NaN quiet with its sign. Checked exhaustively over all 65536 half values in tests/io.
#pragma once

#include <bit>
#include <cstdint>

namespace slidedp {

inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float magnitude = static_cast<float>(mant) * 0x1p-24f;  // subnormal (or zero): exact in fp32
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));        // rebias 15 -> 127
}

inline uint16_t float_to_half(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a half subnormal, in units of 2^-24. The fp32 value is mant * 2^(e - 150).
    int e = static_cast<int>(abs >> 23);
    int shift = 126 - e;
    if (shift > 24) return sign;  // below 2^-25 (fp32 subnormals included): rounds to zero
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u) != 0)) ++q;  // q == 0x400 is the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t rebiased = abs - (112u << 23);
  uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);  // ties to even at bit 13
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

}  // namespace slidedp
