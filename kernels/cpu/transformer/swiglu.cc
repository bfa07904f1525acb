// SwiGLU elementwise forward/backward; see swiglu.h.
#include "kernels/cpu/transformer/swiglu.h"

#include <cmath>

#include "kernels/cpu/transformer/parallel.h"

namespace slidedp::kernels {
namespace {

template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));  // exp overflow -> inf -> 0: the right limit
}

}  // namespace

template <typename Real>
void swiglu_forward(Real* m, const Real* g, const Real* u, int64_t n, int64_t threads) {
  for_each_slice(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) m[i] = g[i] * sigmoid(g[i]) * u[i];
  });
}

template <typename Real>
void swiglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n,
                     int64_t threads) {
  for_each_slice(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Real x = g[i], d = dm[i];
      const Real s = sigmoid(x);
      const Real silu = x * s;
      du[i] = d * silu;
      dg[i] = d * u[i] * (s * (Real(1) + x * (Real(1) - s)));
    }
  });
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t,
                                     int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                      int64_t);

}  // namespace slidedp::kernels
