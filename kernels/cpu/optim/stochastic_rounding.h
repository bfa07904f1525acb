// Stochastic rounding of fp32 to bf16 for the optimizer's bf16 moments (adamw.h): a value between two
// bf16 neighbours becomes the upper one with probability equal to its distance from the lower one, so
// the rounding is unbiased. Round-to-nearest is not: AdamW's v moves by (1 - beta2) = 0.1% of itself
// per step with torch's default beta2 = 0.999, less than half a bf16 step (2^-9 of it), so a
// nearest-rounded v would never decay. The noise is a counter-based hash of (seed, element index), so a
// run is reproducible and every SIMD level rounds every element the same way.
#pragma once

#include <bit>
#include <cstdint>

#include "common/bf16.h"

namespace slidedp::kernels {

// lowbias32 (a bijective 32-bit mixer, Chris Wellons' hash-prospector): noise for element `index`.
inline uint32_t rounding_noise(uint32_t seed, uint32_t index) {
  uint32_t x = index ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The fp32 pattern plus 16 bits of noise, truncated: rounds the magnitude up with probability (low
// half) / 2^16 for either sign. NaN is made quiet as common/bf16.h does; Inf stays Inf.
inline bf16_bits float_to_bf16_stochastic(float f, uint32_t noise) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (is_nan_bits(u)) return float_to_bf16(f);
  return static_cast<bf16_bits>((u + (noise >> 16)) >> 16);
}

// The seeds of one update call's two moments: different per moment, optimizer step and unit.
inline uint32_t moment_seed(int64_t step, int unit, int moment) {
  return rounding_noise(static_cast<uint32_t>(step) * 0x9e3779b9u ^ static_cast<uint32_t>(moment),
                        static_cast<uint32_t>(unit) * 0x85ebca6bu);
}

}  // namespace slidedp::kernels
