// The scalar reference of every optimizer kernel: one element at a time, written as the formulas in
// the public headers read. CMake builds this file with -O1 -fno-tree-vectorize -fno-tree-slp-vectorize
// -ffp-contract=off and no target flags, so it stays a true reference: the compiler cannot vectorize
// it, fuse a*b+c behind our back, or share code paths (or compiler bugs) with the SIMD levels, and
// std::fma is the correctly rounded library call. It is also the fallback on CPUs without AVX2.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/split_master.h"
#include "kernels/cpu/optim/kernel_table.h"
#include "kernels/cpu/optim/moment_codes.h"
#include "kernels/cpu/optim/stochastic_rounding.h"

namespace slidedp::kernels::detail {
namespace {

// g as AdamW sees it, from a plain gradient buffer.
inline float grad_at(const float* g, int64_t i) { return g[i]; }
inline float grad_at(const bf16_bits* g, int64_t i) { return bf16_to_float(g[i]); }

// The reduced gradient of element i: slots summed in order, then scaled (or fma'd onto accum).
template <class T>
float reduced_at(const SlotArgs<T>& s, int64_t i) {
  float sum = grad_at(s.ptr[0], i);
  for (int k = 1; k < s.num; ++k) sum = sum + grad_at(s.ptr[k], i);
  return s.accum ? std::fma(sum, s.scale, s.accum[i]) : sum * s.scale;
}

// One element of AdamW, in the order documented in adamw.h: writes the master (and mirror) and
// returns the new m and v.
struct Moments {
  float m, v;
};
inline Moments adamw_core(const AdamwState& s, float grad, const AdamwConstants& c, int64_t i, Moments old) {
  const float g = (grad * c.grad_scale) * c.clip_coef;
  const float m = std::fma(old.m, c.beta1, g * c.one_minus_beta1);
  const float v = std::fma(old.v, c.beta2, (g * g) * c.one_minus_beta2);
  const float denom = std::fma(std::sqrt(v), c.inv_sqrt_bias_correction2, c.eps);
  const float master = s.remainder ? join_master(s.param_bf16[i], s.remainder[i]) : s.param[i];
  const float p = std::fma(c.neg_step_size, m / denom, master * c.decay);
  if (s.remainder) {
    const SplitMaster split = split_master(p);
    s.param_bf16[i] = split.mirror;
    s.remainder[i] = split.remainder;
  } else {
    s.param[i] = p;
    if (s.param_bf16) s.param_bf16[i] = s.mirror_ties_toward_zero ? split_master(p).mirror : float_to_bf16(p);
  }
  return {m, v};
}

// Elements [begin, end) with fp32 or bf16 moments.
template <class GradAt>
void adamw_elements(const AdamwState& s, const AdamwConstants& c, int64_t begin, int64_t end, GradAt grad) {
  for (int64_t i = begin; i < end; ++i) {
    if (s.exp_avg_bf16) {
      const Moments m = adamw_core(s, grad(i), c, i,
                                   {bf16_to_float(s.exp_avg_bf16[i]), bf16_to_float(s.exp_avg_sq_bf16[i])});
      const auto index = static_cast<uint32_t>(s.moment_index_base + i);
      s.exp_avg_bf16[i] = float_to_bf16_stochastic(m.m, rounding_noise(s.m_seed, index));
      s.exp_avg_sq_bf16[i] = float_to_bf16_stochastic(m.v, rounding_noise(s.v_seed, index));
    } else {
      const Moments m = adamw_core(s, grad(i), c, i, {s.exp_avg[i], s.exp_avg_sq[i]});
      s.exp_avg[i] = m.m;
      s.exp_avg_sq[i] = m.v;
    }
  }
}

// Elements [begin, end) with 8-bit moments, block by block: decoded, updated, encoded anew.
template <class GradAt>
void adamw_blocks(const AdamwState& s, const AdamwConstants& c, int64_t begin, int64_t end, GradAt grad) {
  float m[kQ8Block], v[kQ8Block];
  for (int64_t b = begin; b < end; b += kQ8Block) {
    const int64_t n = std::min(kQ8Block, end - b), block = (b - s.q8_origin) / kQ8Block;
    decode_q8_block<FirstMomentCode>(s.exp_avg_q8 + b, s.exp_avg_scale[block], m, n);
    decode_q8_block<SecondMomentCode>(s.exp_avg_sq_q8 + b, s.exp_avg_sq_scale[block], v, n);
    for (int64_t j = 0; j < n; ++j) {
      const Moments next = adamw_core(s, grad(b + j), c, b + j, {m[j], v[j]});
      m[j] = next.m, v[j] = next.v;
    }
    encode_q8_block<FirstMomentCode>(m, n, s.exp_avg_q8 + b, s.exp_avg_scale + block);
    encode_q8_block<SecondMomentCode>(v, n, s.exp_avg_sq_q8 + b, s.exp_avg_sq_scale + block);
  }
}

template <class GradAt>
void adamw_any(const AdamwState& s, const AdamwConstants& c, int64_t begin, int64_t end, GradAt grad) {
  if (s.exp_avg_q8) return adamw_blocks(s, c, begin, end, grad);
  adamw_elements(s, c, begin, end, grad);
}

template <class G>
void adamw(const AdamwState& s, const G* grad, const AdamwConstants& c, int64_t begin, int64_t end) {
  adamw_any(s, c, begin, end, [&](int64_t i) { return grad_at(grad, i); });
}

template <class T>
void reduce_adamw(const AdamwState& s, const SlotArgs<T>& slots, const AdamwConstants& c, int64_t begin,
                  int64_t end) {
  adamw_any(s, c, begin, end, [&](int64_t i) { return reduced_at(slots, i); });
}

template <class T>
void reduce(const SlotArgs<T>& slots, float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = reduced_at(slots, i);
}

// Element j of the block goes to lane j % 16; a square of an fp32 value is exact in double.
template <class Value>
double sum_squares_block(int64_t n, Value value) {
  double lanes[16] = {};
  for (int64_t j = 0; j < n; ++j) {
    const double x = value(j);
    lanes[j % 16] += x * x;
  }
  return combine_16_lanes(lanes);
}

template <class T>
double reduce_sum_squares_block(const SlotArgs<T>& slots, int64_t begin, int64_t end) {
  return sum_squares_block(end - begin, [&](int64_t j) { return reduced_at(slots, begin + j); });
}

double sum_squares_block_f32(const float* x, int64_t n) {
  return sum_squares_block(n, [&](int64_t j) { return x[j]; });
}

double sum_squares_block_bf16(const bf16_bits* x, int64_t n) {
  return sum_squares_block(n, [&](int64_t j) { return bf16_to_float(x[j]); });
}

void f32_to_bf16_scalar(const float* in, bf16_bits* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_f32_scalar(const bf16_bits* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void split_scalar(const float* in, bf16_bits* mirror, uint16_t* remainder, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const SplitMaster s = split_master(in[i]);
    mirror[i] = s.mirror;
    if (remainder) remainder[i] = s.remainder;
  }
}

void triad_scalar(float* a, const float* b, const float* c, float q, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = std::fma(q, c[i], b[i]);
}

const KernelTable kTable = {
    adamw<float>,
    adamw<bf16_bits>,
    reduce_adamw<float>,
    reduce_adamw<bf16_bits>,
    reduce<float>,
    reduce<bf16_bits>,
    reduce_sum_squares_block<float>,
    reduce_sum_squares_block<bf16_bits>,
    sum_squares_block_f32,
    sum_squares_block_bf16,
    f32_to_bf16_scalar,
    bf16_to_f32_scalar,
    split_scalar,
    triad_scalar,
};

}  // namespace

const KernelTable& scalar_kernel_table() { return kTable; }

}  // namespace slidedp::kernels::detail
