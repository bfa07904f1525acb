// Naive reference ops; see reference_ops.h. Clarity over speed, always.
#include "kernels/cpu/transformer/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace slidedp::kernels::naive {

template <typename Real>
void linear_forward(Real* out, const Real* in, const Real* w, const Real* bias, int64_t N, int64_t IN,
                    int64_t OUT) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      Real acc = bias != nullptr ? bias[o] : Real(0);
      for (int64_t i = 0; i < IN; ++i) acc += in[n * IN + i] * w[o * IN + i];
      out[n * OUT + o] = acc;
    }
}

template <typename Real>
void linear_backward(Real* din, Real* dw, Real* dbias, const Real* dout, const Real* in, const Real* w,
                     int64_t N, int64_t IN, int64_t OUT) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IN; ++i) {
      Real acc = 0;
      for (int64_t o = 0; o < OUT; ++o) acc += dout[n * OUT + o] * w[o * IN + i];
      din[n * IN + i] = acc;
    }
  for (int64_t o = 0; o < OUT; ++o)
    for (int64_t i = 0; i < IN; ++i) {
      Real acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += dout[n * OUT + o] * in[n * IN + i];
      dw[o * IN + i] += acc;
    }
  if (dbias != nullptr)
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t n = 0; n < N; ++n) dbias[o] += dout[n * OUT + o];
}

template <typename Real>
void rmsnorm_forward(Real* y, const Real* x, const Real* w, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    Real ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    ms /= static_cast<Real>(C);
    const Real r = Real(1) / std::sqrt(ms + static_cast<Real>(eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = w[c] * (x[n * C + c] * r);
  }
}

template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w, int64_t N, int64_t C,
                      double eps) {
  for (int64_t n = 0; n < N; ++n) {
    const Real* xr = x + n * C;
    Real ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += xr[c] * xr[c];
    ms /= static_cast<Real>(C);
    const Real r = Real(1) / std::sqrt(ms + static_cast<Real>(eps));
    // y_j = w_j x_j r;  dy_j/dx_i = w_j (delta_ij r - x_j x_i r^3 / C)
    for (int64_t i = 0; i < C; ++i) {
      Real acc = 0;
      for (int64_t j = 0; j < C; ++j) {
        const Real jac = w[j] * ((i == j ? r : Real(0)) - xr[j] * xr[i] * r * r * r / static_cast<Real>(C));
        acc += dy[n * C + j] * jac;
      }
      dx[n * C + i] = acc;
    }
    for (int64_t c = 0; c < C; ++c) dw[c] += dy[n * C + c] * xr[c] * r;
  }
}

namespace {

template <typename Real>
void rope_apply(Real* x, const std::vector<double>& inv_freq, int64_t B, int64_t T, int64_t nh, int64_t hd,
                double sign) {
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < half; ++i) {
          Real* v = x + ((b * T + t) * nh + h) * hd;
          const double angle = sign * static_cast<double>(t) * inv_freq[i];
          const Real c = static_cast<Real>(std::cos(angle)), s = static_cast<Real>(std::sin(angle));
          const Real a = v[i], bb = v[i + half];
          v[i] = a * c - bb * s;
          v[i + half] = a * s + bb * c;
        }
}

template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

}  // namespace

template <typename Real>
void rope_forward(Real* x, const std::vector<double>& inv_freq, int64_t B, int64_t T, int64_t nh,
                  int64_t hd) {
  rope_apply(x, inv_freq, B, T, nh, hd, 1.0);
}

template <typename Real>
void rope_backward(Real* dx, const std::vector<double>& inv_freq, int64_t B, int64_t T, int64_t nh,
                   int64_t hd) {
  rope_apply(dx, inv_freq, B, T, nh, hd, -1.0);  // the transpose of a rotation is the inverse rotation
}

template <typename Real>
void swiglu_forward(Real* m, const Real* g, const Real* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) m[i] = g[i] * sigmoid(g[i]) * u[i];
}

template <typename Real>
void swiglu_backward(Real* dg, Real* du, const Real* dm, const Real* g, const Real* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Real s = sigmoid(g[i]);
    du[i] = dm[i] * g[i] * s;
    dg[i] = dm[i] * u[i] * (s + g[i] * s * (Real(1) - s));
  }
}

