// RoPE frequencies (with llama3 / linear scaling), tables and the in-place rotation; see rope.h.
#include "kernels/cpu/transformer/rope.h"

#include <cmath>
#include <numbers>

#include "common/error.h"

namespace slidedp::kernels {

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& rs) {
  SLIDEDP_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim");
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));

  if (rs.type == "linear") {
    for (double& f : inv_freq) f /= rs.factor;
  } else if (rs.type == "llama3") {
    // transformers.modeling_rope_utils._compute_llama3_parameters, line by line.
    const double old_context_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_context_len / rs.low_freq_factor;
    const double high_freq_wavelen = old_context_len / rs.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      // wavelen > low_freq_wavelen: divide by factor; wavelen < high_freq_wavelen: keep
      const double inv_freq_llama = wavelen > low_freq_wavelen ? f / rs.factor : f;
      const double smooth_factor =
          (old_context_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      const double smoothed =
          (1.0 - smooth_factor) * inv_freq_llama / rs.factor + smooth_factor * inv_freq_llama;
      const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = is_medium_freq ? smoothed : inv_freq_llama;
    }
  } else {
    SLIDEDP_CHECK(rs.type == "none", "unsupported rope_scaling type " + rs.type);
  }
  return inv_freq;
}

std::vector<double> rope_inv_freq(const ModelCard& card) {
  return rope_inv_freq(card.head_dim, card.rope_theta, card.rope_scaling);
}

std::vector<double> proportional_rope_inv_freq(const LayerShape& s) {
  std::vector<double> f = rope_inv_freq(s.head_dim, s.rope_theta, RopeScaling{});
  for (size_t i = static_cast<size_t>(s.rope_angles); i < f.size(); ++i) f[i] = 0.0;
  return f;
}

template <typename Real>
void rope_tables(Real* cos, Real* sin, const std::vector<double>& inv_freq, int64_t T) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[i];
      cos[t * half + i] = static_cast<Real>(std::cos(angle));
      sin[t * half + i] = static_cast<Real>(std::sin(angle));
    }
}

namespace {

// sign = +1: forward rotation; -1: its transpose (backward).
template <typename Real>
void rotate(Real* x, const Real* cos, const Real* sin, int64_t B, int64_t T, int64_t nh, int64_t hd,
            const int32_t* positions, Real sign) {
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = positions != nullptr ? positions[b * T + t] : t;  // < T: a table row
      const Real* c = cos + pos * half;  // (hd/2)
      const Real* s = sin + pos * half;  // (hd/2)
      for (int64_t h = 0; h < nh; ++h) {
        Real* v = x + ((b * T + t) * nh + h) * hd;  // (hd)
        for (int64_t i = 0; i < half; ++i) {
          const Real x1 = v[i], x2 = v[i + half];
          const Real si = sign * s[i];
          v[i] = x1 * c[i] - x2 * si;
          v[i + half] = x2 * c[i] + x1 * si;
        }
      }
    }
}

}  // namespace

template <typename Real>
void rope_forward(Real* x, const Real* cos, const Real* sin, int64_t B, int64_t T, int64_t nh, int64_t hd,
                  const int32_t* positions) {
  rotate(x, cos, sin, B, T, nh, hd, positions, Real(1));
}

template <typename Real>
void rope_backward(Real* dx, const Real* cos, const Real* sin, int64_t B, int64_t T, int64_t nh, int64_t hd,
                   const int32_t* positions) {
  rotate(dx, cos, sin, B, T, nh, hd, positions, Real(-1));
}

template void rope_tables<float>(float*, float*, const std::vector<double>&, int64_t);
template void rope_tables<double>(double*, double*, const std::vector<double>&, int64_t);
template void rope_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                  const int32_t*);
template void rope_forward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                   const int32_t*);
template void rope_backward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                   const int32_t*);
template void rope_backward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                    const int32_t*);

}  // namespace slidedp::kernels
