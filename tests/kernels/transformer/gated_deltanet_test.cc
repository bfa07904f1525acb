// The Gated DeltaNet mixer (kernels/cpu/transformer/gated_deltanet.h) against naive::gated_deltanet,
// plain fp64 loops written from shared/reference/model-families.md section 3.4 item 5 around the
// token-by-token recurrence: forward in fp64 and fp32; the backward of every weight and of the input
// against central finite differences of the naive forward (tolerance: check_finite_differences'
// derivation); packed documents equal the documents run alone (conv window and state both reset);
// results bitwise independent of the thread count.
#include "kernels/cpu/transformer/gated_deltanet.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/transformer/reference_ops.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels::test {
namespace {

using naive::DeltaNetParams;

DeltaNetSpec small_spec(int64_t chunk) {
  DeltaNetSpec s;
  s.C = 6;
  s.nk = 2;
  s.nv = 4;
  s.dk = 3;
  s.dv = 2;
  s.conv_kernel = 4;
  s.norm_eps = 1e-6;
  s.chunk = chunk;
  return s;
}

DeltaNetParams random_params(const DeltaNetSpec& s, uint64_t seed) {
  DeltaNetParams p;
  p.in_proj_qkv = random_vector<double>(s.qkv_dim() * s.C, seed, -0.7, 0.7);
  p.in_proj_z = random_vector<double>(s.value_dim() * s.C, seed + 1, -0.7, 0.7);
  p.in_proj_b = random_vector<double>(s.nv * s.C, seed + 2, -0.7, 0.7);
  p.in_proj_a = random_vector<double>(s.nv * s.C, seed + 3, -0.7, 0.7);
  p.conv = random_vector<double>(s.qkv_dim() * s.conv_kernel, seed + 4, -0.6, 0.6);
  p.dt_bias = random_vector<double>(s.nv, seed + 5, -1, 1);
  p.A_log = random_vector<double>(s.nv, seed + 6, -1, 1);
  p.norm = random_vector<double>(s.dv, seed + 7, 0.5, 1.5);
  p.out_proj = random_vector<double>(s.C * s.value_dim(), seed + 8, -0.7, 0.7);
  return p;
}

template <typename Real>
struct Params {
  std::vector<Real> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv, dt_bias, A_log, norm, out_proj;
  explicit Params(const DeltaNetParams& p) {
    auto to = [](const std::vector<double>& x) { return std::vector<Real>(x.begin(), x.end()); };
    in_proj_qkv = to(p.in_proj_qkv), in_proj_z = to(p.in_proj_z), in_proj_b = to(p.in_proj_b);
    in_proj_a = to(p.in_proj_a), conv = to(p.conv), dt_bias = to(p.dt_bias), A_log = to(p.A_log);
    norm = to(p.norm), out_proj = to(p.out_proj);
  }
  template <typename T>
  DeltaNetWeights<T> view() {
    return {in_proj_qkv.data(), in_proj_z.data(), in_proj_b.data(), in_proj_a.data(), conv.data(),
            dt_bias.data(),     A_log.data(),     norm.data(),      out_proj.data()};
  }
};

template <typename Real>
struct MixerRun {
  std::vector<Real> y, dh;
  DeltaNetParams grads;
};

// Forward, then (when dy is not empty) backward, with every buffer poisoned first.
template <typename Real>
MixerRun<Real> run(const DeltaNetSpec& s, const std::vector<int64_t>& seg, const DeltaNetParams& p,
              const std::vector<double>& h64, const std::vector<double>& dy64) {
  const DeltaRuleSegments segs{seg.data(), static_cast<int64_t>(seg.size()) - 1};
  const int64_t N = seg.back();
  Params<Real> w(p);
  const std::vector<Real> h(h64.begin(), h64.end()), dy(dy64.begin(), dy64.end());
  MixerRun<Real> r;
  r.y.assign(static_cast<size_t>(N * s.C), Real(0));
  AlignedBuffer saved(deltanet_saved_bytes<Real>(s, N)), fws(deltanet_forward_workspace_bytes<Real>(s, extent_of(segs)));
  std::memset(saved.data(), 0x7f, static_cast<size_t>(saved.bytes()));
  std::memset(fws.data(), 0x7f, static_cast<size_t>(fws.bytes()));
  deltanet_forward(s, segs, w.template view<const Real>(), h.data(), r.y.data(), false, saved.workspace(),
                   fws.workspace());
  if (dy.empty()) return r;
  Params<Real> g(p);
  for (auto* v : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a, &g.conv, &g.dt_bias, &g.A_log, &g.norm,
                  &g.out_proj})
    std::fill(v->begin(), v->end(), Real(0));
  r.dh.assign(h.size(), Real(55));  // overwritten
  AlignedBuffer bws(deltanet_backward_workspace_bytes<Real>(s, extent_of(segs)));
  std::memset(bws.data(), 0x7f, static_cast<size_t>(bws.bytes()));
  deltanet_backward(s, segs, w.template view<const Real>(), h.data(), saved.workspace(), dy.data(), r.dh.data(), false,
                    g.template view<Real>(), bws.workspace());
  auto back = [](const std::vector<Real>& x) { return std::vector<double>(x.begin(), x.end()); };
  r.grads = {back(g.in_proj_qkv), back(g.in_proj_z), back(g.in_proj_b), back(g.in_proj_a), back(g.conv),
             back(g.dt_bias),     back(g.A_log),     back(g.norm),      back(g.out_proj)};
  return r;
}

