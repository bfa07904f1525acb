// Private to kernels/cpu/optim: vector traits of the AVX-512 level (16 fp32 lanes, masked tails),
// shared by kernels_avx512.cc and kernels_avx512_bf16.cc. The only difference between the two is the
// fp32 -> bf16 store: with __AVX512BF16__ it uses vcvtneps2bf16, which rounds to nearest even and
// quiets NaNs like common/bf16.h but flushes subnormal inputs to zero, so lanes holding subnormals
// (rare in weights) are redone with the integer rounding under a mask.
#pragma once

// GCC 12's AVX-512 intrinsics start from `__m512 __Y = __Y;` (_mm512_undefined_ps), which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in 12.3/13). The
// warning is attributed to the header's lines, so it is silenced for the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels::detail {
namespace {

struct Avx512 {
  static constexpr int kW = 16;
  using F = __m512;
  struct Tail {
    __mmask16 k;  // valid lanes, a prefix of 1..15 lanes
  };
  struct Acc16 {
    __m512d lo, hi;  // lanes 0-7, 8-15
  };

  static Tail tail(int64_t n) { return Tail{static_cast<__mmask16>((1u << n) - 1u)}; }

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const float* p, Tail t) { return _mm512_maskz_loadu_ps(t.k, p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, F v, Tail t) { _mm512_mask_storeu_ps(p, t.k, v); }

  static F widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static F load(const bf16_bits* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load(const bf16_bits* p, Tail t) { return widen(_mm256_maskz_loadu_epi16(t.k, p)); }

  // common/bf16.h with integer arithmetic, in 32-bit lanes: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16)
  // | 0x40. Without the lsb, exact ties round toward zero: the split master's rule (split_master.h).
  template <bool kTiesToEven>
  static __m512i round_bits(F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i biased = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    if constexpr (kTiesToEven) biased = _mm512_add_epi32(biased, _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    __m512i r = _mm512_srli_epi32(biased, 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, is_nan, hi, _mm512_set1_epi32(0x40));
    return r;
  }
  static __m256i narrow_integer(F v) { return _mm512_cvtepi32_epi16(round_bits<true>(v)); }
  static __m256i narrow(F v) {
#if defined(__AVX512BF16__)
    const __m256i fast = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                                _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(subnormal == 0, 1)) return fast;
    return _mm256_mask_blend_epi16(subnormal, fast, narrow_integer(v));
#else
    return narrow_integer(v);
#endif
  }
  static __m256i load16(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static __m256i load16(const uint16_t* p, Tail t) { return _mm256_maskz_loadu_epi16(t.k, p); }
  static void store16(uint16_t* p, __m256i h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
  static void store16(uint16_t* p, __m256i h, Tail t) { _mm256_mask_storeu_epi16(p, t.k, h); }
  static void store(bf16_bits* p, F v) { store16(p, narrow(v)); }
  static void store(bf16_bits* p, F v, Tail t) { store16(p, narrow(v), t); }
  template <class... T>
  static void store_toward_zero(bf16_bits* p, F v, T... tail) {
    store16(p, _mm512_cvtepi32_epi16(round_bits<false>(v)), tail...);
  }

  // kernels/cpu/optim/stochastic_rounding.h: lane j's noise is lowbias32((index + j) ^ seed); the
  // pattern plus its top 16 bits, truncated (NaN made quiet as narrow_integer does).
  template <class... T>
  static void store_stochastic(bf16_bits* p, F v, uint32_t seed, int64_t index, T... tail) {
    auto i32 = [](uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); };
    __m512i x = _mm512_add_epi32(i32(static_cast<uint32_t>(index)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(x, i32(seed));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, i32(0x7feb352du));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, i32(0x846ca68bu));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    const __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_srli_epi32(x, 16)), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, is_nan, _mm512_srli_epi32(u, 16), i32(0x40));
    store16(p, _mm512_cvtepi32_epi16(r), tail...);
  }

  // common/split_master.h: upper = mirror << 16; a remainder above 0x8000 means the mirror was rounded
  // up, one bf16 step taken back (not for a NaN mirror, whose remainder is or-ed in).
  template <class... T>
  static F join_master(const bf16_bits* mirror, const uint16_t* remainder, T... tail) {
    const __m512i upper = _mm512_slli_epi32(_mm512_cvtepu16_epi32(load16(mirror, tail...)), 16);
    const __m512i low = _mm512_cvtepu16_epi32(load16(remainder, tail...));
    const __mmask16 nan =
        _mm512_cmp_ps_mask(_mm512_castsi512_ps(upper), _mm512_castsi512_ps(upper), _CMP_UNORD_Q);
    const __mmask16 back =
        _mm512_cmpgt_epu32_mask(low, _mm512_set1_epi32(0x8000)) & static_cast<__mmask16>(~nan);
    const __m512i sum = _mm512_add_epi32(upper, low);
    return _mm512_castsi512_ps(_mm512_mask_sub_epi32(sum, back, sum, _mm512_set1_epi32(0x10000)));
  }
  template <class... T>
  static void split_master(bf16_bits* mirror, uint16_t* remainder, F v, T... tail) {
    store16(mirror, _mm512_cvtepi32_epi16(round_bits<false>(v)), tail...);
    store16(remainder,
            _mm512_cvtepi32_epi16(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0xffff))),
            tail...);
  }

  static Acc16 acc16_zero() { return Acc16{_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  // Widened squares are exact, so the fma equals the reference's separate multiply and add.
  static void acc16_add_squares(Acc16& a, const F* x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x[0]));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x[0], 1));
    a.lo = _mm512_fmadd_pd(lo, lo, a.lo);
    a.hi = _mm512_fmadd_pd(hi, hi, a.hi);
  }
  static void acc16_store(double* out, const Acc16& a) {
    _mm512_storeu_pd(out, a.lo);
    _mm512_storeu_pd(out + 8, a.hi);
  }
};

}  // namespace
}  // namespace slidedp::kernels::detail
