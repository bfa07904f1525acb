// Private to kernels/cpu/optim: every optimizer kernel written once over a vector-traits type V, and
// instantiated by each SIMD translation unit (kernels_avx2.cc, kernels_avx512*.cc) with its own
// target flags. Each kernel performs, per lane, exactly the fp32 operations of the scalar reference
// in the same order, so all levels agree bit for bit. Tails run the same vector code with a partial
// load/store (a mask on AVX-512, a small stack copy on AVX2), never a separate scalar loop.
//
// Include only inside the SIMD .cc files, after defining V. Everything here has internal linkage
// (anonymous namespace) and must not call inline functions with external linkage (std:: helpers,
// slidedp::float_to_bf16): the linker could keep this file's AVX-512 copy for every caller.
//
// V provides: kW (fp32 lanes), F (vector), Tail + tail(n) for 0 < n < kW, zero(), set1(),
// load/store of float and bf16_bits (full and with Tail; bf16 stores round as common/bf16.h),
// store_toward_zero, join_master and split_master (common/split_master.h's rule, full and with Tail),
// add, mul, div, sqrt, fma(a, b, c) = a * b + c rounded once, and Acc16 (16 double lanes) with
// acc16_zero(), acc16_add_squares(acc, x[16 / kW]) and acc16_store(double[16], acc).
#pragma once

#include <cstdint>

#include "kernels/cpu/optim/kernel_table.h"
#include "kernels/cpu/optim/moment_codes.h"

#define SLIDEDP_OPTIM_INLINE inline __attribute__((always_inline))

namespace slidedp::kernels::detail {
namespace {

// Gradient read from one buffer (fp32, or bf16 widened exactly).
template <class V, class G>
struct PlainGrad {
  const G* g;
  template <class... Tail>
  SLIDEDP_OPTIM_INLINE typename V::F load(int64_t i, Tail... tail) const {
    return V::load(g + i, tail...);
  }
};

// Gradient reduced on the fly from N slots: sum in slot order, then scale or fma onto accum.
template <class V, class T, bool kAccum>
struct SlotGrad {
  const T* const* ptr;
  int num;
  const float* accum;
  typename V::F scale;