// The first key the query at t sees.
inline int64_t first_key(int64_t t, int64_t window) { return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0; }

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, int64_t B,
                       int64_t T, int64_t H, int64_t KV, int64_t hd, double score_scale, int64_t window) {
  const Real scale = score_scale > 0 ? static_cast<Real>(score_scale) : Real(1) / std::sqrt(static_cast<Real>(hd));
  std::vector<Real> p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        const Real* qt = q + ((b * T + t) * H + h) * hd;
        Real mx = -std::numeric_limits<Real>::infinity();
        for (int64_t j = first_key(t, window); j <= t; ++j) {
          const Real* kj = k + ((b * T + j) * KV + g) * hd;
          Real s = 0;
          for (int64_t d = 0; d < hd; ++d) s += qt[d] * kj[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        Real sum = 0;
        for (int64_t j = first_key(t, window); j <= t; ++j) sum += std::exp(p[j] - mx);
        if (lse != nullptr) lse[(b * H + h) * T + t] = mx + std::log(sum);
        Real* o = out + ((b * T + t) * H + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = 0;
        for (int64_t j = first_key(t, window); j <= t; ++j) {
          const Real pj = std::exp(p[j] - mx) / sum;
          const Real* vj = v + ((b * T + j) * KV + g) * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] += pj * vj[d];
        }
      }
    }
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, double score_scale,
                        int64_t window) {
  const Real scale = score_scale > 0 ? static_cast<Real>(score_scale) : Real(1) / std::sqrt(static_cast<Real>(hd));
  std::fill(dq, dq + B * T * H * hd, Real(0));
  std::fill(dk, dk + B * T * KV * hd, Real(0));
  std::fill(dv, dv + B * T * KV * hd, Real(0));
  std::vector<Real> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        const Real* qt = q + ((b * T + t) * H + h) * hd;
        const Real* dot = dout + ((b * T + t) * H + h) * hd;
        // probabilities of row t
        Real mx = -std::numeric_limits<Real>::infinity();
        for (int64_t j = first_key(t, window); j <= t; ++j) {
          Real s = 0;
          for (int64_t d = 0; d < hd; ++d) s += qt[d] * k[((b * T + j) * KV + g) * hd + d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        Real sum = 0;
        for (int64_t j = first_key(t, window); j <= t; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = first_key(t, window); j <= t; ++j) p[j] = std::exp(p[j] - mx) / sum;
        // dp_j = dout . v_j ; softmax Jacobian: ds_j = p_j (dp_j - sum_i p_i dp_i)
        Real pdp = 0;
        for (int64_t j = first_key(t, window); j <= t; ++j) {
          Real s = 0;
          for (int64_t d = 0; d < hd; ++d) s += dot[d] * v[((b * T + j) * KV + g) * hd + d];
          dp[j] = s;
          pdp += p[j] * s;
        }
        for (int64_t j = first_key(t, window); j <= t; ++j) {
          const Real ds = p[j] * (dp[j] - pdp);
          for (int64_t d = 0; d < hd; ++d) {
            dq[((b * T + t) * H + h) * hd + d] += scale * ds * k[((b * T + j) * KV + g) * hd + d];
            dk[((b * T + j) * KV + g) * hd + d] += scale * ds * qt[d];
            dv[((b * T + j) * KV + g) * hd + d] += p[j] * dot[d];
          }
        }
      }
    }
}

template <typename Real>
LossResult cross_entropy(const Real* h, const Real* w, const int32_t* targets, int64_t N, int64_t C,
                         int64_t V, double grad_scale, Real* dh, Real* dw, double softcap) {
  std::vector<Real> logits(static_cast<size_t>(N * V)), raw(static_cast<size_t>(N * V));
  linear_forward(raw.data(), h, w, static_cast<const Real*>(nullptr), N, C, V);
  const Real cap = static_cast<Real>(softcap);
  for (size_t i = 0; i < raw.size(); ++i) logits[i] = softcap > 0 ? cap * std::tanh(raw[i] / cap) : raw[i];
  LossResult r;
  std::vector<Real> dlogits(static_cast<size_t>(N * V), Real(0));
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    const Real* row = logits.data() + n * V;
    const Real mx = *std::max_element(row, row + V);
    Real sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(row[c] - mx);
    const Real lse = mx + std::log(sum);
    r.loss_sum += static_cast<double>(lse - row[targets[n]]);
    ++r.num_tokens;
    for (int64_t c = 0; c < V; ++c) {
      dlogits[n * V + c] =
          static_cast<Real>(grad_scale) * (std::exp(row[c] - lse) - (c == targets[n] ? 1 : 0));
      if (softcap > 0) {  // d logit / d raw = sech^2(raw / cap)
        const Real ch = std::cosh(raw[n * V + c] / cap);
        dlogits[n * V + c] /= ch * ch;
      }
    }
  }
  if (dh != nullptr) linear_backward(dh, dw, static_cast<Real*>(nullptr), dlogits.data(), h, w, N, C, V);
  return r;
}

