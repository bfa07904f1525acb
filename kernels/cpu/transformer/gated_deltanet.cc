// The Gated DeltaNet mixer on the CPU; see gated_deltanet.h. The carve functions are the single
// source of the buffer sizes, as in llama_layer.cc.
#include "kernels/cpu/transformer/gated_deltanet.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/transformer/linear.h"
#include "kernels/cpu/transformer/parallel.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/swiglu.h"

namespace slidedp::kernels {
namespace {

constexpr double kL2NormEps = 1e-6;  // the reference's l2norm: x * rsqrt(sum x^2 + 1e-6)

void check_spec(const DeltaNetSpec& s) {
  SLIDEDP_CHECK(s.C > 0 && s.nk > 0 && s.nv > 0 && s.nv % s.nk == 0 && s.dk > 0 && s.dv > 0,
                "Gated DeltaNet: bad head shape");
  SLIDEDP_CHECK(s.conv_kernel >= 1 && s.chunk >= 1 && s.threads >= 1, "Gated DeltaNet: bad spec");
}

DeltaRuleSpec rule_spec(const DeltaNetSpec& s) { return {s.nk, s.nv, s.dk, s.dv, s.chunk, s.threads}; }

int64_t rows(DeltaRuleSegments seg) { return seg.count == 0 ? 0 : seg.offsets[seg.count]; }

template <typename Real>
struct Saved {
  Real *mixed, *z, *braw, *araw, *o, *rstd;
};

template <typename Real>
Saved<Real> carve_saved(Arena& a, const DeltaNetSpec& s, int64_t N) {
  Saved<Real> x;
  x.mixed = a.take<Real>(N * s.qkv_dim(), "qkv projection");
  x.z = a.take<Real>(N * s.value_dim(), "z projection");
  x.braw = a.take<Real>(N * s.nv, "b projection");
  x.araw = a.take<Real>(N * s.nv, "a projection");
  x.o = a.take<Real>(N * s.value_dim(), "delta rule output");
  x.rstd = a.take<Real>(N * s.nv, "gated norm rstd");
  return x;
}

// What the delta rule reads, rebuilt from the saved projections.
template <typename Real>
struct Prepared {
  Real *conv, *act;  // (N, qkv_dim): conv output before and after SiLU
  Real *q, *k;       // (N, nk, dk)
  Real *v;           // (N, nv, dv)
  Real *g, *beta;    // (N, nv)
};

template <typename Real>
Prepared<Real> carve_prepared(Arena& a, const DeltaNetSpec& s, int64_t N) {
  Prepared<Real> x;
  x.conv = a.take<Real>(N * s.qkv_dim(), "conv output");
  x.act = a.take<Real>(N * s.qkv_dim(), "silu(conv)");
  x.q = a.take<Real>(N * s.key_dim(), "q");
  x.k = a.take<Real>(N * s.key_dim(), "k");
  x.v = a.take<Real>(N * s.value_dim(), "v");
  x.g = a.take<Real>(N * s.nv, "log decay");
  x.beta = a.take<Real>(N * s.nv, "beta");
  return x;
}

template <typename Real>
struct ForwardScratch {
  Prepared<Real> p;
  Real *normed, *gated;  // (N, value_dim)
  Workspace rule;
};

template <typename Real>
ForwardScratch<Real> carve_forward(Arena& a, const DeltaNetSpec& s, DeltaRuleExtent e) {
  const int64_t N = e.rows;
  ForwardScratch<Real> x;
  x.p = carve_prepared<Real>(a, s, N);
  x.normed = a.take<Real>(N * s.value_dim(), "normed o");
  x.gated = a.take<Real>(N * s.value_dim(), "gated o");
  x.rule = a.take_workspace(delta_rule_forward_workspace_bytes<Real>(rule_spec(s), e));
  return x;
}

template <typename Real>
struct BackwardScratch {
  Prepared<Real> p;
  Real *normed, *gated;                 // recomputed forward pieces
  Real *dgated, *dz, *dnormed, *do_;    // (N, value_dim)
  Real *dq, *dk, *dv;                   // delta rule input gradients
  Real *dg, *dbeta, *dbraw, *daraw;     // (N, nv)
  Real *dact;                           // (N, qkv_dim): d silu(conv), then d conv, in place
  Real* dmixed;                         // (N, qkv_dim)
  Workspace rule;
};

template <typename Real>
BackwardScratch<Real> carve_backward(Arena& a, const DeltaNetSpec& s, DeltaRuleExtent e) {
  const int64_t N = e.rows, Vd = N * s.value_dim(), Kd = N * s.key_dim(), H = N * s.nv;
  BackwardScratch<Real> x;
  x.p = carve_prepared<Real>(a, s, N);
  x.normed = a.take<Real>(Vd, "normed o");
  x.gated = a.take<Real>(Vd, "gated o");
  x.dgated = a.take<Real>(Vd, "d gated o");
  x.dz = a.take<Real>(Vd, "dz");
  x.dnormed = a.take<Real>(Vd, "d normed o");
  x.do_ = a.take<Real>(Vd, "d delta rule output");
  x.dq = a.take<Real>(Kd, "dq");
  x.dk = a.take<Real>(Kd, "dk");
  x.dv = a.take<Real>(Vd, "dv");
  x.dg = a.take<Real>(H, "d log decay");
  x.dbeta = a.take<Real>(H, "d beta");
  x.dbraw = a.take<Real>(H, "d b projection");
  x.daraw = a.take<Real>(H, "d a projection");
  x.dact = a.take<Real>(N * s.qkv_dim(), "d conv");
  x.dmixed = a.take<Real>(N * s.qkv_dim(), "d qkv projection");
  x.rule = a.take_workspace(delta_rule_backward_workspace_bytes<Real>(rule_spec(s), e));
  return x;
}

template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

// torch.nn.functional.softplus with its default threshold: x above 20 passes through.
template <typename Real>
Real softplus(Real x) {
  return x > Real(20) ? x : std::log1p(std::exp(x));
}

// Calls body(begin, end) for every segment, the segments split over workers.
template <typename Body>
void for_each_segment(DeltaRuleSegments seg, int64_t threads, const Body& body) {
  for_each_item(seg.count, threads, [&](int64_t i, int64_t) { body(seg.offsets[i], seg.offsets[i + 1]); });
}

// conv (N, D) = causal depthwise conv of mixed with `kernel` taps per channel, zero before each
// segment's first row: conv[t, c] = sum_i w[c, i] mixed[t - (K - 1) + i, c].
template <typename Real>
void conv_forward(const DeltaNetSpec& s, DeltaRuleSegments seg, const Real* w, const Real* mixed, Real* conv) {
  const int64_t D = s.qkv_dim(), K = s.conv_kernel;
  for_each_segment(seg, s.threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Real* out = conv + t * D;
      std::fill(out, out + D, Real(0));
      for (int64_t i = 0; i < K; ++i) {
        const int64_t src = t - (K - 1) + i;
        if (src < begin) continue;
        const Real* in = mixed + src * D;
        for (int64_t c = 0; c < D; ++c) out[c] += w[c * K + i] * in[c];
      }
    }
  });
}

