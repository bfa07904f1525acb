// RMSNorm forward/backward, one pass per row; see rmsnorm.h.
#include "kernels/cpu/transformer/rmsnorm.h"

#include <cmath>

namespace slidedp::kernels {

template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t N, int64_t C, double eps) {
  if (w == nullptr) {  // the weightless norm (Gemma 4's v_norm and router norm)
    for (int64_t n = 0; n < N; ++n) {
      const Real* xr = x + n * C;
      Real* yr = y + n * C;
      double ss = 0.0;
      for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const Real r = static_cast<Real>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
      rstd[n] = r;
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r;
    }
    return;
  }
  for (int64_t n = 0; n < N; ++n) {
    const Real* xr = x + n * C;  // (C)
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const Real r = static_cast<Real>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    rstd[n] = r;
  }
  rmsnorm_apply(y, rstd, x, w, N, C);
}

template <typename Real>
void rmsnorm_apply(Real* y, const Real* rstd, const Real* x, const Real* w, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* xr = x + n * C;
    Real* yr = y + n * C;
    const Real r = rstd[n];
    for (int64_t c = 0; c < C; ++c) yr[c] = w[c] * (xr[c] * r);
  }
}

template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* rstd, const Real* w,
                      int64_t N, int64_t C, bool accumulate_dx) {
  if (w == nullptr) {  // weightless: w = 1 and no weight gradient
    for (int64_t n = 0; n < N; ++n) {
      const Real* xr = x + n * C;
      const Real* dyr = dy + n * C;
      Real* dxr = dx + n * C;
      const Real r = rstd[n];
      double dot = 0.0;
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dyr[c]) * (xr[c] * r);
      const Real mean_dot = static_cast<Real>(dot / static_cast<double>(C));
      for (int64_t c = 0; c < C; ++c) {
        const Real g = r * (dyr[c] - xr[c] * r * mean_dot);
        dxr[c] = accumulate_dx ? dxr[c] + g : g;
      }
    }
    return;
  }
  for (int64_t n = 0; n < N; ++n) {
    const Real* xr = x + n * C;    // (C)
    const Real* dyr = dy + n * C;  // (C)
    Real* dxr = dx + n * C;        // (C)
    const Real r = rstd[n];
    // mean over the row of (w * dy) . xhat
    double dot = 0.0;
    for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(w[c] * dyr[c]) * (xr[c] * r);
    const Real mean_dot = static_cast<Real>(dot / static_cast<double>(C));
    for (int64_t c = 0; c < C; ++c) {
      const Real xhat = xr[c] * r;
      const Real g = r * (w[c] * dyr[c] - xhat * mean_dot);
      dxr[c] = accumulate_dx ? dxr[c] + g : g;
      dw[c] += dyr[c] * xhat;
    }
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int64_t, int64_t,
                                      double);
template void rmsnorm_apply<float>(float*, const float*, const float*, const float*, int64_t, int64_t);
template void rmsnorm_apply<double>(double*, const double*, const double*, const double*, int64_t, int64_t);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                      int64_t, int64_t, bool);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*,
                                       const double*, int64_t, int64_t, bool);

}  // namespace slidedp::kernels
