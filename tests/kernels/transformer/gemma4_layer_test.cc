// The Gemma 4 decoder layer unit (kernels/cpu/transformer/gemma4_layer.h) against a naive forward
// written from shared/reference/model-families.md section 2.4 with the naive ops (full-matrix
// windowed attention, explicit norms and GELU), against finite differences of its own forward for
// every parameter and the input, recompute bitwise equal to forward, results independent of threads.
// Both layer types of a tiny card: a sliding layer (window 3, shorter than T) and a K=V global layer
// with its own head_dim, KV heads and proportional RoPE.
#include "kernels/cpu/transformer/gemma4_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/reference_ops.h"
#include "kernels/cpu/transformer/rope.h"
#include "tests/kernels/transformer/layer_run_util.h"
#include "tests/kernels/transformer/test_util.h"
#include "tests/kernels/transformer/tiny_cards.h"

namespace slidedp::kernels::test {
namespace {

struct Layer {
  ModelCard card;
  ModelLayout layout;
  Gemma4LayerSpec spec;
  std::vector<double> params;
  explicit Layer(int layer, bool moe = false, int64_t tile = 2)
      : card(tiny_gemma4(moe)), layout(make_model_layout(card)) {
    const UnitLayout& u = layout.units[static_cast<size_t>(layer) + 1];
    spec = make_gemma4_layer_spec(card, u);
    spec.attn_tile = tile;
    params = random_unit_params(u, 300 + static_cast<uint64_t>(layer));
    params[static_cast<size_t>(spec.layer_scalar)] = 0.7;  // a checkpoint value, not 1
    // a confident router (logits of a few units, as trained ones are): the top-k choices sit far
    // from ties, which finite differences need
    if (moe)
      for (int64_t c = 0; c < spec.C; ++c) params[static_cast<size_t>(spec.router_scale + c)] *= 12.0;
  }
};

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// The layer from the reference's math, naive ops only. min_gap (if given): how far the router's
// top-k choice is from a tie (naive::Routing::min_gap).
std::vector<double> naive_forward(const Gemma4LayerSpec& s, const std::vector<double>& P,
                                  const std::vector<double>& x, int64_t B, int64_t T,
                                  double* min_gap = nullptr) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  const double* p = P.data();
  const std::vector<double> ones(static_cast<size_t>(s.hd), 1.0);
  const double* none = nullptr;
  std::vector<double> h(N * C), ql(N * Q), kl(N * K), vl(N * K), q(N * Q), k(N * K), v(N * K), att(N * Q),
      a(N * C), an(N * C), h1(N * C), z(N * C), g(N * I), u(N * I), m(N * I), d(N * C), dn(N * C), y(N * C);
  naive::rmsnorm_forward(h.data(), x.data(), p + s.input_norm, N, C, s.eps);
  naive::linear_forward(ql.data(), h.data(), p + s.q_w, none, N, C, Q);
  naive::linear_forward(kl.data(), h.data(), p + s.k_w, none, N, C, K);
  if (s.k_eq_v)
    vl = kl;  // v = v_norm(k_proj(h)): the raw projection
  else
    naive::linear_forward(vl.data(), h.data(), p + s.v_w, none, N, C, K);
  naive::rmsnorm_forward(q.data(), ql.data(), p + s.q_norm, N * s.H, s.hd, s.eps);
  naive::rmsnorm_forward(k.data(), kl.data(), p + s.k_norm, N * s.KV, s.hd, s.eps);
  naive::rmsnorm_forward(v.data(), vl.data(), ones.data(), N * s.KV, s.hd, s.eps);
  naive::rope_forward(q.data(), s.inv_freq, B, T, s.H, s.hd);
  naive::rope_forward(k.data(), s.inv_freq, B, T, s.KV, s.hd);
  naive::attention_forward(att.data(), static_cast<double*>(nullptr), q.data(), k.data(), v.data(), B, T, s.H,
                           s.KV, s.hd, 1.0, s.window);
  naive::linear_forward(a.data(), att.data(), p + s.o_w, none, N, Q, C);
  naive::rmsnorm_forward(an.data(), a.data(), p + s.post_attn_norm, N, C, s.eps);
  for (int64_t i = 0; i < N * C; ++i) h1[i] = x[i] + an[i];
  naive::rmsnorm_forward(z.data(), h1.data(), p + s.pre_ff_norm, N, C, s.eps);
  naive::linear_forward(g.data(), z.data(), p + s.gate_w, none, N, C, I);
  naive::linear_forward(u.data(), z.data(), p + s.up_w, none, N, C, I);
  for (int64_t i = 0; i < N * I; ++i) m[i] = gelu(g[i]) * u[i];
  naive::linear_forward(d.data(), m.data(), p + s.down_w, none, N, I, C);
  if (s.has_moe()) {  // d = norm_post_ff_1(d) + norm_post_ff_2(experts(norm_pre_ff_2(h1)))
    const int64_t E = s.moe.E, Kr = s.moe.K;
    const std::vector<double> ones_c(static_cast<size_t>(C), 1.0);
    std::vector<double> d1(N * C), r(N * C), logits(N * E), z2(N * C), eo_n(N * C);
    naive::rmsnorm_forward(d1.data(), d.data(), p + s.post_ff_norm_1, N, C, s.eps);
    naive::rmsnorm_forward(r.data(), h1.data(), ones_c.data(), N, C,
                           s.eps);  // weightless, then scale, then H^-1/2
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < C; ++c)
        r[t * C + c] *= p[s.router_scale + c] / std::sqrt(static_cast<double>(C));
    naive::linear_forward(logits.data(), r.data(), p + s.router_w, none, N, C, E);
    naive::Routing route = naive::route_topk(logits, N, E, Kr);
    if (min_gap != nullptr) *min_gap = route.min_gap;
    for (int64_t i = 0; i < N * Kr; ++i) route.w[i] *= p[s.per_expert_scale + route.idx[i]];
    naive::rmsnorm_forward(z2.data(), h1.data(), p + s.pre_ff_norm_2, N, C, s.eps);
    const std::vector<double> gate_up(p + s.experts_gate_up, p + s.experts_gate_up + E * 2 * s.moe.Ie * C),
        down(p + s.experts_down, p + s.experts_down + E * C * s.moe.Ie);
    const std::vector<double> eo = naive::moe_experts(s.moe, gate_up, down, z2, route.idx, route.w, N);
    naive::rmsnorm_forward(eo_n.data(), eo.data(), p + s.post_ff_norm_2, N, C, s.eps);
    for (int64_t i = 0; i < N * C; ++i) d[i] = d1[i] + eo_n[i];
  }
  naive::rmsnorm_forward(dn.data(), d.data(), p + s.post_ff_norm, N, C, s.eps);
  for (int64_t i = 0; i < N * C; ++i) y[i] = (h1[i] + dn[i]) * p[s.layer_scalar];
  return y;
}

