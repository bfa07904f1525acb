// GeGLU (tanh GELU) elementwise forward/backward; see geglu.h.
#include "kernels/cpu/transformer/geglu.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/transformer/parallel.h"

namespace slidedp::kernels {
namespace {

template <typename Real>
constexpr Real kSqrt2OverPi = static_cast<Real>(0.79788456080286535588);  // sqrt(2 / pi)
template <typename Real>
constexpr Real kCubic = static_cast<Real>(0.044715);

}  // namespace

template <typename Real>
Real gelu_tanh(Real x) {
  const Real t = std::tanh(kSqrt2OverPi<Real> * (x + kCubic<Real> * x * x * x));
  return Real(0.5) * x * (Real(1) + t);
}

template <typename Real>
Real gelu_tanh_derivative(Real x) {
  const Real t = std::tanh(kSqrt2OverPi<Real> * (x + kCubic<Real> * x * x * x));
  // d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
  return Real(0.5) * (Real(1) + t) +
         Real(0.5) * x * (Real(1) - t * t) * kSqrt2OverPi<Real> * (Real(1) + Real(3) * kCubic<Real> * x * x);
}

template <typename Real>
void geglu_forward(Real* m, const Real* g, const Real* u, int64_t n, int64_t threads) {
  for_each_slice(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) m[i] = gelu_tanh(g[i]) * u[i];
  });
}

template <typename Real>
void geglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n,
                    int64_t threads) {
  for_each_slice(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Real x = g[i], d = dm[i];
      du[i] = d * gelu_tanh(x);
      dg[i] = d * u[i] * gelu_tanh_derivative(x);
    }
  });
}

template float gelu_tanh<float>(float);
template double gelu_tanh<double>(double);
template float gelu_tanh_derivative<float>(float);
template double gelu_tanh_derivative<double>(double);
template void geglu_forward<float>(float*, const float*, const float*, int64_t, int64_t);
template void geglu_forward<double>(double*, const double*, const double*, int64_t, int64_t);
template void geglu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t);
template void geglu_backward<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                     int64_t);

}  // namespace slidedp::kernels