// From dconv (N, D): dmixed overwritten, dw accumulated. Channels split over workers, each summing
// its taps in row order, so the result is independent of the thread count.
template <typename Real>
void conv_backward(const DeltaNetSpec& s, DeltaRuleSegments seg, const Real* w, const Real* mixed, const Real* dconv,
                   Real* dmixed, Real* dw) {
  const int64_t D = s.qkv_dim(), K = s.conv_kernel;
  for_each_slice(D, s.threads, [&](int64_t c0, int64_t c1) {
    for (int64_t sgi = 0; sgi < seg.count; ++sgi) {
      const int64_t begin = seg.offsets[sgi], end = seg.offsets[sgi + 1];
      for (int64_t t = begin; t < end; ++t) {
        Real* dm = dmixed + t * D;
        for (int64_t c = c0; c < c1; ++c) dm[c] = 0;
        // mixed row t feeds conv rows t + (K - 1) - i for taps i.
        for (int64_t i = 0; i < K; ++i) {
          const int64_t dst = t + (K - 1) - i;
          if (dst >= end) continue;
          const Real* dc = dconv + dst * D;
          for (int64_t c = c0; c < c1; ++c) {
            dm[c] += w[c * K + i] * dc[c];
            dw[c * K + i] += dc[c] * mixed[t * D + c];
          }
        }
      }
    }
  });
}

