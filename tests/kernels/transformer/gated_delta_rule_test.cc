// The chunked gated delta rule (kernels/cpu/transformer/gated_delta_rule.h) against the token-by-token
// recurrence written from shared/reference/model-families.md section 3.4 item 5.7
// (naive::gated_delta_rule, fp64): forward at several chunk sizes, including chunks that end inside
// a segment and chunks longer than it; the backward against central finite differences of that
// recurrence (not of the chunked code), tolerance from check_finite_differences' derivation.
// Segments (documents of a packed sequence) restart the state; results are bitwise independent of
// the thread count.
#include "kernels/cpu/transformer/gated_delta_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/transformer/reference_ops.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels::test {
namespace {

template <typename Real>
struct Inputs {
  std::vector<Real> q, k, v, g, b;
};

struct Case {
  DeltaRuleSpec s;
  std::vector<int64_t> seg;
  Inputs<double> in;
  int64_t N() const { return seg.back(); }
};

// q and k L2-normalised per head (as the layer feeds them), q scaled by dk^-1/2; g in [g_lo, 0] (the
// model's log-decays are <= 0); b in (0, 1) as a sigmoid gives.
Case make_case(std::vector<int64_t> seg, int64_t chunk, uint64_t seed, double g_lo = -1.5) {
  Case c;
  c.s = DeltaRuleSpec{2, 4, 5, 3, chunk, 1};
  c.seg = std::move(seg);
  const int64_t N = c.N();
  c.in.q = unit_rows(random_vector<double>(N * c.s.nk * c.s.dk, seed), c.s.dk, 1 / std::sqrt(static_cast<double>(c.s.dk)));
  c.in.k = unit_rows(random_vector<double>(N * c.s.nk * c.s.dk, seed + 1), c.s.dk);
  c.in.v = random_vector<double>(N * c.s.nv * c.s.dv, seed + 2, -2, 2);
  c.in.g = random_vector<double>(N * c.s.nv, seed + 3, g_lo, 0);
  c.in.b = random_vector<double>(N * c.s.nv, seed + 4, 0.05, 0.95);
  return c;
}

template <typename Real>
Inputs<Real> cast(const Inputs<double>& in) {
  auto to = [](const std::vector<double>& x) { return std::vector<Real>(x.begin(), x.end()); };
  return {to(in.q), to(in.k), to(in.v), to(in.g), to(in.b)};
}

template <typename Real>
std::vector<Real> forward(const DeltaRuleSpec& s, const std::vector<int64_t>& seg, const Inputs<Real>& in) {
  const DeltaRuleSegments segs{seg.data(), static_cast<int64_t>(seg.size()) - 1};
  std::vector<Real> o(static_cast<size_t>(seg.back() * s.nv * s.dv), Real(-7));
  AlignedBuffer ws(delta_rule_forward_workspace_bytes<Real>(s, extent_of(segs)));
  std::memset(ws.data(), 0x7f, static_cast<size_t>(ws.bytes()));
  delta_rule_forward(s, segs, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.b.data(), o.data(),
                     ws.workspace());
  return o;
}

template <typename Real>
Inputs<Real> backward(const DeltaRuleSpec& s, const std::vector<int64_t>& seg, const Inputs<Real>& in,
                      const std::vector<Real>& dO) {
  const DeltaRuleSegments segs{seg.data(), static_cast<int64_t>(seg.size()) - 1};
  Inputs<Real> d;
  auto fill = [](std::vector<Real>& x, size_t n) { x.assign(n, Real(123)); };  // overwritten, never read
  fill(d.q, in.q.size());
  fill(d.k, in.k.size());
  fill(d.v, in.v.size());
  fill(d.g, in.g.size());
  fill(d.b, in.b.size());
  AlignedBuffer ws(delta_rule_backward_workspace_bytes<Real>(s, extent_of(segs)));
  std::memset(ws.data(), 0x7f, static_cast<size_t>(ws.bytes()));
  delta_rule_backward(s, segs, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.b.data(), dO.data(),
                      d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.b.data(), ws.workspace());
  return d;
}

// Segments of 9, 0 (an empty document) and 14 rows.
const std::vector<int64_t> kSegments = {0, 9, 9, 23};

TEST(GatedDeltaRule, ChunkedForwardEqualsTheRecurrenceAtEveryChunkSize) {
  for (int64_t chunk : {1, 4, 7, 9, 64}) {
    const Case c = make_case(kSegments, chunk, 900);
    const auto ref = naive::gated_delta_rule(c.s, c.seg, c.in.q, c.in.k, c.in.v, c.in.g, c.in.b);
    // fp64: both sum the same terms in other orders; 1e-12 is ~1e4 ulps at |o| <= ~2.
    EXPECT_TRUE(all_close(forward(c.s, c.seg, c.in), ref, 1e-12, 1e-12, "fp64 o")) << "chunk " << chunk;
    // fp32: inputs rounded to fp32 (rel 6e-8) and ~chunk-long fp32 sums; 2e-5 leaves ~100x headroom.
    EXPECT_TRUE(all_close(forward(c.s, c.seg, cast<float>(c.in)), ref, 2e-5, 2e-5, "fp32 o")) << "chunk " << chunk;
  }
}

TEST(GatedDeltaRule, StrongDecayStaysFiniteAndExact) {
  // exp(-60) per token: a 64-token chunk's running sum reaches -3840, whose exp underflows to 0.
  // Only differences gamma_t - gamma_s (t >= s) are exponentiated, so nothing overflows.
  Case c = make_case({0, 70}, 64, 910, -60);
  const auto ref = naive::gated_delta_rule(c.s, c.seg, c.in.q, c.in.k, c.in.v, c.in.g, c.in.b);
  EXPECT_TRUE(all_close(forward(c.s, c.seg, c.in), ref, 1e-12, 1e-12, "fp64 o"));
  EXPECT_TRUE(all_close(forward(c.s, c.seg, cast<float>(c.in)), ref, 2e-5, 2e-5, "fp32 o"));
  const auto d = backward(c.s, c.seg, cast<float>(c.in), random_vector<float>(ref.size(), 911));
  for (const auto* x : {&d.q, &d.k, &d.v, &d.g, &d.b})
    for (float e : *x) ASSERT_TRUE(std::isfinite(e));
}

TEST(GatedDeltaRule, BackwardMatchesFiniteDifferencesOfTheRecurrence) {
  for (int64_t chunk : {4, 64}) {
    Case c = make_case(kSegments, chunk, 920);
    const auto w = random_vector<double>(c.N() * c.s.nv * c.s.dv, 921);
    const Inputs<double> d = backward(c.s, c.seg, c.in, w);
    // The loss is sum(w * o) of the token-by-token recurrence: an independent forward.
    auto loss = [&] { return dot(w, naive::gated_delta_rule(c.s, c.seg, c.in.q, c.in.k, c.in.v, c.in.g, c.in.b)); };
    const std::string at = " chunk " + std::to_string(chunk);
    EXPECT_TRUE(check_finite_differences(c.in.q, d.q, loss, "dq" + at));
    EXPECT_TRUE(check_finite_differences(c.in.k, d.k, loss, "dk" + at));
    EXPECT_TRUE(check_finite_differences(c.in.v, d.v, loss, "dv" + at));
    EXPECT_TRUE(check_finite_differences(c.in.g, d.g, loss, "dg" + at));
    EXPECT_TRUE(check_finite_differences(c.in.b, d.b, loss, "db" + at));
  }
}

TEST(GatedDeltaRule, APackedSequenceEqualsItsDocumentsRunSeparately) {
  const Case packed = make_case({0, 11, 24}, 4, 930);
  const auto w = random_vector<double>(packed.N() * packed.s.nv * packed.s.dv, 931);
  const auto o = forward(packed.s, packed.seg, packed.in);
  const auto d = backward(packed.s, packed.seg, packed.in, w);
  // Each document alone: its rows of every input, one segment.
  const DeltaRuleSpec& s = packed.s;
  auto rows = [](const std::vector<double>& x, int64_t begin, int64_t end, int64_t width) {
    return std::vector<double>(x.begin() + begin * width, x.begin() + end * width);
  };
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 11}, {11, 24}}) {
    const Inputs<double> doc{rows(packed.in.q, begin, end, s.nk * s.dk), rows(packed.in.k, begin, end, s.nk * s.dk),
                             rows(packed.in.v, begin, end, s.nv * s.dv), rows(packed.in.g, begin, end, s.nv),
                             rows(packed.in.b, begin, end, s.nv)};
    const std::vector<int64_t> one = {0, end - begin};
    EXPECT_EQ(forward(s, one, doc), rows(o, begin, end, s.nv * s.dv)) << "rows " << begin;
    const Inputs<double> dd = backward(s, one, doc, rows(w, begin, end, s.nv * s.dv));
    EXPECT_EQ(dd.q, rows(d.q, begin, end, s.nk * s.dk));
    EXPECT_EQ(dd.k, rows(d.k, begin, end, s.nk * s.dk));
    EXPECT_EQ(dd.v, rows(d.v, begin, end, s.nv * s.dv));
    EXPECT_EQ(dd.g, rows(d.g, begin, end, s.nv));
    EXPECT_EQ(dd.b, rows(d.b, begin, end, s.nv));
  }
  // Without the reset the second document sees the first one's state: the boundary matters here.
  const auto unsegmented = forward(s, {0, 24}, packed.in);
  double moved = 0;
  for (int64_t i = 11 * s.nv * s.dv; i < 24 * s.nv * s.dv; ++i) moved = std::max(moved, std::abs(unsegmented[i] - o[i]));
  EXPECT_GT(moved, 1e-3);
}

TEST(GatedDeltaRule, ResultsAreBitwiseIndependentOfTheThreadCount) {
  Case c = make_case({0, 5, 19, 19, 40}, 8, 940);
  const auto w = random_vector<double>(c.N() * c.s.nv * c.s.dv, 941);
  const auto o1 = forward(c.s, c.seg, c.in);
  const auto d1 = backward(c.s, c.seg, c.in, w);
  c.s.threads = 3;
  EXPECT_EQ(forward(c.s, c.seg, c.in), o1);
  const auto d3 = backward(c.s, c.seg, c.in, w);
  EXPECT_EQ(d3.q, d1.q);
  EXPECT_EQ(d3.k, d1.k);
  EXPECT_EQ(d3.v, d1.v);
  EXPECT_EQ(d3.g, d1.g);
  EXPECT_EQ(d3.b, d1.b);
}

}  // namespace
}  // namespace slidedp::kernels::test