  template <class... Tail>
  SLIDEDP_OPTIM_INLINE typename V::F load(int64_t i, Tail... tail) const {
    typename V::F sum = V::load(ptr[0] + i, tail...);
    for (int k = 1; k < num; ++k) sum = V::add(sum, V::load(ptr[k] + i, tail...));
    if constexpr (kAccum) {
      return V::fma(sum, scale, V::load(accum + i, tail...));
    } else {
      return V::mul(sum, scale);
    }
  }
};

// AdamW constants broadcast once per call.
template <class V>
struct AdamwVec {
  typename V::F beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, neg_step_size,
      inv_sqrt_bias_correction2, grad_scale, clip_coef;
  explicit AdamwVec(const AdamwConstants& c)
      : beta1(V::set1(c.beta1)),
        one_minus_beta1(V::set1(c.one_minus_beta1)),
        beta2(V::set1(c.beta2)),
        one_minus_beta2(V::set1(c.one_minus_beta2)),
        eps(V::set1(c.eps)),
        decay(V::set1(c.decay)),
        neg_step_size(V::set1(c.neg_step_size)),
        inv_sqrt_bias_correction2(V::set1(c.inv_sqrt_bias_correction2)),
        grad_scale(V::set1(c.grad_scale)),
        clip_coef(V::set1(c.clip_coef)) {}
};

// The state pointers, copied out of AdamwState so they stay in registers: the intrinsics' stores
// go through may_alias vector types, so the compiler would otherwise reload them after every store.
struct StatePtrs {
  float* p;
  float* m;
  float* v;
  bf16_bits* mirror;
  uint16_t* remainder;
  bf16_bits* m16;  // bf16 moments (m and v null)
  bf16_bits* v16;
  uint32_t m_seed, v_seed;
  int64_t moment_index_base;  // bf16: the noise's element index of 0; buffered: the element of m[0], v[0]
};

// How m and v are read and written.
enum class MomentForm {
  kFp32,      // the state's fp32 arrays
  kBf16,      // bf16 arrays, stored with stochastic rounding
  kBuffered,  // one 8-bit block's moments, decoded into fp32 buffers (m and v) before and encoded after
};

// How the master is held and what the update writes besides it (adamw.h AdamwState).
enum class MasterForm {
  kFp32,                  // fp32 master, no mirror
  kFp32Mirror,            // fp32 master, mirror rounded to nearest even (torch's cast)
  kFp32MirrorTowardZero,  // fp32 master, mirror rounded as the split's (exact ties toward zero)
  kSplit,                 // the master is the pair (mirror, remainder): common/split_master.h
};

// kW (or, with a Tail, fewer) elements of AdamW starting at i; same operation order as the reference.
template <class V, MasterForm kForm, MomentForm kMoments, class Src, class... Tail>
SLIDEDP_OPTIM_INLINE void adamw_vector(const StatePtrs& s, const Src& src, const AdamwVec<V>& k, int64_t i,
                                       Tail... tail) {
  using F = typename V::F;
  F m_old, v_old;
  if constexpr (kMoments == MomentForm::kBf16) {
    m_old = V::load(s.m16 + i, tail...);
    v_old = V::load(s.v16 + i, tail...);
  } else if constexpr (kMoments == MomentForm::kBuffered) {
    m_old = V::load(s.m + (i - s.moment_index_base), tail...);
    v_old = V::load(s.v + (i - s.moment_index_base), tail...);
  } else {
    m_old = V::load(s.m + i, tail...);
    v_old = V::load(s.v + i, tail...);
  }
  const F g = V::mul(V::mul(src.load(i, tail...), k.grad_scale), k.clip_coef);
  const F m = V::fma(m_old, k.beta1, V::mul(g, k.one_minus_beta1));
  const F v = V::fma(v_old, k.beta2, V::mul(V::mul(g, g), k.one_minus_beta2));
  const F denom = V::fma(V::sqrt(v), k.inv_sqrt_bias_correction2, k.eps);
  F master;
  if constexpr (kForm == MasterForm::kSplit) {
    master = V::join_master(s.mirror + i, s.remainder + i, tail...);
  } else {
    master = V::load(s.p + i, tail...);
  }
  const F p = V::fma(k.neg_step_size, V::div(m, denom), V::mul(master, k.decay));
  if constexpr (kMoments == MomentForm::kBf16) {
    V::store_stochastic(s.m16 + i, m, s.m_seed, s.moment_index_base + i, tail...);
    V::store_stochastic(s.v16 + i, v, s.v_seed, s.moment_index_base + i, tail...);
  } else if constexpr (kMoments == MomentForm::kBuffered) {
    V::store(s.m + (i - s.moment_index_base), m, tail...);
    V::store(s.v + (i - s.moment_index_base), v, tail...);
  } else {
    V::store(s.m + i, m, tail...);
    V::store(s.v + i, v, tail...);
  }
  if constexpr (kForm == MasterForm::kSplit) {
    V::split_master(s.mirror + i, s.remainder + i, p, tail...);
  } else {
    V::store(s.p + i, p, tail...);
    if constexpr (kForm == MasterForm::kFp32Mirror) V::store(s.mirror + i, p, tail...);
    if constexpr (kForm == MasterForm::kFp32MirrorTowardZero) V::store_toward_zero(s.mirror + i, p, tail...);
  }
}

template <class V, MasterForm kForm, MomentForm kMoments, class Src>
SLIDEDP_OPTIM_INLINE void adamw_range(const StatePtrs& s, const Src& src, const AdamwVec<V>& k, int64_t begin,
                                      int64_t end) {
  int64_t i = begin;
  for (; i + V::kW <= end; i += V::kW) adamw_vector<V, kForm, kMoments>(s, src, k, i);
  if (i < end) adamw_vector<V, kForm, kMoments>(s, src, k, i, V::tail(end - i));
}

StatePtrs state_ptrs(const AdamwState& state) {
  return StatePtrs{state.param,     state.exp_avg,          state.exp_avg_sq,      state.param_bf16,
                   state.remainder, state.exp_avg_bf16,     state.exp_avg_sq_bf16, state.m_seed,
                   state.v_seed,    state.moment_index_base};
}

template <class V, MasterForm kForm, MomentForm kMoments, class Src>
void adamw_span(const AdamwState& state, const Src& src, const AdamwConstants& c, int64_t begin,
                int64_t end) {
  adamw_range<V, kForm, kMoments>(state_ptrs(state), src, AdamwVec<V>(c), begin, end);
}

// 8-bit moments, block by block (begin is a block boundary): decode the block's m and v, update in
// fp32, encode with the block's new scales.
template <class V, MasterForm kForm, class Src>
void adamw_span_q8(const AdamwState& state, const Src& src, const AdamwConstants& c, int64_t begin,
                   int64_t end) {
  using Lanes = VectorLanes<V::kW>;
  const AdamwVec<V> k(c);
  alignas(64) float m[kQ8Block], v[kQ8Block];
  StatePtrs s = state_ptrs(state);
  s.m = m, s.v = v;
  for (int64_t b = begin; b < end; b += kQ8Block) {
    const int64_t n = end - b < kQ8Block ? end - b : kQ8Block;
    const int64_t block = (b - state.q8_origin) / kQ8Block;
    decode_q8_block<FirstMomentCode, Lanes>(state.exp_avg_q8 + b, state.exp_avg_scale[block], m, n);
    decode_q8_block<SecondMomentCode, Lanes>(state.exp_avg_sq_q8 + b, state.exp_avg_sq_scale[block], v, n);
    s.moment_index_base = b;
    adamw_range<V, kForm, MomentForm::kBuffered>(s, src, k, b, b + n);
    encode_q8_block<FirstMomentCode, Lanes>(m, n, state.exp_avg_q8 + b, state.exp_avg_scale + block);
    encode_q8_block<SecondMomentCode, Lanes>(v, n, state.exp_avg_sq_q8 + b, state.exp_avg_sq_scale + block);
  }
}

template <class V, MasterForm kForm, class Src>
void adamw_dispatch_moments(const AdamwState& s, const Src& src, const AdamwConstants& c, int64_t begin,
                            int64_t end) {
  if (s.exp_avg_q8) {
    adamw_span_q8<V, kForm>(s, src, c, begin, end);
  } else if (s.exp_avg_bf16) {
    adamw_span<V, kForm, MomentForm::kBf16>(s, src, c, begin, end);
  } else {
    adamw_span<V, kForm, MomentForm::kFp32>(s, src, c, begin, end);
  }
}

template <class V, class Src>
void adamw_dispatch_mirror(const AdamwState& s, const Src& src, const AdamwConstants& c, int64_t begin,
                           int64_t end) {
  if (s.remainder) {
    adamw_dispatch_moments<V, MasterForm::kSplit>(s, src, c, begin, end);
  } else if (!s.param_bf16) {
    adamw_dispatch_moments<V, MasterForm::kFp32>(s, src, c, begin, end);
  } else if (s.mirror_ties_toward_zero) {
    adamw_dispatch_moments<V, MasterForm::kFp32MirrorTowardZero>(s, src, c, begin, end);
  } else {
    adamw_dispatch_moments<V, MasterForm::kFp32Mirror>(s, src, c, begin, end);
  }
}

template <class V, class G>
void adamw_entry(const AdamwState& s, const G* grad, const AdamwConstants& c, int64_t begin, int64_t end) {
  adamw_dispatch_mirror<V>(s, PlainGrad<V, G>{grad}, c, begin, end);
}

template <class V, class T>
void reduce_adamw_entry(const AdamwState& s, const SlotArgs<T>& a, const AdamwConstants& c, int64_t begin,
                        int64_t end) {
  if (a.accum) {
    adamw_dispatch_mirror<V>(s, SlotGrad<V, T, true>{a.ptr, a.num, a.accum, V::set1(a.scale)}, c, begin, end);
  } else {
    adamw_dispatch_mirror<V>(s, SlotGrad<V, T, false>{a.ptr, a.num, nullptr, V::set1(a.scale)}, c, begin,
                             end);
  }
}

// out may alias accum: each vector is loaded before it is stored.
template <class V, class Src>
void reduce_span(const Src& src, float* out, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + V::kW <= end; i += V::kW) V::store(out + i, src.load(i));
  if (i < end) {
    const auto t = V::tail(end - i);
    V::store(out + i, src.load(i, t), t);
  }
}

template <class V, class T>
void reduce_entry(const SlotArgs<T>& a, float* out, int64_t begin, int64_t end) {
  if (a.accum) {
    reduce_span<V>(SlotGrad<V, T, true>{a.ptr, a.num, a.accum, V::set1(a.scale)}, out, begin, end);
  } else {
    reduce_span<V>(SlotGrad<V, T, false>{a.ptr, a.num, nullptr, V::set1(a.scale)}, out, begin, end);
  }
}

// Sum of squares of src over [begin, end) with element begin + j in double lane j % 16 (16 / kW
// vectors per group of 16); lanes past the end are +0.0, which leaves a lane sum unchanged.
template <class V, class Src>
double sum_squares_span(const Src& src, int64_t begin, int64_t end) {
  constexpr int kVecs = 16 / V::kW;
  static_assert(kVecs * V::kW == 16, "a vector must hold a divisor of 16 lanes");
  typename V::Acc16 acc = V::acc16_zero();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    typename V::F x[kVecs];
    for (int j = 0; j < kVecs; ++j) x[j] = src.load(i + j * V::kW);
    V::acc16_add_squares(acc, x);
  }
  if (i < end) {
    typename V::F x[kVecs];
    for (int j = 0; j < kVecs; ++j) {
      const int64_t at = i + j * V::kW;
      const int64_t left = end - at;
      if (left >= V::kW) {
        x[j] = src.load(at);
      } else if (left > 0) {
        x[j] = src.load(at, V::tail(left));
      } else {
        x[j] = V::zero();
      }
    }
    V::acc16_add_squares(acc, x);
  }
  alignas(64) double lanes[16];
  V::acc16_store(lanes, acc);
  return combine_16_lanes(lanes);
}