const std::vector<int64_t> kSegments = {0, 5, 13};

TEST(GatedDeltaNet, ForwardEqualsTheNaiveMixer) {
  for (int64_t chunk : {3, 64}) {
    const DeltaNetSpec s = small_spec(chunk);
    const DeltaNetParams p = random_params(s, 1000);
    const auto h = random_vector<double>(kSegments.back() * s.C, 1010, -1.5, 1.5);
    const auto ref = naive::gated_deltanet(s, kSegments, p, h);
    EXPECT_TRUE(all_close(run<double>(s, kSegments, p, h, {}).y, ref, 1e-12, 1e-12, "fp64 y")) << "chunk " << chunk;
    // fp32: inputs rounded (6e-8 relative) through ~10 chained ops of O(1) gain; 1e-5 leaves >10x room.
    EXPECT_TRUE(all_close(run<float>(s, kSegments, p, h, {}).y, ref, 1e-5, 1e-5, "fp32 y")) << "chunk " << chunk;
  }
}

TEST(GatedDeltaNet, BackwardMatchesFiniteDifferencesOfTheNaiveMixer) {
  const DeltaNetSpec s = small_spec(3);
  DeltaNetParams p = random_params(s, 1100);
  auto h = random_vector<double>(kSegments.back() * s.C, 1110, -1.5, 1.5);
  const auto w = random_vector<double>(h.size(), 1120);
  const MixerRun<double> r = run<double>(s, kSegments, p, h, w);
  auto loss = [&] { return dot(w, naive::gated_deltanet(s, kSegments, p, h)); };
  EXPECT_TRUE(check_finite_differences(h, r.dh, loss, "dh"));
  EXPECT_TRUE(check_finite_differences(p.in_proj_qkv, r.grads.in_proj_qkv, loss, "d in_proj_qkv"));
  EXPECT_TRUE(check_finite_differences(p.in_proj_z, r.grads.in_proj_z, loss, "d in_proj_z"));
  EXPECT_TRUE(check_finite_differences(p.in_proj_b, r.grads.in_proj_b, loss, "d in_proj_b"));
  EXPECT_TRUE(check_finite_differences(p.in_proj_a, r.grads.in_proj_a, loss, "d in_proj_a"));
  EXPECT_TRUE(check_finite_differences(p.conv, r.grads.conv, loss, "d conv"));
  EXPECT_TRUE(check_finite_differences(p.dt_bias, r.grads.dt_bias, loss, "d dt_bias"));
  EXPECT_TRUE(check_finite_differences(p.A_log, r.grads.A_log, loss, "d A_log"));
  EXPECT_TRUE(check_finite_differences(p.norm, r.grads.norm, loss, "d norm"));
  EXPECT_TRUE(check_finite_differences(p.out_proj, r.grads.out_proj, loss, "d out_proj"));
}