// x * rsqrt(sum x^2 + eps) * scale over rows of d; y may alias nothing.
template <typename Real>
void l2norm_rows(Real* y, int64_t y_stride, const Real* x, int64_t x_stride, int64_t rows_, int64_t heads, int64_t d,
                 Real scale) {
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const Real* in = x + r * x_stride + h * d;
      Real* out = y + r * y_stride + h * d;
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(in[i]) * in[i];
      const Real inv = static_cast<Real>(1.0 / std::sqrt(ss + kL2NormEps));
      for (int64_t i = 0; i < d; ++i) out[i] = in[i] * inv * scale;
    }
}

// dx = scale * r (dy - u (u . dy)), u = x r, r = rsqrt(sum x^2 + eps): the l2norm's Jacobian.
template <typename Real>
void l2norm_rows_backward(Real* dx, int64_t dx_stride, const Real* dy, const Real* x, int64_t x_stride, int64_t rows_,
                          int64_t heads, int64_t d, Real scale) {
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const Real* in = x + r * x_stride + h * d;
      const Real* g = dy + (r * heads + h) * d;
      Real* out = dx + r * dx_stride + h * d;
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(in[i]) * in[i];
      const Real inv = static_cast<Real>(1.0 / std::sqrt(ss + kL2NormEps));
      Real proj = 0;
      for (int64_t i = 0; i < d; ++i) proj += in[i] * inv * g[i];
      for (int64_t i = 0; i < d; ++i) out[i] = scale * inv * (g[i] - in[i] * inv * proj);
    }
}

template <typename Real>
Real q_scale(const DeltaNetSpec& s) {
  return static_cast<Real>(1.0 / std::sqrt(static_cast<double>(s.dk)));
}

// conv, SiLU, the split into normalised q, k and v, beta and g, from the saved projections.
template <typename Real>
void prepare(const DeltaNetSpec& s, DeltaRuleSegments seg, const DeltaNetWeights<const Real>& w,
             const Saved<Real>& S, const Prepared<Real>& p) {
  const int64_t N = rows(seg), D = s.qkv_dim(), Kd = s.key_dim(), Vd = s.value_dim();
  conv_forward(s, seg, w.conv, S.mixed, p.conv);
  for_each_slice(N * D, s.threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p.act[i] = p.conv[i] * sigmoid(p.conv[i]);
  });
  for_each_slice(N, s.threads, [&](int64_t b, int64_t e) {
    l2norm_rows(p.q + b * Kd, Kd, p.act + b * D, D, e - b, s.nk, s.dk, q_scale<Real>(s));
    l2norm_rows(p.k + b * Kd, Kd, p.act + b * D + Kd, D, e - b, s.nk, s.dk, Real(1));
    for (int64_t t = b; t < e; ++t) std::copy(p.act + t * D + 2 * Kd, p.act + t * D + 2 * Kd + Vd, p.v + t * Vd);
    for (int64_t t = b; t < e; ++t)
      for (int64_t h = 0; h < s.nv; ++h) {
        const int64_t i = t * s.nv + h;
        p.beta[i] = sigmoid(S.braw[i]);
        p.g[i] = -std::exp(w.A_log[h]) * softplus(S.araw[i] + w.dt_bias[h]);
      }
  });
}