template <typename Real>
LayerRun<Real> run(const Gemma4LayerSpec& s, const std::vector<Real>& p, const std::vector<Real>& x,
                   const std::vector<Real>& dy, int64_t B, int64_t T) {
  static const LayerUnit<Real, Gemma4LayerSpec> unit{&gemma4_saved_bytes<Real>, &gemma4_forward_workspace_bytes<Real>,
                                             &gemma4_backward_workspace_bytes<Real>, &gemma4_forward<Real>,
                                             &gemma4_backward<Real>};
  return run_layer(unit, s, p, x, dy, B, T);
}

constexpr int64_t kB = 2, kT = 7;

TEST(Gemma4Layer, SpecsFollowTheLayerShapes) {
  const Layer sliding(0), global(1);
  EXPECT_EQ(sliding.spec.window, 3);
  EXPECT_FALSE(sliding.spec.k_eq_v);
  EXPECT_EQ(sliding.spec.hd, 4);
  EXPECT_EQ(global.spec.window, 0);
  EXPECT_TRUE(global.spec.k_eq_v);
  EXPECT_EQ(global.spec.v_w, kAbsent);
  EXPECT_EQ(global.spec.hd, 8);
  EXPECT_EQ(global.spec.KV, 1);
  // proportional RoPE: int(0.5 * 8 // 2) = 2 of 4 pairs rotate
  EXPECT_GT(global.spec.inv_freq[1], 0.0);
  EXPECT_EQ(global.spec.inv_freq[2], 0.0);
  EXPECT_EQ(global.spec.inv_freq[3], 0.0);
}

// Every layer kind: sliding and global, dense and with the MoE block.
struct Kind {
  int layer;
  bool moe;
  const char* name;
};
constexpr Kind kKinds[] = {{0, false, "sliding"},
                           {1, false, "global, K=V"},
                           {0, true, "sliding, MoE"},
                           {1, true, "global, K=V, MoE"}};

