// The Qwen3.5 / 3.6 decoder layer unit (kernels/cpu/transformer/qwen3_5_layer.h) against a naive
// forward written from shared/reference/model-families.md section 3.4 with the naive ops (explicit
// zero-centred norms, partial RoPE on gathered channels, full-matrix attention, the token-by-token
// DeltaNet recurrence, per-token experts); against finite differences of that naive forward for every
// parameter and the input; recompute bitwise equal to forward; results independent of threads. Both
// layer kinds of a tiny card (a Gated DeltaNet layer and a gated full-attention layer), dense and MoE.
#include "kernels/cpu/transformer/qwen3_5_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "card/unit_layout.h"
#include "kernels/cpu/transformer/reference_ops.h"
#include "tests/kernels/transformer/layer_run_util.h"
#include "tests/kernels/transformer/test_util.h"
#include "tests/kernels/transformer/tiny_cards.h"

namespace slidedp::kernels::test {
namespace {

struct Layer {
  ModelCard card;
  ModelLayout layout;
  Qwen35LayerSpec spec;
  std::vector<double> params;
  Layer(int layer, bool moe) : card(tiny_qwen(moe)), layout(make_model_layout(card)) {
    const UnitLayout& u = layout.units[static_cast<size_t>(layer) + 1];
    spec = make_qwen3_5_layer_spec(card, u);
    spec.attn_tile = 2;
    spec.gdn.chunk = 3;  // chunks that end inside the sequence
    params = random_unit_params(u, 500 + static_cast<uint64_t>(layer) + (moe ? 10 : 0));
    // a router whose top-k choices sit far from ties (finite differences need it; the gap is in
    // probabilities, so a much sharper router shrinks it again: x3 and x4 leave gaps below 1e-4)
    if (moe)
      for (int64_t i = 0; i < spec.moe.E * spec.C; ++i) params[static_cast<size_t>(spec.router_w + i)] *= 2.0;
  }
};

std::vector<double> slice(const std::vector<double>& p, int64_t offset, int64_t n) {
  return std::vector<double>(p.begin() + offset, p.begin() + offset + n);
}

// x * rsqrt(mean x^2 + eps) * (1 + w) over rows of n.
std::vector<double> zero_centred_norm(const std::vector<double>& x, const double* w, int64_t rows, int64_t n,
                                      double eps) {
  std::vector<double> w1(static_cast<size_t>(n)), y(x.size());
  for (int64_t i = 0; i < n; ++i) w1[static_cast<size_t>(i)] = 1 + w[i];
  naive::rmsnorm_forward(y.data(), x.data(), w1.data(), rows, n, eps);
  return y;
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// The layer from the reference's math, naive ops only. min_gap: how far the router's choice is from a tie.
std::vector<double> naive_forward(const Qwen35LayerSpec& s, const std::vector<double>& P, const std::vector<double>& x,
                                  int64_t B, int64_t T, double* min_gap = nullptr) {
  const int64_t N = B * T, C = s.C;
  const double* p = P.data();
  const double* none = nullptr;
  const std::vector<double> h = zero_centred_norm(x, p + s.input_norm, N, C, s.eps);
  std::vector<double> mix(static_cast<size_t>(N * C));
  if (s.linear) {
    const DeltaNetSpec& g = s.gdn;
    const naive::DeltaNetParams w{slice(P, s.qkv_w, g.qkv_dim() * C), slice(P, s.z_w, g.value_dim() * C),
                                  slice(P, s.b_w, g.nv * C),           slice(P, s.a_w, g.nv * C),
                                  slice(P, s.conv_w, g.qkv_dim() * g.conv_kernel), slice(P, s.dt_bias, g.nv),
                                  slice(P, s.A_log, g.nv),             slice(P, s.gdn_norm, g.dv),
                                  slice(P, s.out_w, C * g.value_dim())};
    std::vector<int64_t> seg;
    for (int64_t b = 0; b <= B; ++b) seg.push_back(b * T);
    mix = naive::gated_deltanet(g, seg, w, h);
  } else {
    const int64_t Q = s.q_dim(), K = s.kv_dim(), hd = s.hd, rd = s.rotary_dim;
    std::vector<double> qp(N * 2 * Q), ql(N * Q), gate(N * Q), kl(N * K), v(N * K), att(N * Q);
    naive::linear_forward(qp.data(), h.data(), p + s.q_w, none, N, C, 2 * Q);
    for (int64_t r = 0; r < N * s.H; ++r)
      for (int64_t i = 0; i < hd; ++i) {
        ql[r * hd + i] = qp[2 * r * hd + i];
        gate[r * hd + i] = qp[(2 * r + 1) * hd + i];
      }
    naive::linear_forward(kl.data(), h.data(), p + s.k_w, none, N, C, K);
    naive::linear_forward(v.data(), h.data(), p + s.v_w, none, N, C, K);
    std::vector<double> q = zero_centred_norm(ql, p + s.q_norm, N * s.H, hd, s.eps);
    std::vector<double> k = zero_centred_norm(kl, p + s.k_norm, N * s.KV, hd, s.eps);
    // partial RoPE: rotate_half on the first rd channels of each head, the rest passed through
    for (auto [data, nh] : {std::pair{&q, s.H}, std::pair{&k, s.KV}}) {
      std::vector<double> rot(static_cast<size_t>(N * nh * rd));
      for (int64_t r = 0; r < N * nh; ++r)
        for (int64_t i = 0; i < rd; ++i) rot[r * rd + i] = (*data)[r * hd + i];
      naive::rope_forward(rot.data(), s.inv_freq, B, T, nh, rd);
      for (int64_t r = 0; r < N * nh; ++r)
        for (int64_t i = 0; i < rd; ++i) (*data)[r * hd + i] = rot[r * rd + i];
    }
    naive::attention_forward(att.data(), static_cast<double*>(nullptr), q.data(), k.data(), v.data(), B, T, s.H,
                             s.KV, hd);
    for (int64_t i = 0; i < N * Q; ++i) att[i] *= sigmoid(gate[i]);
    naive::linear_forward(mix.data(), att.data(), p + s.o_w, none, N, Q, C);
  }
  std::vector<double> h1(N * C), y(N * C);
  for (int64_t i = 0; i < N * C; ++i) h1[i] = x[i] + mix[i];
  const std::vector<double> u = zero_centred_norm(h1, p + s.post_attn_norm, N, C, s.eps);
  auto swiglu_mlp = [&](int64_t width, int64_t gw, int64_t uw, int64_t dw) {
    std::vector<double> g(N * width), up(N * width), m(N * width), out(N * C);
    naive::linear_forward(g.data(), u.data(), p + gw, none, N, C, width);
    naive::linear_forward(up.data(), u.data(), p + uw, none, N, C, width);
    naive::swiglu_forward(m.data(), g.data(), up.data(), N * width);
    naive::linear_forward(out.data(), m.data(), p + dw, none, N, width, C);
    return out;
  };
  if (!s.has_moe()) {
    const std::vector<double> d = swiglu_mlp(s.I, s.gate_w, s.up_w, s.down_w);
    for (int64_t i = 0; i < N * C; ++i) y[i] = h1[i] + d[i];
    return y;
  }
  const int64_t E = s.moe.E, Kr = s.moe.K, Ie = s.moe.Ie;
  std::vector<double> logits(N * E), slogit(N);
  naive::linear_forward(logits.data(), u.data(), p + s.router_w, none, N, C, E);
  const naive::Routing route = naive::route_topk(logits, N, E, Kr);
  if (min_gap != nullptr) *min_gap = route.min_gap;
  const std::vector<double> eo = naive::moe_experts(s.moe, slice(P, s.experts_gate_up, E * 2 * Ie * C),
                                                    slice(P, s.experts_down, E * C * Ie), u, route.idx, route.w, N);
  const std::vector<double> shared = swiglu_mlp(s.Is, s.shared_gate_w, s.shared_up_w, s.shared_down_w);
  naive::linear_forward(slogit.data(), u.data(), p + s.shared_gate_logit_w, none, N, C, 1);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c)
      y[t * C + c] = h1[t * C + c] + eo[t * C + c] + sigmoid(slogit[t]) * shared[t * C + c];
  return y;
}

template <typename Real>
LayerRun<Real> run(const Qwen35LayerSpec& s, const std::vector<Real>& p, const std::vector<Real>& x,
                   const std::vector<Real>& dy, int64_t B, int64_t T) {
  static const LayerUnit<Real, Qwen35LayerSpec> unit{&qwen3_5_saved_bytes<Real>, &qwen3_5_forward_workspace_bytes<Real>,
                                             &qwen3_5_backward_workspace_bytes<Real>, &qwen3_5_forward<Real>,
                                             &qwen3_5_backward<Real>};
  return run_layer(unit, s, p, x, dy, B, T);
}

constexpr int64_t kB = 2, kT = 7;

struct Kind {
  int layer;
  bool moe;
  const char* name;
};
constexpr Kind kKinds[] = {{0, false, "Gated DeltaNet, dense"},
                           {1, false, "gated attention, dense"},
                           {0, true, "Gated DeltaNet, MoE"},
                           {1, true, "gated attention, MoE"}};

TEST(Qwen35Layer, SpecsFollowTheLayerShapes) {
  const Layer linear(0, false), full(1, true);
  EXPECT_TRUE(linear.spec.linear);
  EXPECT_EQ(linear.spec.gdn.nk, 2);
  EXPECT_EQ(linear.spec.gdn.nv, 4);
  EXPECT_EQ(linear.spec.gdn.qkv_dim(), 2 * 2 * 4 + 4 * 3);
  EXPECT_FALSE(full.spec.linear);
  EXPECT_EQ(full.spec.rotary_dim, 4);  // 0.5 x head_dim 8
  ASSERT_EQ(full.spec.inv_freq.size(), 2u);
  EXPECT_DOUBLE_EQ(full.spec.inv_freq[1], std::pow(1000.0, -2.0 / 4.0));  // theta^(-2j / rotary_dim)
  EXPECT_EQ(full.spec.moe.activation, ExpertActivation::kSilu);
  EXPECT_EQ(full.spec.Is, 4);
}

TEST(Qwen35Layer, ForwardMatchesTheNaiveLayerInBothPrecisions) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    const Layer l(kind.layer, kind.moe);
    const auto x = random_vector<double>(kB * kT * l.spec.C, 510, -2, 2);
    const std::vector<double> ref = naive_forward(l.spec, l.params, x, kB, kT);
    EXPECT_TRUE(all_close(run<double>(l.spec, l.params, x, {}, kB, kT).y, ref, 1e-12, 1e-12, "y fp64"));
    // fp32: rounding of O(1) values through ~15 chained ops of O(1) gain; 2e-5 leaves >10x room.
    const std::vector<float> pf(l.params.begin(), l.params.end()), xf(x.begin(), x.end());
    EXPECT_TRUE(all_close(run<float>(l.spec, pf, xf, {}, kB, kT).y, ref, 2e-5, 2e-5, "y fp32"));
  }
}