// gated = silu(z) * (norm_w * rmsnorm(o)) per value head; normed and rstd written too.
template <typename Real>
void gated_norm_forward(const DeltaNetSpec& s, int64_t N, const Real* norm_w, const Real* o, const Real* z,
                        Real* normed, Real* rstd, Real* gated) {
  rmsnorm_forward(normed, rstd, o, norm_w, N * s.nv, s.dv, s.norm_eps);
  swiglu_forward(gated, z, normed, N * s.value_dim(), s.threads);
}

}  // namespace

template <typename Real>
int64_t deltanet_saved_bytes(const DeltaNetSpec& s, int64_t N) {
  check_spec(s);
  return measured_bytes([&](Arena& a) { carve_saved<Real>(a, s, N); });
}

template <typename Real>
int64_t deltanet_forward_workspace_bytes(const DeltaNetSpec& s, DeltaRuleExtent e) {
  check_spec(s);
  return measured_bytes([&](Arena& a) { carve_forward<Real>(a, s, e); });
}

template <typename Real>
int64_t deltanet_backward_workspace_bytes(const DeltaNetSpec& s, DeltaRuleExtent e) {
  check_spec(s);
  return measured_bytes([&](Arena& a) { carve_backward<Real>(a, s, e); });
}

template <typename Real>
void deltanet_forward(const DeltaNetSpec& s, DeltaRuleSegments seg, const DeltaNetWeights<const Real>& w,
                      const Real* h, Real* y, bool accumulate_y, Workspace saved, Workspace ws) {
  check_spec(s);
  const int64_t N = rows(seg), C = s.C, Vd = s.value_dim();
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, N);
  Arena arena(ws);
  const ForwardScratch<Real> f = carve_forward<Real>(arena, s, extent_of(seg));
  linear_forward(S.mixed, h, w.in_proj_qkv, static_cast<const Real*>(nullptr), N, C, s.qkv_dim(), false);
  linear_forward(S.z, h, w.in_proj_z, static_cast<const Real*>(nullptr), N, C, Vd, false);
  linear_forward(S.braw, h, w.in_proj_b, static_cast<const Real*>(nullptr), N, C, s.nv, false);
  linear_forward(S.araw, h, w.in_proj_a, static_cast<const Real*>(nullptr), N, C, s.nv, false);
  prepare(s, seg, w, S, f.p);
  delta_rule_forward(rule_spec(s), seg, f.p.q, f.p.k, f.p.v, f.p.g, f.p.beta, S.o, f.rule);
  gated_norm_forward(s, N, w.norm, S.o, S.z, f.normed, S.rstd, f.gated);
  linear_forward(y, f.gated, w.out_proj, static_cast<const Real*>(nullptr), N, Vd, C, accumulate_y);
}

