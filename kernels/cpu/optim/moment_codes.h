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
// The code is written once over "lanes": one value (ScalarLanes: the scalar reference, checkpoint
// conversion) or a GCC vector of kW values (VectorLanes: the SIMD levels, built with their own target
// flags), branch-free, selects done with masks, so both run the same operations per element.
// Internal linkage: included by kernel files built with different target flags (kernel_table.h).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "common/q8_block.h"

namespace slidedp::kernels {
namespace {

struct ScalarLanes {
  static constexpr int kW = 1;
  using U = uint32_t;
  using I = int32_t;
  using F = float;
  static U splat(uint32_t x) { return x; }
  static F splat(float x) { return x; }
  static U mask(bool c) { return c ? 0xffffffffu : 0u; }
  static I as_int(U u) { return static_cast<I>(u); }
  static U as_uint(I i) { return static_cast<U>(i); }
  static U bits(F f) { return __builtin_bit_cast(U, f); }
  static F from_bits(U u) { return __builtin_bit_cast(F, u); }
  static I to_int(F f) { return static_cast<I>(f); }
  static F to_float(I i) { return static_cast<F>(i); }
  static U load_bytes(const uint8_t* p) { return *p; }
  static void store_bytes(uint8_t* p, U u) { *p = static_cast<uint8_t>(u); }
  static U max_lane(U u) { return u; }
};

// GCC vector types of 8 and 16 lanes (an attribute's size cannot depend on a template parameter).
template <int kLanes>
struct LaneTypes;
// Bytes to and from 32-bit lanes with the widening and narrowing moves (GCC's generic conversion
// goes through scalar registers); declared only where the file's target flags allow them.
template <>
struct LaneTypes<8> {
  typedef uint32_t U __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  typedef float F __attribute__((vector_size(32)));
#ifdef __AVX2__
  static U load_bytes(const uint8_t* p) {
    return __builtin_bit_cast(U, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_bytes(uint8_t* p, U u) {  // lanes hold 0..255
    const __m256i v = __builtin_bit_cast(__m256i, u);
    const __m256i words = _mm256_packus_epi32(v, v);          // per 128 bits: lanes 0-3 (4-7) twice
    const __m256i bytes = _mm256_packus_epi16(words, words);  // per 128 bits: their bytes in the low 4
    const __m256i both = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(both));
  }
#endif
};
template <>
struct LaneTypes<16> {
  typedef uint32_t U __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  typedef float F __attribute__((vector_size(64)));
#ifdef __AVX512F__
  static U load_bytes(const uint8_t* p) {
    return __builtin_bit_cast(U, _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_bytes(uint8_t* p, U u) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(__builtin_bit_cast(__m512i, u)));
  }
#endif
};

template <int kLanes>
struct VectorLanes {
  static constexpr int kW = kLanes;
  using U = typename LaneTypes<kLanes>::U;
  using I = typename LaneTypes<kLanes>::I;
  using F = typename LaneTypes<kLanes>::F;
  static U splat(uint32_t x) { return U{} + x; }
  static F splat(float x) { return F{} + x; }
  static U mask(I c) { return __builtin_bit_cast(U, c); }
  static I as_int(U u) { return __builtin_bit_cast(I, u); }
  static U as_uint(I i) { return __builtin_bit_cast(U, i); }
  static U bits(F f) { return __builtin_bit_cast(U, f); }
  static F from_bits(U u) { return __builtin_bit_cast(F, u); }
  static I to_int(F f) { return __builtin_convertvector(f, I); }
  static F to_float(I i) { return __builtin_convertvector(i, F); }
  static U load_bytes(const uint8_t* p) { return LaneTypes<kLanes>::load_bytes(p); }
  static void store_bytes(uint8_t* p, U u) { LaneTypes<kLanes>::store_bytes(p, u); }
  static uint32_t max_lane(U u) {
    uint32_t top = 0;
    for (int i = 0; i < kLanes; ++i) top = u[i] > top ? u[i] : top;
    return top;
  }
};

template <class L>
typename L::U select(typename L::U mask, typename L::U a, typename L::U b) {
  return (a & mask) | (b & ~mask);
}

// A code's magnitude: kExpBits of exponent over 3 of fraction, the exponent field's top value the
// binade [1, 2) (so the largest code is 1.875, and 1 the largest a block uses).
template <int kExpBits>
struct MagnitudeCode {
  static constexpr uint32_t kBias = (1u << kExpBits) - 1;
  static constexpr uint32_t kMaxCode = (1u << (kExpBits + 3)) - 1;
  static constexpr uint32_t kMinNormalBits = (128 - kBias) << 23;  // 2^(1 - bias) as fp32
  static constexpr uint32_t kRebias = (127 - kBias) << 3;          // fp32 exponent -> code exponent
  static constexpr float kSubnormalStep = 1.0f / static_cast<float>(int64_t{1} << (kBias + 2));
  static constexpr float kSubnormalInverseStep = static_cast<float>(int64_t{1} << (kBias + 2));

