// AVX2 + FMA level: 8 fp32 lanes. fp32 -> bf16 rounds with integer arithmetic (AVX2 has no bf16
// instructions); tails use vmaskmov for fp32 and a small stack copy for bf16 (no 16-bit masked
// moves before AVX-512). Built with -mavx2 -mfma -ffp-contract=off (kernels/cpu/optim/CMakeLists.txt);
// called only when cpu_simd_support().avx2_fma.
#include <immintrin.h>

#include "kernels/cpu/optim/kernel_table.h"

namespace slidedp::kernels::detail {
namespace {

struct Avx2 {
  static constexpr int kW = 8;
  using F = __m256;
  struct Tail {
    int n;  // valid lanes, 0 < n < 8
  };
  struct Acc16 {
    __m256d d[4];  // lanes 0-3, 4-7, 8-11, 12-15
  };

  static Tail tail(int64_t n) { return Tail{static_cast<int>(n)}; }
  static __m256i lane_mask(Tail t) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(t.n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const float* p, Tail t) { return _mm256_maskload_ps(p, lane_mask(t)); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, F v, Tail t) { _mm256_maskstore_ps(p, lane_mask(t), v); }

  // bf16 -> fp32 is exact: the 16 bits become the top half of the fp32 pattern.
  static F widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static F load(const bf16_bits* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F load(const bf16_bits* p, Tail t) {
    alignas(16) bf16_bits buf[8] = {};
    __builtin_memcpy(buf, p, static_cast<size_t>(t.n) * sizeof(bf16_bits));
    return widen(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
  }

  // fp32 -> bf16 in 32-bit lanes as common/bf16.h: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16) | 0x40.
  // Without the lsb, exact ties round toward zero: the split master's rule (common/split_master.h).
  template <bool kTiesToEven>
  static __m256i round_bits(F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i biased = _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff));
    if constexpr (kTiesToEven) biased = _mm256_add_epi32(biased, _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(biased, 16);
    const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  }
  // 32-bit lanes holding values <= 0xffff to 16-bit lanes. The signed-saturating pack is exact for
  // them; packus works per 128-bit half, giving [r0-3, r0-3 | r4-7, r4-7]; qwords 0 and 2 hold r0-7.
  static __m128i pack16(__m256i r) {
    const __m256i packed = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }
  static __m128i narrow(F v) { return pack16(round_bits<true>(v)); }
  static __m128i load16(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static __m128i load16(const uint16_t* p, Tail t) {
    alignas(16) uint16_t buf[8] = {};
    __builtin_memcpy(buf, p, static_cast<size_t>(t.n) * sizeof(uint16_t));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
  }
  static void store16(uint16_t* p, __m128i h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
  static void store16(uint16_t* p, __m128i h, Tail t) {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), h);
    __builtin_memcpy(p, buf, static_cast<size_t>(t.n) * sizeof(uint16_t));
  }
  static void store(bf16_bits* p, F v) { store16(p, narrow(v)); }
  static void store(bf16_bits* p, F v, Tail t) { store16(p, narrow(v), t); }
  template <class... T>
  static void store_toward_zero(bf16_bits* p, F v, T... tail) {
    store16(p, pack16(round_bits<false>(v)), tail...);
  }

  // kernels/cpu/optim/stochastic_rounding.h: lane j's noise is lowbias32((index + j) ^ seed); the
  // pattern plus its top 16 bits, truncated (NaN made quiet as narrow does).
  template <class... T>
  static void store_stochastic(bf16_bits* p, F v, uint32_t seed, int64_t index, T... tail) {
    auto i32 = [](uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); };
    __m256i x =
        _mm256_add_epi32(i32(static_cast<uint32_t>(index)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(x, i32(seed));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, i32(0x7feb352du));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, i32(0x846ca68bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    const __m256i u = _mm256_castps_si256(v);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_srli_epi32(x, 16)), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), i32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    store16(p, pack16(_mm256_blendv_epi8(rounded, quiet_nan, is_nan)), tail...);
  }

  // common/split_master.h: upper = mirror << 16; a remainder above 0x8000 means the mirror was rounded
  // up, one bf16 step taken back (not for a NaN mirror, whose remainder is or-ed in).
  template <class... T>
  static F join_master(const bf16_bits* mirror, const uint16_t* remainder, T... tail) {
    const __m256i upper = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(mirror, tail...)), 16);
    const __m256i low = _mm256_cvtepu16_epi32(load16(remainder, tail...));
    const __m256i above = _mm256_cmpgt_epi32(low, _mm256_set1_epi32(0x8000));
    const __m256i nan = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_castsi256_ps(upper), _mm256_castsi256_ps(upper), _CMP_UNORD_Q));
    const __m256i step = _mm256_andnot_si256(nan, _mm256_and_si256(above, _mm256_set1_epi32(0x10000)));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_sub_epi32(upper, step), low));
  }
  template <class... T>
  static void split_master(bf16_bits* mirror, uint16_t* remainder, F v, T... tail) {
    store16(mirror, pack16(round_bits<false>(v)), tail...);
    store16(remainder, pack16(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0xffff))), tail...);
  }

  static Acc16 acc16_zero() {
    return Acc16{{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  }
  // x[0] holds elements 0-7 of a group of 16, x[1] elements 8-15. Widened squares are exact, so the
  // fma equals the reference's separate multiply and add.
  static void acc16_add_squares(Acc16& a, const F* x) {
    for (int h = 0; h < 2; ++h) {
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x[h]));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x[h], 1));
      a.d[2 * h] = _mm256_fmadd_pd(lo, lo, a.d[2 * h]);
      a.d[2 * h + 1] = _mm256_fmadd_pd(hi, hi, a.d[2 * h + 1]);
    }
  }
  static void acc16_store(double* out, const Acc16& a) {
    for (int k = 0; k < 4; ++k) _mm256_storeu_pd(out + 4 * k, a.d[k]);
  }
};

}  // namespace
}  // namespace slidedp::kernels::detail

#include "kernels/cpu/optim/simd_impl.h"

namespace slidedp::kernels::detail {
namespace {
constexpr KernelTable kTable = make_kernel_table<Avx2>();
}  // namespace

const KernelTable& avx2_kernel_table() { return kTable; }

}  // namespace slidedp::kernels::detail
