// Linear layers = one GEMM each; see linear.h.
#include "kernels/cpu/transformer/linear.h"

#include "kernels/cpu/transformer/blas.h"

namespace slidedp::kernels {

template <typename Real>
void linear_forward(Real* out, const Real* in, const Real* w, const Real* bias, int64_t N, int64_t IN,
                    int64_t OUT, bool accumulate_out) {
  gemm<Real>(false, true, N, OUT, IN, Real(1), in, IN, w, IN, accumulate_out ? Real(1) : Real(0), out, OUT);
  if (bias != nullptr) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) out[n * OUT + o] += bias[o];
  }
}

template <typename Real>
void linear_backward(Real* din, Real* dw, Real* dbias, const Real* dout, const Real* in, const Real* w,
                     int64_t N, int64_t IN, int64_t OUT, bool accumulate_din) {
  if (din != nullptr)
    gemm<Real>(false, false, N, IN, OUT, Real(1), dout, OUT, w, IN, accumulate_din ? Real(1) : Real(0), din,
               IN);
  gemm<Real>(true, false, OUT, IN, N, Real(1), dout, OUT, in, IN, Real(1), dw, IN);
  if (dbias != nullptr) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) dbias[o] += dout[n * OUT + o];
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                    int64_t, bool);
template void linear_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, bool);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t, bool);
template void linear_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                      int64_t, int64_t, int64_t, bool);

}  // namespace slidedp::kernels