TEST(Gemma4Layer, ForwardMatchesTheNaiveLayerInBothPrecisions) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    const Layer l(kind.layer, kind.moe);
    const auto x = random_vector<double>(kB * kT * l.spec.C, 310, -2, 2);
    const std::vector<double> ref = naive_forward(l.spec, l.params, x, kB, kT);
    EXPECT_TRUE(all_close(run<double>(l.spec, l.params, x, {}, kB, kT).y, ref, 1e-12, 1e-12, "y fp64"));
    const std::vector<float> pf(l.params.begin(), l.params.end()), xf(x.begin(), x.end());
    EXPECT_TRUE(all_close(run<float>(l.spec, pf, xf, {}, kB, kT).y, ref, 2e-5, 2e-5, "y fp32"));
  }
}

TEST(Gemma4Layer, BackwardMatchesFiniteDifferencesForEveryParameterAndTheInput) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    Layer l(kind.layer, kind.moe);
    auto x = random_vector<double>(kB * kT * l.spec.C, 311, -2, 2);
    if (kind.moe) {  // top-k is not differentiable: a 1e-5 step must not flip any token's choice
      double gap = 0;
      naive_forward(l.spec, l.params, x, kB, kT, &gap);
      ASSERT_GT(gap, 1e-3) << "a token's router choice is near a tie; pick another seed";
    }
    const auto r = random_vector<double>(kB * kT * l.spec.C, 312);
    const LayerRun<double> res = run<double>(l.spec, l.params, x, r, kB, kT);
    auto loss = [&] { return dot(run<double>(l.spec, l.params, x, {}, kB, kT).y, r); };
    EXPECT_TRUE(check_finite_differences(x, res.dx, loss, "dx"));
    // every parameter, except layer_scalar: a buffer transformers never trains, so its gradient is 0
    // (finite differences would see its true derivative, so it is left out of the comparison)
    const size_t scalar = static_cast<size_t>(l.spec.layer_scalar);
    EXPECT_EQ(res.grads[scalar], 0.0);
    std::vector<double> grads_no_scalar = res.grads, fd(res.grads.size(), 0.0);
    for (size_t i = 0; i < l.params.size(); ++i) {
      if (i == scalar) continue;
      fd[i] = central_difference(l.params, i, loss);
    }
    EXPECT_TRUE(all_close(grads_no_scalar, fd, 1e-6, 1e-6, "dparams vs finite differences"));
  }
}

TEST(Gemma4Layer, RecomputeIsBitwiseTheSavedStateAndThreadsChangeNothing) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    const Layer l(kind.layer, kind.moe);
    const std::vector<float> p(l.params.begin(), l.params.end());
    const auto x = random_vector<float>(kB * kT * l.spec.C, 313, -2, 2);
    const auto dy = random_vector<float>(kB * kT * l.spec.C, 314);
    const LayerRun<float> a = run<float>(l.spec, p, x, dy, kB, kT);
    AlignedBuffer saved(gemma4_saved_bytes<float>(l.spec, kB, kT));
    std::memset(saved.data(), 0, static_cast<size_t>(saved.bytes()));
    AlignedBuffer ws(gemma4_forward_workspace_bytes<float>(l.spec, kB, kT));
    gemma4_recompute(l.spec, p.data(), x.data(), saved.workspace(), kB, kT, ws.workspace());
    // forward ran on zeroed-then-written saved bytes too: compare the whole buffers
    AlignedBuffer fresh(gemma4_saved_bytes<float>(l.spec, kB, kT));
    std::memset(fresh.data(), 0, static_cast<size_t>(fresh.bytes()));
    std::vector<float> y(x.size());
    AlignedBuffer fws(gemma4_forward_workspace_bytes<float>(l.spec, kB, kT));
    gemma4_forward(l.spec, p.data(), x.data(), y.data(), fresh.workspace(), kB, kT, fws.workspace());
    EXPECT_EQ(std::memcmp(saved.data(), fresh.data(), static_cast<size_t>(saved.bytes())), 0);
    Gemma4LayerSpec threaded = l.spec;
    threaded.threads = 3;
    const LayerRun<float> b = run<float>(threaded, p, x, dy, kB, kT);
    EXPECT_EQ(a.y, b.y);
    EXPECT_EQ(a.dx, b.dx);
    EXPECT_EQ(a.grads, b.grads);
  }
}

}  // namespace
}  // namespace slidedp::kernels::test