template <typename Real>
void decoder_forward(const DecoderSpec& s, const Real* p, const Real* x, Real* y, int64_t B, int64_t T) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  auto opt = [&](int64_t off) { return off == kAbsent ? nullptr : p + off; };
  std::vector<Real> h1(N * C), q(N * Q), k(N * K), v(N * K), att(N * Q), a(N * C), x2(N * C), h2(N * C),
      g(N * I), u(N * I), m(N * I), d(N * C);
  rmsnorm_forward(h1.data(), x, p + s.input_norm, N, C, s.eps);
  linear_forward(q.data(), h1.data(), p + s.q_w, opt(s.q_b), N, C, Q);
  linear_forward(k.data(), h1.data(), p + s.k_w, opt(s.k_b), N, C, K);
  linear_forward(v.data(), h1.data(), p + s.v_w, opt(s.v_b), N, C, K);
  if (s.qk_norm) {
    std::vector<Real> qn(N * Q), kn(N * K);
    rmsnorm_forward(qn.data(), q.data(), p + s.q_norm, N * s.H, s.hd, s.eps);
    rmsnorm_forward(kn.data(), k.data(), p + s.k_norm, N * s.KV, s.hd, s.eps);
    q.swap(qn);
    k.swap(kn);
  }
  rope_forward(q.data(), s.inv_freq, B, T, s.H, s.hd);
  rope_forward(k.data(), s.inv_freq, B, T, s.KV, s.hd);
  attention_forward(att.data(), static_cast<Real*>(nullptr), q.data(), k.data(), v.data(), B, T, s.H, s.KV,
                    s.hd);
  linear_forward(a.data(), att.data(), p + s.o_w, static_cast<const Real*>(nullptr), N, Q, C);
  for (int64_t i = 0; i < N * C; ++i) x2[i] = x[i] + a[i];
  rmsnorm_forward(h2.data(), x2.data(), p + s.post_norm, N, C, s.eps);
  linear_forward(g.data(), h2.data(), p + s.gate_w, static_cast<const Real*>(nullptr), N, C, I);
  linear_forward(u.data(), h2.data(), p + s.up_w, static_cast<const Real*>(nullptr), N, C, I);
  swiglu_forward(m.data(), g.data(), u.data(), N * I);
  linear_forward(d.data(), m.data(), p + s.down_w, static_cast<const Real*>(nullptr), N, I, C);
  for (int64_t i = 0; i < N * C; ++i) y[i] = x2[i] + d[i];
}

Routing route_topk(const std::vector<double>& logits, int64_t N, int64_t E, int64_t K) {
  Routing r{std::vector<double>(N * E), std::vector<double>(N * K), std::vector<int32_t>(N * K),
            std::numeric_limits<double>::infinity()};
  for (int64_t t = 0; t < N; ++t) {
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(logits[t * E + e]);
    for (int64_t e = 0; e < E; ++e) r.probs[t * E + e] = std::exp(logits[t * E + e]) / z;
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return r.probs[t * E + a] > r.probs[t * E + b]; });
    double top = 0;
    for (int64_t k = 0; k < K; ++k) top += r.probs[t * E + order[k]];
    for (int64_t k = 0; k < K; ++k) {
      r.idx[t * K + k] = order[k];
      r.w[t * K + k] = r.probs[t * E + order[k]] / top;
    }
    if (K < E) r.min_gap = std::min(r.min_gap, r.probs[t * E + order[K - 1]] - r.probs[t * E + order[K]]);
  }
  return r;
}