template <class V, class T>
double reduce_sum_squares_entry(const SlotArgs<T>& a, int64_t begin, int64_t end) {
  if (a.accum) {
    return sum_squares_span<V>(SlotGrad<V, T, true>{a.ptr, a.num, a.accum, V::set1(a.scale)}, begin, end);
  }
  return sum_squares_span<V>(SlotGrad<V, T, false>{a.ptr, a.num, nullptr, V::set1(a.scale)}, begin, end);
}

template <class V, class T>
double sum_squares_entry(const T* x, int64_t n) {
  return sum_squares_span<V>(PlainGrad<V, T>{x}, 0, n);
}

// Conversion is a load in the source type and a store in the destination type.
template <class V, class From, class To>
void convert_entry(const From* in, To* out, int64_t n) {
  int64_t i = 0;
  for (; i + V::kW <= n; i += V::kW) V::store(out + i, V::load(in + i));
  if (i < n) {
    const auto t = V::tail(n - i);
    V::store(out + i, V::load(in + i, t), t);
  }
}

// The split master's halves (remainder null: the toward-zero mirror alone).
template <class V>
void split_entry(const float* in, bf16_bits* mirror, uint16_t* remainder, int64_t n) {
  auto one = [&](int64_t i, auto... tail) {
    const typename V::F v = V::load(in + i, tail...);
    if (remainder) {
      V::split_master(mirror + i, remainder + i, v, tail...);
    } else {
      V::store_toward_zero(mirror + i, v, tail...);
    }
  };
  int64_t i = 0;
  for (; i + V::kW <= n; i += V::kW) one(i);
  if (i < n) one(i, V::tail(n - i));
}

template <class V>
void triad_entry(float* a, const float* b, const float* c, float q, int64_t n) {
  const typename V::F qv = V::set1(q);
  int64_t i = 0;
  for (; i + V::kW <= n; i += V::kW) V::store(a + i, V::fma(qv, V::load(c + i), V::load(b + i)));
  if (i < n) {
    const auto t = V::tail(n - i);
    V::store(a + i, V::fma(qv, V::load(c + i, t), V::load(b + i, t)), t);
  }
}

template <class V>
constexpr KernelTable make_kernel_table() {
  return KernelTable{
      adamw_entry<V, float>,
      adamw_entry<V, bf16_bits>,
      reduce_adamw_entry<V, float>,
      reduce_adamw_entry<V, bf16_bits>,
      reduce_entry<V, float>,
      reduce_entry<V, bf16_bits>,
      reduce_sum_squares_entry<V, float>,
      reduce_sum_squares_entry<V, bf16_bits>,
      sum_squares_entry<V, float>,
      sum_squares_entry<V, bf16_bits>,
      convert_entry<V, float, bf16_bits>,
      convert_entry<V, bf16_bits, float>,
      split_entry<V>,
      triad_entry<V>,
  };
}

}  // namespace
}  // namespace slidedp::kernels::detail