TEST(GatedDeltaNet, APackedSequenceEqualsItsDocumentsRunSeparately) {
  const DeltaNetSpec s = small_spec(3);
  const DeltaNetParams p = random_params(s, 1200);
  const auto h = random_vector<double>(kSegments.back() * s.C, 1210, -1.5, 1.5);
  const auto w = random_vector<double>(h.size(), 1220);
  const MixerRun<double> packed = run<double>(s, kSegments, p, h, w);
  auto rows = [&](const std::vector<double>& x, int64_t b, int64_t e) {
    return std::vector<double>(x.begin() + b * s.C, x.begin() + e * s.C);
  };
  std::vector<double> summed(packed.grads.conv.size(), 0.0);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 5}, {5, 13}}) {
    const MixerRun<double> alone = run<double>(s, {0, e - b}, p, rows(h, b, e), rows(w, b, e));
    // Not bitwise: BLAS may block the projections' rows differently for another row count. fp64
    // rounding of ~C-long sums at |y| ~ 1: 1e-13 is ~500 ulps and far below any carried-over state.
    EXPECT_TRUE(all_close(alone.y, rows(packed.y, b, e), 1e-13, 1e-13, "y rows from " + std::to_string(b)));
    EXPECT_TRUE(all_close(alone.dh, rows(packed.dh, b, e), 1e-13, 1e-13, "dh rows from " + std::to_string(b)));
    for (size_t i = 0; i < summed.size(); ++i) summed[i] += alone.grads.conv[i];
  }
  // The packed run's conv gradient sums the same terms (its documents' rows) in the same order.
  EXPECT_TRUE(all_close(packed.grads.conv, summed, 1e-13, 1e-13, "d conv packed vs documents"));
  // One unsegmented sequence differs in the second document: the conv window and the state carry over.
  const MixerRun<double> joined = run<double>(s, {0, 13}, p, h, {});
  EXPECT_TRUE(all_close(rows(joined.y, 0, 5), rows(packed.y, 0, 5), 1e-13, 1e-13, "first document"));
  EXPECT_GT(max_abs([&] {
              std::vector<double> d = rows(joined.y, 5, 6);
              const std::vector<double> p6 = rows(packed.y, 5, 6);
              for (size_t i = 0; i < d.size(); ++i) d[i] -= p6[i];
              return d;
            }()),
            1e-3);
}

TEST(GatedDeltaNet, ResultsAreBitwiseIndependentOfTheThreadCount) {
  DeltaNetSpec s = small_spec(4);
  const std::vector<int64_t> seg = {0, 7, 7, 20, 31};
  const DeltaNetParams p = random_params(s, 1300);
  const auto h = random_vector<double>(seg.back() * s.C, 1310, -1.5, 1.5);
  const auto w = random_vector<double>(h.size(), 1320);
  const MixerRun<double> one = run<double>(s, seg, p, h, w);
  s.threads = 3;
  const MixerRun<double> three = run<double>(s, seg, p, h, w);
  EXPECT_EQ(three.y, one.y);
  EXPECT_EQ(three.dh, one.dh);
  EXPECT_EQ(three.grads.conv, one.grads.conv);
  EXPECT_EQ(three.grads.in_proj_qkv, one.grads.in_proj_qkv);
  EXPECT_EQ(three.grads.A_log, one.grads.A_log);
  EXPECT_EQ(three.grads.norm, one.grads.norm);
}

}  // namespace
}  // namespace slidedp::kernels::test