std::vector<double> gated_delta_rule(const DeltaRuleSpec& s, const std::vector<int64_t>& segment_offsets,
                                     const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& g,
                                     const std::vector<double>& b) {
  const int64_t N = segment_offsets.back(), dk = s.dk, dv = s.dv, r = s.nv / s.nk;
  std::vector<double> o(static_cast<size_t>(N * s.nv * dv));
  std::vector<double> S(static_cast<size_t>(dk * dv)), delta(static_cast<size_t>(dv));
  for (size_t seg = 0; seg + 1 < segment_offsets.size(); ++seg)
    for (int64_t h = 0; h < s.nv; ++h) {
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t t = segment_offsets[seg]; t < segment_offsets[seg + 1]; ++t) {
        const double* qt = &q[static_cast<size_t>((t * s.nk + h / r) * dk)];
        const double* kt = &k[static_cast<size_t>((t * s.nk + h / r) * dk)];
        const double* vt = &v[static_cast<size_t>((t * s.nv + h) * dv)];
        const double decay = std::exp(g[static_cast<size_t>(t * s.nv + h)]), beta = b[static_cast<size_t>(t * s.nv + h)];
        for (double& x : S) x *= decay;
        for (int64_t c = 0; c < dv; ++c) {
          double stk = 0;
          for (int64_t i = 0; i < dk; ++i) stk += S[static_cast<size_t>(i * dv + c)] * kt[i];
          delta[static_cast<size_t>(c)] = beta * (vt[c] - stk);
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t c = 0; c < dv; ++c) S[static_cast<size_t>(i * dv + c)] += kt[i] * delta[static_cast<size_t>(c)];
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < dk; ++i) acc += S[static_cast<size_t>(i * dv + c)] * qt[i];
          o[static_cast<size_t>((t * s.nv + h) * dv + c)] = acc;
        }
      }
    }
  return o;
}

std::vector<double> gated_deltanet(const DeltaNetSpec& s, const std::vector<int64_t>& segment_offsets,
                                   const DeltaNetParams& w, const std::vector<double>& h) {
  const int64_t N = segment_offsets.back(), C = s.C, D = s.qkv_dim(), Kd = s.key_dim(), Vd = s.value_dim();
  const int64_t K = s.conv_kernel;
  auto at = [](const std::vector<double>& x, int64_t i) { return x[static_cast<size_t>(i)]; };
  auto project = [&](const std::vector<double>& W, int64_t out) {
    std::vector<double> y(static_cast<size_t>(N * out));
    for (int64_t t = 0; t < N; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += at(h, t * C + c) * at(W, o * C + c);
        y[static_cast<size_t>(t * out + o)] = acc;
      }
    return y;
  };
  const std::vector<double> mixed = project(w.in_proj_qkv, D), z = project(w.in_proj_z, Vd);
  const std::vector<double> braw = project(w.in_proj_b, s.nv), araw = project(w.in_proj_a, s.nv);
  // causal depthwise conv, zero before each segment, then SiLU
  std::vector<double> act(static_cast<size_t>(N * D));
  for (size_t sg = 0; sg + 1 < segment_offsets.size(); ++sg)
    for (int64_t t = segment_offsets[sg]; t < segment_offsets[sg + 1]; ++t)
      for (int64_t c = 0; c < D; ++c) {
        double x = 0;
        for (int64_t i = 0; i < K; ++i) {
          const int64_t src = t - (K - 1) + i;
          if (src >= segment_offsets[sg]) x += at(w.conv, c * K + i) * at(mixed, src * D + c);
        }
        act[static_cast<size_t>(t * D + c)] = x / (1 + std::exp(-x));
      }
  std::vector<double> q(static_cast<size_t>(N * Kd)), k(static_cast<size_t>(N * Kd)), v(static_cast<size_t>(N * Vd));
  std::vector<double> g(static_cast<size_t>(N * s.nv)), beta(static_cast<size_t>(N * s.nv));
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t hd = 0; hd < s.nk; ++hd)
      for (int64_t which = 0; which < 2; ++which) {
        const int64_t from = t * D + which * Kd + hd * s.dk;
        double ss = 0;
        for (int64_t i = 0; i < s.dk; ++i) ss += at(act, from + i) * at(act, from + i);
        const double scale = (which == 0 ? 1 / std::sqrt(static_cast<double>(s.dk)) : 1.0) / std::sqrt(ss + 1e-6);
        for (int64_t i = 0; i < s.dk; ++i)
          (which == 0 ? q : k)[static_cast<size_t>(t * Kd + hd * s.dk + i)] = at(act, from + i) * scale;
      }
    for (int64_t i = 0; i < Vd; ++i) v[static_cast<size_t>(t * Vd + i)] = at(act, t * D + 2 * Kd + i);
    for (int64_t hd = 0; hd < s.nv; ++hd) {
      const int64_t i = t * s.nv + hd;
      beta[static_cast<size_t>(i)] = 1 / (1 + std::exp(-at(braw, i)));
      const double u = at(araw, i) + at(w.dt_bias, hd);
      g[static_cast<size_t>(i)] = -std::exp(at(w.A_log, hd)) * (u > 20 ? u : std::log1p(std::exp(u)));
    }
  }
  const std::vector<double> o = gated_delta_rule(DeltaRuleSpec{s.nk, s.nv, s.dk, s.dv, s.chunk, 1}, segment_offsets,
                                                 q, k, v, g, beta);
  // w * rmsnorm(o) * silu(z) per value head, then out_proj
  std::vector<double> gated(static_cast<size_t>(N * Vd));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t hd = 0; hd < s.nv; ++hd) {
      const int64_t from = t * Vd + hd * s.dv;
      double ms = 0;
      for (int64_t i = 0; i < s.dv; ++i) ms += at(o, from + i) * at(o, from + i);
      const double rstd = 1 / std::sqrt(ms / static_cast<double>(s.dv) + s.norm_eps);
      for (int64_t i = 0; i < s.dv; ++i) {
        const double zi = at(z, from + i);
        gated[static_cast<size_t>(from + i)] = at(w.norm, i) * at(o, from + i) * rstd * zi / (1 + std::exp(-zi));
      }
    }
  std::vector<double> y(static_cast<size_t>(N * C));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < Vd; ++i) acc += at(gated, t * Vd + i) * at(w.out_proj, c * Vd + i);
      y[static_cast<size_t>(t * C + c)] = acc;
    }
  return y;
}

