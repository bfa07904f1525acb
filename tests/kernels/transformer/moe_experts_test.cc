// The routed experts (kernels/cpu/transformer/moe_experts.h) against a naive per-token loop written
// from shared/reference/model-families.md (Gemma 4 section 2.4 items 6-7, Qwen3.5-MoE section 3.4
// item 7): softmax, top-k, renormalise, y = sum_k w_k down_e(act(gate_e z) * up_e z). Backward
// against central finite differences in fp64 (tolerance: check_finite_differences' derivation),
// with inputs whose top-k choices are far from ties, so the differences never flip a choice.
// Results independent of the thread count, bitwise.
#include "kernels/cpu/transformer/moe_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/cpu/transformer/reference_ops.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels::test {
namespace {

using naive::moe_experts;
using naive::route_topk;

template <typename Real>
struct MoeRun {
  std::vector<Real> y, dz, dw, dgate_up, ddown;
};

template <typename Real>
MoeRun<Real> run(const MoeSpec& s, const std::vector<Real>& gate_up, const std::vector<Real>& down,
                 const std::vector<Real>& z, const std::vector<int32_t>& idx, const std::vector<Real>& w,
                 const std::vector<Real>& dy, int64_t N) {
  MoeRun<Real> r;
  r.y.assign(N * s.C, Real(0));
  AlignedBuffer saved(experts_saved_bytes<Real>(s, N)), fws(experts_forward_workspace_bytes<Real>(s, N));
  std::memset(fws.data(), 0x7f, static_cast<size_t>(fws.bytes()));
  experts_forward(s, gate_up.data(), down.data(), z.data(), idx.data(), w.data(), r.y.data(),
                  saved.workspace(), N, fws.workspace());
  if (dy.empty()) return r;
  r.dz.assign(N * s.C, Real(0));
  r.dw.assign(N * s.K, Real(0));
  r.dgate_up.assign(gate_up.size(), Real(0));
  r.ddown.assign(down.size(), Real(0));
  AlignedBuffer bws(experts_backward_workspace_bytes<Real>(s, N));
  std::memset(bws.data(), 0x7f, static_cast<size_t>(bws.bytes()));
  experts_backward(s, gate_up.data(), down.data(), z.data(), idx.data(), w.data(), saved.workspace(),
                   dy.data(), r.dz.data(), r.dw.data(), r.dgate_up.data(), r.ddown.data(), N,
                   bws.workspace());
  return r;
}

constexpr int64_t kN = 11;

struct Case {
  MoeSpec s;
  std::vector<double> gate_up, down, z, w;
  std::vector<int32_t> idx;
  explicit Case(ExpertActivation act, uint64_t seed = 700) {
    s = MoeSpec{6, 5, 2, 3, act, 1};
    gate_up = random_vector<double>(s.E * 2 * s.Ie * s.C, seed, -0.6, 0.6);
    down = random_vector<double>(s.E * s.C * s.Ie, seed + 1, -0.6, 0.6);
    z = random_vector<double>(kN * s.C, seed + 2, -1.5, 1.5);
    const naive::Routing r = route_topk(random_vector<double>(kN * s.E, seed + 3, -2, 2), kN, s.E, s.K);
    idx = r.idx;
    w = r.w;
  }
};

TEST(MoeRouter, TopKMatchesTheNaiveRoutingAndTiesGoToTheLowerIndex) {
  const int64_t N = 9, E = 7, K = 3;
  auto logits = random_vector<double>(N * E, 720, -3, 3);
  logits[2 * E + 1] = logits[2 * E + 4] = 5.0;  // token 2: experts 1 and 4 tie for first
  const naive::Routing ref = route_topk(logits, N, E, K);
  std::vector<double> probs(N * E), w(N * K);
  std::vector<int32_t> idx(N * K);
  router_topk_forward(probs.data(), idx.data(), w.data(), logits.data(), N, E, K);
  EXPECT_EQ(idx, ref.idx);
  EXPECT_EQ(idx[2 * K], 1);
  EXPECT_EQ(idx[2 * K + 1], 4);
  EXPECT_TRUE(all_close(probs, ref.probs, 1e-15, 1e-13, "probs"));
  EXPECT_TRUE(all_close(w, ref.w, 1e-15, 1e-13, "renormalised weights"));
}

TEST(MoeRouter, BackwardMatchesFiniteDifferencesThroughTheRenormalisedWeights) {
  const int64_t N = 9, E = 7, K = 3;
  auto logits = random_vector<double>(N * E, 721, -3, 3);
  // the K-th and (K+1)-th probabilities of every token are apart, so a 1e-5 step keeps the choice
  const naive::Routing base = route_topk(logits, N, E, K);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> p(base.probs.begin() + t * E, base.probs.begin() + (t + 1) * E);
    std::sort(p.rbegin(), p.rend());
    ASSERT_GT(p[K - 1] - p[K], 1e-3) << "token " << t << " is near a tie; pick another seed";
  }
  const auto r = random_vector<double>(N * K, 722);
  std::vector<double> dlogits(N * E);
  router_topk_backward(dlogits.data(), r.data(), base.probs.data(), base.idx.data(), N, E, K);
  auto loss = [&] { return dot(route_topk(logits, N, E, K).w, r); };
  EXPECT_TRUE(check_finite_differences(logits, dlogits, loss, "dlogits"));
  // the unchosen experts get exactly nothing: the renormalised weights ignore the other logits
  for (int64_t t = 0; t < N; ++t) {
    const auto chosen = base.idx.begin() + t * K, end = chosen + K;
    for (int64_t e = 0; e < E; ++e)
      if (std::find(chosen, end, e) == end) {
        EXPECT_EQ(dlogits[t * E + e], 0.0);
      }
  }
}

