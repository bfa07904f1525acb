// Shared helpers of the transformer-math tests: seeded random fills, the |got - ref| <= atol +
// rtol*|ref| comparison (NaN/Inf fail), central finite differences, tiny model cards.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp::kernels::test {

template <typename Real>
std::vector<Real> random_vector(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<Real> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<Real>(dist(rng));
  return v;
}

// Each row of d values scaled to length `scale`: an l2-normalised q or k, as the Gated DeltaNet feeds
// the delta rule (q with scale dk^-1/2).
inline std::vector<double> unit_rows(std::vector<double> x, int64_t d, double scale = 1.0) {
  for (size_t r = 0; r < x.size(); r += static_cast<size_t>(d)) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[r + i] * x[r + i];
    for (int64_t i = 0; i < d; ++i) x[r + i] *= scale / std::sqrt(ss);
  }
  return x;
}

// Every element: finite, and |got - ref| <= atol + rtol * |ref|. Reports the worst element.
template <typename A, typename B>
::testing::AssertionResult all_close(const A* got, const B* ref, int64_t n, double atol, double rtol,
                                     const std::string& what = "") {
  int64_t worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    if (!std::isfinite(g) || !std::isfinite(r))
      return ::testing::AssertionFailure() << what << "[" << i << "] not finite: got " << g << " ref " << r;
    const double excess = std::abs(g - r) - (atol + rtol * std::abs(r));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (worst >= 0)
    return ::testing::AssertionFailure()
           << what << "[" << worst << "] got " << static_cast<double>(got[worst]) << " ref "
           << static_cast<double>(ref[worst]) << " (|diff| exceeds atol " << atol << " + rtol " << rtol
           << " * |ref| by " << worst_excess << ")";
  return ::testing::AssertionSuccess();
}

template <typename A, typename B>
::testing::AssertionResult all_close(const std::vector<A>& got, const std::vector<B>& ref, double atol,
                                     double rtol, const std::string& what = "") {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << " size mismatch";
  return all_close(got.data(), ref.data(), static_cast<int64_t>(got.size()), atol, rtol, what);
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Central differences of loss() w.r.t. each element of x (restored afterwards), compared with
// `analytic`. Step 1e-5 in double: truncation ~h^2 |f'''| ~ 1e-10, rounding ~eps |L| / h ~ 1e-11
// |L|; the tolerance 1e-6 (abs and rel) is 10^4 above that and far below a wrong gradient's O(1).
// The central difference of loss() w.r.t. x[i] at that step (x[i] restored).
inline double central_difference(std::vector<double>& x, size_t i, const std::function<double()>& loss) {
  constexpr double h = 1e-5;
  const double keep = x[i];
  x[i] = keep + h;
  const double lp = loss();
  x[i] = keep - h;
  const double lm = loss();
  x[i] = keep;
  return (lp - lm) / (2 * h);
}

inline ::testing::AssertionResult check_finite_differences(std::vector<double>& x,
                                                           const std::vector<double>& analytic,
                                                           const std::function<double()>& loss,
                                                           const std::string& what, double tol = 1e-6) {
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) fd[i] = central_difference(x, i, loss);
  return all_close(analytic, fd, tol, tol, what + " vs finite differences");
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A tiny card of the given family; GQA, q_dim != hidden to catch mixed-up dimensions.
inline ModelCard tiny_card(const std::string& model_type, bool tied) {
  ModelCard c;
  c.name = "tiny-" + model_type;
  c.model_type = model_type;
  c.hidden_size = 12;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 20;
  c.vocab_size = 23;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.attention_bias = model_type == "qwen2";
  c.qk_norm = model_type == "qwen3";
  // llama3 scaling with a short original context: with hd 8 and theta 1e4 the wavelengths are 6.3,
  // 63, 628, 6283, so the keep (< 16), interpolate (16..64) and divide (> 64) bands are all hit.
  if (model_type == "llama") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  c.validate("tiny_card");
  return c;
}

// A unit's flat parameters: norm weights in [0.5, 1.5], biases in [-0.5, 0.5], matrices (and packed
// experts, fan-in the last dimension) uniform with std ~ 1/sqrt(fan_in) so activations stay O(1) through a few layers; padding stays zero.
inline std::vector<double> random_unit_params(const UnitLayout& unit, uint64_t seed) {
  std::vector<double> p(static_cast<size_t>(unit.flat_numel), 0.0);
  std::mt19937_64 rng(seed);
  for (const TensorSpec& t : unit.tensors) {
    const bool is_norm = t.name.find("norm") != std::string::npos;
    const double a = t.shape.size() >= 2 ? 1.7 / std::sqrt(static_cast<double>(t.shape.back())) : 0.5;
    std::uniform_real_distribution<double> dist(is_norm ? 0.5 : -a, is_norm ? 1.5 : a);
    for (int64_t i = 0; i < t.numel; ++i) p[static_cast<size_t>(t.offset + i)] = dist(rng);
  }
  return p;
}

// Positions of a unit's flat buffer that belong to no tensor (alignment padding).
inline std::vector<bool> padding_mask(const UnitLayout& unit) {
  std::vector<bool> pad(static_cast<size_t>(unit.flat_numel), true);
  for (const TensorSpec& t : unit.tensors)
    for (int64_t i = 0; i < t.numel; ++i) pad[static_cast<size_t>(t.offset + i)] = false;
  return pad;
}

}  // namespace slidedp::kernels::test