std::vector<double> moe_experts(const MoeSpec& s, const std::vector<double>& gate_up, const std::vector<double>& down,
                                const std::vector<double>& z, const std::vector<int32_t>& idx,
                                const std::vector<double>& w, int64_t N) {
  const int64_t C = s.C, Ie = s.Ie, K = s.K;
  std::vector<double> y(N * C, 0.0), m(Ie);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = idx[t * K + k];
      for (int64_t i = 0; i < Ie; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < C; ++c) {
          g += gate_up[(e * 2 * Ie + i) * C + c] * z[t * C + c];
          u += gate_up[(e * 2 * Ie + Ie + i) * C + c] * z[t * C + c];
        }
        const double act = s.activation == ExpertActivation::kGeluTanh
                               ? 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)))
                               : g / (1.0 + std::exp(-g));
        m[i] = act * u;
      }
      for (int64_t c = 0; c < C; ++c) {
        double o = 0;
        for (int64_t i = 0; i < Ie; ++i) o += down[(e * C + c) * Ie + i] * m[i];
        y[t * C + c] += w[t * K + k] * o;
      }
    }
  return y;
}

#define SLIDEDP_INSTANTIATE(Real)                                                                           \
  template void linear_forward<Real>(Real*, const Real*, const Real*, const Real*, int64_t, int64_t,        \
                                     int64_t);                                                              \
  template void linear_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, int64_t,  \
                                      int64_t, int64_t);                                                    \
  template void rmsnorm_forward<Real>(Real*, const Real*, const Real*, int64_t, int64_t, double);           \
  template void rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t,        \
                                       int64_t, double);                                                    \
  template void rope_forward<Real>(Real*, const std::vector<double>&, int64_t, int64_t, int64_t, int64_t);  \
  template void rope_backward<Real>(Real*, const std::vector<double>&, int64_t, int64_t, int64_t, int64_t); \
  template void swiglu_forward<Real>(Real*, const Real*, const Real*, int64_t);                             \
  template void swiglu_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t);        \
  template void attention_forward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t,       \
                                        int64_t, int64_t, int64_t, int64_t, double, int64_t);               \
  template void attention_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*,        \
                                         const Real*, int64_t, int64_t, int64_t, int64_t, int64_t, double,  \
                                         int64_t);                                                          \
  template LossResult cross_entropy<Real>(const Real*, const Real*, const int32_t*, int64_t, int64_t,       \
                                          int64_t, double, Real*, Real*, double);                           \
  template void decoder_forward<Real>(const DecoderSpec&, const Real*, const Real*, Real*, int64_t, int64_t);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels::naive