TEST(MoeExperts, ForwardMatchesTheNaiveLoopForBothActivations) {
  for (ExpertActivation act : {ExpertActivation::kGeluTanh, ExpertActivation::kSilu}) {
    const Case c(act);
    const auto ref = moe_experts(c.s, c.gate_up, c.down, c.z, c.idx, c.w, kN);
    EXPECT_TRUE(all_close(run<double>(c.s, c.gate_up, c.down, c.z, c.idx, c.w, {}, kN).y, ref, 1e-13, 1e-13,
                          "y fp64"));
    auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    // fp32: a few roundings of O(1) values over sums of <= 12 terms
    EXPECT_TRUE(all_close(run<float>(c.s, f(c.gate_up), f(c.down), f(c.z), c.idx, f(c.w), {}, kN).y, ref,
                          2e-6, 2e-6, "y fp32"));
  }
}

TEST(MoeExperts, AnExpertNoTokenChoseIsSkippedAndGetsNoGradient) {
  Case c(ExpertActivation::kGeluTanh);
  for (auto& e : c.idx)
    e = e == 3 ? 0 : e;  // nobody routes to expert 3 (duplicates within a token are fine here)
  const auto dy = random_vector<double>(kN * c.s.C, 730);
  const MoeRun<double> r = run<double>(c.s, c.gate_up, c.down, c.z, c.idx, c.w, dy, kN);
  EXPECT_TRUE(all_close(r.y, moe_experts(c.s, c.gate_up, c.down, c.z, c.idx, c.w, kN), 1e-13, 1e-13, "y"));
  const int64_t per_gu = 2 * c.s.Ie * c.s.C, per_down = c.s.C * c.s.Ie;
  for (int64_t i = 0; i < per_gu; ++i) EXPECT_EQ(r.dgate_up[3 * per_gu + i], 0.0);
  for (int64_t i = 0; i < per_down; ++i) EXPECT_EQ(r.ddown[3 * per_down + i], 0.0);
}

TEST(MoeExperts, BackwardMatchesFiniteDifferencesForInputsWeightsAndExperts) {
  for (ExpertActivation act : {ExpertActivation::kGeluTanh, ExpertActivation::kSilu}) {
    SCOPED_TRACE(act == ExpertActivation::kGeluTanh ? "GeGLU" : "SwiGLU");
    Case c(act);
    const auto dy = random_vector<double>(kN * c.s.C, 731);
    const MoeRun<double> r = run<double>(c.s, c.gate_up, c.down, c.z, c.idx, c.w, dy, kN);
    auto loss = [&] { return dot(run<double>(c.s, c.gate_up, c.down, c.z, c.idx, c.w, {}, kN).y, dy); };
    EXPECT_TRUE(check_finite_differences(c.z, r.dz, loss, "dz"));
    EXPECT_TRUE(check_finite_differences(c.w, r.dw, loss, "dw"));
    EXPECT_TRUE(check_finite_differences(c.gate_up, r.dgate_up, loss, "dgate_up"));
    EXPECT_TRUE(check_finite_differences(c.down, r.ddown, loss, "ddown"));
  }
}

TEST(MoeExperts, GradientsAccumulateAndThreadsChangeNothing) {
  const Case c(ExpertActivation::kSilu);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto dy = random_vector<float>(kN * c.s.C, 732);
  const MoeRun<float> one = run<float>(c.s, f(c.gate_up), f(c.down), f(c.z), c.idx, f(c.w), dy, kN);
  MoeSpec threaded = c.s;
  threaded.threads = 3;
  const MoeRun<float> three = run<float>(threaded, f(c.gate_up), f(c.down), f(c.z), c.idx, f(c.w), dy, kN);
  EXPECT_EQ(one.y, three.y);
  EXPECT_EQ(one.dz, three.dz);
  EXPECT_EQ(one.dw, three.dw);
  EXPECT_EQ(one.dgate_up, three.dgate_up);
  EXPECT_EQ(one.ddown, three.ddown);
  // a second backward adds the same weight gradients again (micro-batches accumulate)
  std::vector<float> gu(c.gate_up.size(), 1.0f), dn(c.down.size(), 1.0f), dz(kN * c.s.C), dw(kN * c.s.K);
  AlignedBuffer saved(experts_saved_bytes<float>(c.s, kN)),
      fws(experts_forward_workspace_bytes<float>(c.s, kN)),
      bws(experts_backward_workspace_bytes<float>(c.s, kN));
  std::vector<float> y(kN * c.s.C);
  const auto gate_up = f(c.gate_up), down = f(c.down), z = f(c.z), w = f(c.w);
  experts_forward(c.s, gate_up.data(), down.data(), z.data(), c.idx.data(), w.data(), y.data(),
                  saved.workspace(), kN, fws.workspace());
  experts_backward(c.s, gate_up.data(), down.data(), z.data(), c.idx.data(), w.data(), saved.workspace(),
                   dy.data(), dz.data(), dw.data(), gu.data(), dn.data(), kN, bws.workspace());
  // (the GEMM may fold the 1 in at any point of its sum: fp32 rounding of O(1) values, 1e-6)
  std::vector<float> want_gu = one.dgate_up, want_dn = one.ddown;
  for (float& v : want_gu) v += 1.0f;
  for (float& v : want_dn) v += 1.0f;
  EXPECT_TRUE(all_close(gu, want_gu, 1e-6, 1e-6, "accumulated dgate_up"));
  EXPECT_TRUE(all_close(dn, want_dn, 1e-6, 1e-6, "accumulated ddown"));
}

}  // namespace
}  // namespace slidedp::kernels::test