TEST(Qwen35Layer, BackwardMatchesFiniteDifferencesOfTheNaiveLayer) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    Layer l(kind.layer, kind.moe);
    auto x = random_vector<double>(kB * kT * l.spec.C, 511, -2, 2);
    if (kind.moe) {  // top-k is not differentiable: a 1e-5 step must not flip any token's choice
      double gap = 0;
      naive_forward(l.spec, l.params, x, kB, kT, &gap);
      ASSERT_GT(gap, 1e-3) << "a token's router choice is near a tie; pick another seed";
    }
    const auto r = random_vector<double>(kB * kT * l.spec.C, 512);
    const LayerRun<double> res = run<double>(l.spec, l.params, x, r, kB, kT);
    auto loss = [&] { return dot(naive_forward(l.spec, l.params, x, kB, kT), r); };
    EXPECT_TRUE(check_finite_differences(x, res.dx, loss, "dx"));
    EXPECT_TRUE(check_finite_differences(l.params, res.grads, loss, "dparams"));
  }
}

TEST(Qwen35Layer, RecomputeIsBitwiseTheSavedStateAndThreadsChangeNothing) {
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    const Layer l(kind.layer, kind.moe);
    const std::vector<float> p(l.params.begin(), l.params.end());
    const auto x = random_vector<float>(kB * kT * l.spec.C, 513, -2, 2);
    const auto dy = random_vector<float>(kB * kT * l.spec.C, 514);
    const LayerRun<float> a = run<float>(l.spec, p, x, dy, kB, kT);
    AlignedBuffer saved(qwen3_5_saved_bytes<float>(l.spec, kB, kT)), fresh(qwen3_5_saved_bytes<float>(l.spec, kB, kT));
    std::memset(saved.data(), 0, static_cast<size_t>(saved.bytes()));
    std::memset(fresh.data(), 0, static_cast<size_t>(fresh.bytes()));
    AlignedBuffer ws(qwen3_5_forward_workspace_bytes<float>(l.spec, kB, kT));
    qwen3_5_recompute(l.spec, p.data(), x.data(), saved.workspace(), kB, kT, ws.workspace());
    std::vector<float> y(x.size());
    qwen3_5_forward(l.spec, p.data(), x.data(), y.data(), fresh.workspace(), kB, kT, ws.workspace());
    EXPECT_EQ(std::memcmp(saved.data(), fresh.data(), static_cast<size_t>(saved.bytes())), 0);
    Qwen35LayerSpec threaded = l.spec;
    threaded.threads = 3;
    threaded.gdn.threads = 3;
    const LayerRun<float> b = run<float>(threaded, p, x, dy, kB, kT);
    EXPECT_EQ(a.y, b.y);
    EXPECT_EQ(a.dx, b.dx);
    EXPECT_EQ(a.grads, b.grads);
  }
}

}  // namespace
}  // namespace slidedp::kernels::test
