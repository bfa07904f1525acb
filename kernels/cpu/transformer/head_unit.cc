// The head unit: final norm, fused chunked linear cross-entropy, norm backward; see head_unit.h.
#include "kernels/cpu/transformer/head_unit.h"

#include "common/error.h"
#include "kernels/cpu/transformer/rmsnorm.h"

namespace slidedp::kernels {
namespace {

template <typename Real>
struct Scratch {
  Real* hn;    // (N, C) final norm output
  Real* rstd;  // (N)
  Real* dhn;   // (N, C) gradient of hn [with_grad only]
  Real* w1;    // (C) 1 + norm weight [zero-centred norm only]
  Workspace ce;
};

template <typename Real>
Scratch<Real> carve(Arena& a, const HeadSpec& s, int64_t N, bool with_grad) {
  Scratch<Real> v;
  v.hn = a.take<Real>(N * s.C);
  v.rstd = a.take<Real>(N);
  v.dhn = with_grad ? a.take<Real>(N * s.C) : nullptr;
  v.w1 = s.norm_zero_centred ? a.take<Real>(s.C) : nullptr;
  v.ce = a.take_workspace(
      fused_cross_entropy_workspace_bytes<Real>(N, s.C, s.V, s.loss_chunk_tokens, with_grad));
  return v;
}

}  // namespace

template <typename Real>
int64_t head_workspace_bytes(const HeadSpec& spec, int64_t B, int64_t T, bool with_grad) {
  Arena a;
  carve<Real>(a, spec, B * T, with_grad);
  return a.high_water_bytes();
}

template <typename Real>
LossResult head_forward_backward(const HeadSpec& s, const Real* params, const Real* lm_head_w, const Real* x,
                                 const int32_t* targets, int64_t B, int64_t T, double grad_scale, Real* dx,
                                 Real* grads, Real* lm_head_grad, Workspace ws) {
  const bool with_grad = dx != nullptr;
  SLIDEDP_CHECK(lm_head_w != nullptr, "the head needs the lm_head weight (its own or unit 0's when tied)");
  SLIDEDP_CHECK(!with_grad || (grads != nullptr && lm_head_grad != nullptr && dx != x),
                "head backward needs grads, lm_head_grad and a dx distinct from x");
  const int64_t N = B * T, C = s.C;
  Arena arena(ws);
  const Scratch<Real> w = carve<Real>(arena, s, N, with_grad);

  const Real* norm_w = params + s.norm_w;
  if (s.norm_zero_centred) {  // x * rsqrt(mean x^2 + eps) * (1 + w); d(1 + w) = dw
    for (int64_t c = 0; c < C; ++c) w.w1[c] = Real(1) + norm_w[c];
    norm_w = w.w1;
  }
  rmsnorm_forward(w.hn, w.rstd, x, norm_w, N, C, s.eps);
  const LossResult r = fused_linear_cross_entropy(w.hn, lm_head_w, targets, N, C, s.V, s.loss_chunk_tokens,
                                                  grad_scale, w.dhn, lm_head_grad, w.ce, s.logit_softcap);
  if (with_grad) rmsnorm_backward(dx, grads + s.norm_w, w.dhn, x, w.rstd, norm_w, N, C, false);
  return r;
}

template int64_t head_workspace_bytes<float>(const HeadSpec&, int64_t, int64_t, bool);
template int64_t head_workspace_bytes<double>(const HeadSpec&, int64_t, int64_t, bool);
template LossResult head_forward_backward<float>(const HeadSpec&, const float*, const float*, const float*,
                                                 const int32_t*, int64_t, int64_t, double, float*, float*,
                                                 float*, Workspace);
template LossResult head_forward_backward<double>(const HeadSpec&, const double*, const double*,
                                                  const double*, const int32_t*, int64_t, int64_t, double,
                                                  double*, double*, double*, Workspace);

}  // namespace slidedp::kernels