  // |y| (the sign bit is ignored) -> the nearest code; NaN and values past 1.875 saturate.
  template <class L>
  static typename L::U encode(typename L::F y) {
    using U = typename L::U;
    const U bits = L::bits(y) & 0x7fffffffu;
    // Normal: round the fp32 fraction to 3 bits (ties to even), then rebias the exponent (wraps below
    // the normal range, where the subnormal code is taken instead).
    const U rounded = bits + 0x7ffffu + ((bits >> 20) & 1u);
    const U normal = (rounded >> 20) - kRebias;
    // Signed compares (AVX2 has no unsigned ones): a wrapped `normal` is negative, and its lane takes
    // the subnormal code below; `bits` and codes are below 2^31.
    const U saturated =
        select<L>(L::mask(L::as_int(normal) > static_cast<int32_t>(kMaxCode)), L::splat(kMaxCode), normal);
    // Subnormal: multiples of 2^(-2 - bias), rounded to nearest even by the 2^23 trick (exact below
    // 2^22); clamped first so that no lane converts an out-of-range float.
    typename L::F scaled = L::from_bits(bits) * kSubnormalInverseStep;
    scaled = L::from_bits(select<L>(L::mask(scaled < 16.0f), L::bits(scaled), L::bits(L::splat(16.0f))));
    const U subnormal = L::as_uint(L::to_int((scaled + 0x1p23f) - 0x1p23f));
    return select<L>(L::mask(L::as_int(bits) < static_cast<int32_t>(kMinNormalBits)), subnormal, saturated);
  }

  template <class L>
  static typename L::F decode(typename L::U code) {
    const typename L::F subnormal = L::to_float(L::as_int(code)) * kSubnormalStep;
    const typename L::U normal = (code + kRebias) << 20;
    return L::from_bits(select<L>(L::mask(L::as_int(code) >= 8), normal, L::bits(subnormal)));
  }
};

// m / scale in [-1, 1] <-> its byte (the caller multiplies by the scale): the sign in bit 7.
struct FirstMomentCode {
  using Magnitude = MagnitudeCode<4>;
  template <class L>
  static typename L::U encode(typename L::F y) {
    return ((L::bits(y) >> 31) << 7) | Magnitude::encode<L>(y);
  }
  template <class L>
  static typename L::F decode(typename L::U code) {
    return L::from_bits(L::bits(Magnitude::decode<L>(code & 0x7fu)) | ((code >> 7) << 31));
  }
  static uint8_t encode(float y) { return static_cast<uint8_t>(encode<ScalarLanes>(y)); }
  static float decode(uint8_t code) { return decode<ScalarLanes>(code); }
};

// v / scale in [0, 1] <-> its byte.
struct SecondMomentCode {
  using Magnitude = MagnitudeCode<5>;
  template <class L>
  static typename L::U encode(typename L::F y) {
    return Magnitude::encode<L>(y);
  }
  template <class L>
  static typename L::F decode(typename L::U code) {
    return Magnitude::decode<L>(code);
  }
  static uint8_t encode(float y) { return static_cast<uint8_t>(encode<ScalarLanes>(y)); }
  static float decode(uint8_t code) { return decode<ScalarLanes>(code); }
};

// f(i, lanes) over [0, n): whole vectors of L, then the rest one lane at a time (ScalarLanes), which
// runs the same operations per element.
template <class L, class Fn>
void for_lanes(int64_t n, Fn&& f) {
  int64_t i = 0;
  for (; i + L::kW <= n; i += L::kW) f(i, L{});
  for (; i < n; ++i) f(i, ScalarLanes{});
}

// One block's n <= kQ8Block values from their codes and scale.
template <class Code, class L = ScalarLanes>
void decode_q8_block(const uint8_t* codes, float scale, float* out, int64_t n) {
  for_lanes<L>(n, [&](int64_t at, auto lanes) {
    using W = decltype(lanes);
    const typename W::F x = Code::template decode<W>(W::load_bytes(codes + at)) * scale;
    std::memcpy(out + at, &x, sizeof(x));
  });
}

// One block's n values to codes and their scale, the largest magnitude (compared as fp32 patterns,
// which order non-negative floats; a NaN gives a NaN scale). A scale too small for its reciprocal to
// be finite divides instead; a block of zeros has scale 0 and zero codes. A non-finite value spoils its
// whole block (an Inf scale decodes every code as NaN): the run's gradient check is what stops it.
template <class Code, class L = ScalarLanes>
void encode_q8_block(const float* in, int64_t n, uint8_t* codes, float* scale) {
  typename L::U top_lanes = L::splat(0u);
  int64_t i = 0;
  for (; i + L::kW <= n; i += L::kW) {
    typename L::F x;
    std::memcpy(&x, in + i, sizeof(x));
    const typename L::U a = L::bits(x) & 0x7fffffffu;
    top_lanes = select<L>(L::mask(L::as_int(a) > L::as_int(top_lanes)), a, top_lanes);
  }
  uint32_t top_bits = L::max_lane(top_lanes);
  for (; i < n; ++i) {
    const uint32_t a = __builtin_bit_cast(uint32_t, in[i]) & 0x7fffffffu;
    top_bits = a > top_bits ? a : top_bits;
  }
  const float top = __builtin_bit_cast(float, top_bits);
  *scale = top;
  const float inverse = 1.0f / top;
  if (top_bits == 0 || inverse < 0x1p127f) {  // a zero block's factor is 0
    const float factor = top_bits == 0 ? 0.0f : inverse;
    for_lanes<L>(n, [&](int64_t at, auto lanes) {
      using W = decltype(lanes);
      typename W::F x;
      std::memcpy(&x, in + at, sizeof(x));
      W::store_bytes(codes + at, Code::template encode<W>(x * factor));
    });
  } else {  // a scale whose reciprocal overflows (or a NaN)
    for_lanes<L>(n, [&](int64_t at, auto lanes) {
      using W = decltype(lanes);
      typename W::F x;
      std::memcpy(&x, in + at, sizeof(x));
      W::store_bytes(codes + at, Code::template encode<W>(x / top));
    });
  }
}

}  // namespace
}  // namespace slidedp::kernels
