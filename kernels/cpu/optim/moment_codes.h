// The 8-bit codes of AdamW's blockwise-quantized moments (--optimizer-states 8bit, adamw.h): every
// block of kQ8Block elements keeps one fp32 scale per moment (the block's largest magnitude) and one
// byte per element, a small float relative to that scale. A floating code rather than a linear one,
// because a block's v spans many decades (squares of gradients) and its small entries set the step
// size: m is sign + 4-bit exponent + 3-bit fraction (relative magnitudes 2^-17 .. 1), v, never
// negative, 5-bit exponent + 3-bit fraction (2^-33 .. 1); both with subnormals, rounded to nearest,
// ties to an even fraction, which the encoder does with integer arithmetic on the fp32 pattern, so
// the code needs no table search and every SIMD level gives the same bytes. The largest element of a
// block encodes to exactly 1, so a block's scale is its largest value, to the bit.
//
// Internal linkage: included by kernel files built with different target flags (kernel_table.h).
#pragma once

#include <cstdint>

#include "common/q8_block.h"

namespace slidedp::kernels {
namespace {

// A code's magnitude: kExpBits of exponent over 3 of fraction, the exponent field's top value the
// binade [1, 2) (so the largest code is 1.875, and 1 the largest a block uses).
template <int kExpBits>
struct MagnitudeCode {
  static constexpr int32_t kBias = (1 << kExpBits) - 1;
  static constexpr uint32_t kMaxCode = (1u << (kExpBits + 3)) - 1;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - kBias) << 23;  // 2^(1 - bias)

  // y >= 0 (the sign bit is ignored) -> the nearest code; NaN and values past 1.875 saturate.
  static uint32_t encode(float y) {
    const uint32_t bits = __builtin_bit_cast(uint32_t, y) & 0x7fffffffu;
    // Normal: round the fp32 fraction to 3 bits (ties to even), then rebias the exponent.
    const uint32_t rounded = bits + 0x7ffffu + ((bits >> 20) & 1u);
    const int32_t normal = static_cast<int32_t>(rounded >> 20) - ((127 - kBias) << 3);
    // Subnormal: multiples of 2^(-2 - bias), rounded to nearest even by the 2^23 trick (exact below 2^22).
    float scaled = __builtin_bit_cast(float, bits) * kSubnormalInverseStep;
    scaled = scaled < 16.0f ? scaled : 16.0f;  // keeps the unused lanes' conversion defined
    const auto subnormal = static_cast<int32_t>((scaled + 0x1p23f) - 0x1p23f);
    const int32_t saturated = normal > static_cast<int32_t>(kMaxCode) ? static_cast<int32_t>(kMaxCode) : normal;
    return static_cast<uint32_t>(bits < kMinNormalBits ? subnormal : saturated);
  }

  static float decode(uint32_t code) {
    const float subnormal = static_cast<float>(static_cast<int32_t>(code)) * kSubnormalStep;
    const float normal = __builtin_bit_cast(float, (code + ((127 - kBias) << 3)) << 20);
    return code >= 8 ? normal : subnormal;
  }

  static constexpr float kSubnormalStep = 1.0f / static_cast<float>(int64_t{1} << (kBias + 2));
  static constexpr float kSubnormalInverseStep = static_cast<float>(int64_t{1} << (kBias + 2));
};

using FirstMomentMagnitude = MagnitudeCode<4>;   // m: the sign in bit 7
using SecondMomentMagnitude = MagnitudeCode<5>;  // v >= 0: all 8 bits

// m / scale in [-1, 1] <-> its byte (the caller multiplies by the scale).
struct FirstMomentCode {
  static uint8_t encode(float y) {
    const uint32_t sign = __builtin_bit_cast(uint32_t, y) >> 31;
    return static_cast<uint8_t>((sign << 7) | FirstMomentMagnitude::encode(y));
  }
  static float decode(uint8_t code) {
    const float magnitude = FirstMomentMagnitude::decode(code & 0x7fu);
    return __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, magnitude) | (uint32_t{code} >> 7 << 31));
  }
};

// v / scale in [0, 1] <-> its byte.
struct SecondMomentCode {
  static uint8_t encode(float y) { return static_cast<uint8_t>(SecondMomentMagnitude::encode(y)); }
  static float decode(uint8_t code) { return SecondMomentMagnitude::decode(code); }
};

// One block's n <= kQ8Block values from their codes and scale.
template <class Code>
void decode_q8_block(const uint8_t* codes, float scale, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = Code::decode(codes[j]) * scale;
}

// One block's n values to codes and their scale, the largest magnitude (compared as fp32 patterns,
// which order non-negative floats; a NaN gives a NaN scale). A scale too small for its reciprocal to
// be finite divides instead; a block of zeros has scale 0 and zero codes.
template <class Code>
void encode_q8_block(const float* in, int64_t n, uint8_t* codes, float* scale) {
  uint32_t top_bits = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t a = __builtin_bit_cast(uint32_t, in[j]) & 0x7fffffffu;
    top_bits = a > top_bits ? a : top_bits;
  }
  const float top = __builtin_bit_cast(float, top_bits);
  *scale = top;
  const float inverse = 1.0f / top;
  if (top_bits == 0) {
    for (int64_t j = 0; j < n; ++j) codes[j] = 0;
  } else if (inverse < 0x1p127f) {
    for (int64_t j = 0; j < n; ++j) codes[j] = Code::encode(in[j] * inverse);
  } else {
    for (int64_t j = 0; j < n; ++j) codes[j] = Code::encode(in[j] / top);
  }
}

}  // namespace
}  // namespace slidedp::kernels