template <typename Real>
void deltanet_backward(const DeltaNetSpec& s, DeltaRuleSegments seg, const DeltaNetWeights<const Real>& w,
                       const Real* h, Workspace saved, const Real* dy, Real* dh, bool accumulate_dh,
                       const DeltaNetWeights<Real>& dw, Workspace ws) {
  check_spec(s);
  const int64_t N = rows(seg), C = s.C, D = s.qkv_dim(), Kd = s.key_dim(), Vd = s.value_dim();
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, N);
  Arena arena(ws);
  const BackwardScratch<Real> b = carve_backward<Real>(arena, s, extent_of(seg));
  prepare(s, seg, w, S, b.p);
  // The gated norm's output from the saved 1/rms (bitwise the forward's).
  rmsnorm_apply(b.normed, S.rstd, S.o, w.norm, N * s.nv, s.dv);
  swiglu_forward(b.gated, S.z, b.normed, N * Vd, s.threads);
  // y = gated W_out^T; gated = silu(z) * normed; normed = w_norm * rmsnorm(o).
  linear_backward(b.dgated, dw.out_proj, static_cast<Real*>(nullptr), dy, b.gated, w.out_proj, N, Vd, C, false);
  swiglu_backward(b.dz, b.dnormed, b.dgated, S.z, b.normed, N * Vd, s.threads);
  rmsnorm_backward(b.do_, dw.norm, b.dnormed, S.o, S.rstd, w.norm, N * s.nv, s.dv, false);
  delta_rule_backward(rule_spec(s), seg, b.p.q, b.p.k, b.p.v, b.p.g, b.p.beta, b.do_, b.dq, b.dk, b.dv, b.dg,
                      b.dbeta, b.rule);
  // beta = sigmoid(braw); g = -exp(A_log) softplus(araw + dt_bias). The per-head sums run over rows
  // in order on one thread (nv values: no reason to split them).
  for (int64_t t = 0; t < N; ++t)
    for (int64_t hd = 0; hd < s.nv; ++hd) {
      const int64_t i = t * s.nv + hd;
      const Real beta = b.p.beta[i];
      b.dbraw[i] = b.dbeta[i] * beta * (Real(1) - beta);
      const Real u = S.araw[i] + w.dt_bias[hd];
      dw.A_log[hd] += b.dg[i] * b.p.g[i];
      const Real du = -b.dg[i] * std::exp(w.A_log[hd]) * (u > Real(20) ? Real(1) : sigmoid(u));
      b.daraw[i] = du;
      dw.dt_bias[hd] += du;
    }
  // q = l2norm(act_q) / sqrt(dk), k = l2norm(act_k), v = act_v; then through SiLU, in place.
  for_each_slice(N, s.threads, [&](int64_t lo, int64_t hi) {
    l2norm_rows_backward(b.dact + lo * D, D, b.dq + lo * Kd, b.p.act + lo * D, D, hi - lo, s.nk, s.dk, q_scale<Real>(s));
    l2norm_rows_backward(b.dact + lo * D + Kd, D, b.dk + lo * Kd, b.p.act + lo * D + Kd, D, hi - lo, s.nk, s.dk,
                         Real(1));
    for (int64_t t = lo; t < hi; ++t) std::copy(b.dv + t * Vd, b.dv + (t + 1) * Vd, b.dact + t * D + 2 * Kd);
    for (int64_t i = lo * D; i < hi * D; ++i) {
      const Real x = b.p.conv[i], sg = sigmoid(x);
      b.dact[i] *= sg * (Real(1) + x * (Real(1) - sg));
    }
  });
  conv_backward(s, seg, w.conv, S.mixed, b.dact, b.dmixed, dw.conv);
  linear_backward(dh, dw.in_proj_qkv, static_cast<Real*>(nullptr), b.dmixed, h, w.in_proj_qkv, N, C, D,
                  accumulate_dh);
  linear_backward(dh, dw.in_proj_z, static_cast<Real*>(nullptr), b.dz, h, w.in_proj_z, N, C, Vd, true);
  linear_backward(dh, dw.in_proj_b, static_cast<Real*>(nullptr), b.dbraw, h, w.in_proj_b, N, C, s.nv, true);
  linear_backward(dh, dw.in_proj_a, static_cast<Real*>(nullptr), b.daraw, h, w.in_proj_a, N, C, s.nv, true);
}

#define SLIDEDP_DELTANET(Real)                                                                                     \
  template int64_t deltanet_saved_bytes<Real>(const DeltaNetSpec&, int64_t);                                       \
  template int64_t deltanet_forward_workspace_bytes<Real>(const DeltaNetSpec&, DeltaRuleExtent);                   \
  template int64_t deltanet_backward_workspace_bytes<Real>(const DeltaNetSpec&, DeltaRuleExtent);                  \
  template void deltanet_forward<Real>(const DeltaNetSpec&, DeltaRuleSegments, const DeltaNetWeights<const Real>&, \
                                       const Real*, Real*, bool, Workspace, Workspace);                            \
  template void deltanet_backward<Real>(const DeltaNetSpec&, DeltaRuleSegments, const DeltaNetWeights<const Real>&, \
                                        const Real*, Workspace, const Real*, Real*, bool, const DeltaNetWeights<Real>&, \
                                        Workspace);
SLIDEDP_DELTANET(float)
SLIDEDP_DELTANET(double)
#undef SLIDEDP_DELTANET

}  // namespace slidedp::kernels
