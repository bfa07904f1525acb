// Every transformer op against its naive reference (reference_ops.h) in fp32 and fp64, and its
// backward against central finite differences in fp64. Odd sizes throughout (1, 7, 13, 17 ...),
// tiles that do not divide T, chunks that do not divide the token count.
#include <gtest/gtest.h>

#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/error.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/embedding.h"
#include "kernels/cpu/transformer/embedding_unit.h"
#include "kernels/cpu/transformer/geglu.h"
#include "kernels/cpu/transformer/linear.h"
#include "kernels/cpu/transformer/reference_ops.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/rope.h"
#include "kernels/cpu/transformer/swiglu.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels {
namespace {

using test::all_close;
using test::check_finite_differences;
using test::dot;
using test::random_vector;

// fp64 optimized vs fp64 naive differ only in summation order over <= a few hundred terms of O(1)
// values: 1e-12 leaves 10^3 x margin over the ~1e-15 unit roundoff times the term count.
constexpr double kTol64 = 1e-12;
// fp32 optimized vs fp32 naive: both round at ~6e-8 per operation, over a few hundred terms.
constexpr double kTol32 = 2e-5;

// ---- GEMM ----------------------------------------------------------------------------------------

TEST(Gemm, MatchesNaiveForAllTransposesStridesAndBetas) {
  struct Case {
    int64_t M, N, K;
  };
  for (const Case c : {Case{1, 1, 1}, Case{7, 17, 5}, Case{33, 9, 64}, Case{4, 3, 0}, Case{0, 3, 2}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (double beta : {0.0, 1.0, 0.5}) {
          // stored shapes with 3 columns of padding to exercise the leading dimensions
          const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K;
          const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N;
          const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = c.N + 3;
          auto A = random_vector<double>(a_rows * lda, 1);
          auto B = random_vector<double>(b_rows * ldb, 2);
          auto C0 = random_vector<double>(std::max<int64_t>(c.M * ldc, 1), 3);
          std::vector<double> ref = C0;
          for (int64_t i = 0; i < c.M; ++i)
            for (int64_t j = 0; j < c.N; ++j) {
              double acc = 0;
              for (int64_t k = 0; k < c.K; ++k)
                acc += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
              ref[i * ldc + j] = 0.75 * acc + beta * C0[i * ldc + j];
            }
          std::vector<double> got = C0;
          gemm<double>(ta, tb, c.M, c.N, c.K, 0.75, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
          EXPECT_TRUE(all_close(got, ref, kTol64, kTol64, "dgemm")) << c.M << "x" << c.N << "x" << c.K;
          std::vector<float> Af(A.begin(), A.end()), Bf(B.begin(), B.end()), gotf(C0.begin(), C0.end());
          gemm<float>(ta, tb, c.M, c.N, c.K, 0.75f, Af.data(), lda, Bf.data(), ldb, static_cast<float>(beta),
                      gotf.data(), ldc);
          EXPECT_TRUE(all_close(gotf, ref, kTol32, kTol32, "sgemm")) << c.M << "x" << c.N << "x" << c.K;
        }
}

TEST(Gemm, BlasThreadCountIsSettable) {
  const int before = blas_threads();
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
  EXPECT_EQ(blas_threads(), before);
  EXPECT_NE(blas_description().find("OpenBLAS"), std::string::npos);
}

// ---- RMSNorm -------------------------------------------------------------------------------------

TEST(RmsNorm, ForwardBackwardMatchNaive) {
  const int64_t N = 7, C = 13;
  const double eps = 1e-5;
  auto x = random_vector<double>(N * C, 10, -2, 2);
  auto w = random_vector<double>(C, 11, 0.5, 1.5);
  auto dy = random_vector<double>(N * C, 12);
  std::vector<double> y(N * C), rstd(N), y_ref(N * C);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  naive::rmsnorm_forward(y_ref.data(), x.data(), w.data(), N, C, eps);
  EXPECT_TRUE(all_close(y, y_ref, kTol64, kTol64, "y"));

  std::vector<double> dx(N * C, 0.25), dw(C, 0.5), dx_ref(N * C), dw_ref(C, 0.5);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), rstd.data(), w.data(), N, C, true);
  naive::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(), N, C, eps);
  for (auto& v : dx_ref) v += 0.25;  // accumulate_dx adds to what was there
  EXPECT_TRUE(all_close(dx, dx_ref, kTol64, kTol64, "dx"));
  EXPECT_TRUE(all_close(dw, dw_ref, kTol64, kTol64, "dw (accumulated onto 0.5)"));

  // fp32 path against the fp64 reference
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), yf(N * C), rf(N);
  rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
  EXPECT_TRUE(all_close(yf, y_ref, kTol32, kTol32, "y fp32"));
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, C = 9;
  const double eps = 1e-6;
  auto x = random_vector<double>(N * C, 20, -2, 2);
  auto w = random_vector<double>(C, 21, 0.5, 1.5);
  auto r = random_vector<double>(N * C, 22);
  auto loss = [&] {
    std::vector<double> y(N * C), rs(N);
    rmsnorm_forward(y.data(), rs.data(), x.data(), w.data(), N, C, eps);
    return dot(y, r);
  };
  std::vector<double> y(N * C), rs(N), dx(N * C), dw(C, 0.0);
  rmsnorm_forward(y.data(), rs.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), rs.data(), w.data(), N, C, false);
  EXPECT_TRUE(check_finite_differences(x, dx, loss, "rmsnorm dx"));
  EXPECT_TRUE(check_finite_differences(w, dw, loss, "rmsnorm dw"));
}

// Gemma 4's v_norm and router norm: no weight. Equal to the weighted norm with w = 1 (forward and dx)
// and against finite differences; the weighted path's dw is never touched.
TEST(RmsNorm, WeightlessNormIsTheNormWithUnitWeight) {
  const int64_t N = 4, C = 7;
  const double eps = 1e-6;
  auto x = random_vector<double>(N * C, 23, -2, 2);
  auto r = random_vector<double>(N * C, 24);
  const std::vector<double> ones(C, 1.0);
  std::vector<double> y(N * C), y1(N * C), rs(N), rs1(N), dx(N * C), dx1(N * C), dw1(C, 0.0);
  rmsnorm_forward(y.data(), rs.data(), x.data(), static_cast<const double*>(nullptr), N, C, eps);
  rmsnorm_forward(y1.data(), rs1.data(), x.data(), ones.data(), N, C, eps);
  EXPECT_EQ(y, y1);
  rmsnorm_backward(dx.data(), static_cast<double*>(nullptr), r.data(), x.data(), rs.data(),
                   static_cast<const double*>(nullptr), N, C, false);
  rmsnorm_backward(dx1.data(), dw1.data(), r.data(), x.data(), rs1.data(), ones.data(), N, C, false);
  EXPECT_TRUE(all_close(dx, dx1, kTol64, kTol64, "weightless dx"));
  auto loss = [&] {
    std::vector<double> yy(N * C), rr(N);
    rmsnorm_forward(yy.data(), rr.data(), x.data(), static_cast<const double*>(nullptr), N, C, eps);
    return dot(yy, r);
  };
  EXPECT_TRUE(check_finite_differences(x, dx, loss, "weightless rmsnorm dx"));
}

// ---- Linear --------------------------------------------------------------------------------------

TEST(Linear, ForwardBackwardMatchNaiveAndFiniteDifferences) {
  const int64_t N = 5, IN = 7, OUT = 9;
  auto in = random_vector<double>(N * IN, 30);
  auto w = random_vector<double>(OUT * IN, 31);
  auto b = random_vector<double>(OUT, 32);
  auto r = random_vector<double>(N * OUT, 33);
  std::vector<double> out(N * OUT), out_ref(N * OUT);
  linear_forward(out.data(), in.data(), w.data(), b.data(), N, IN, OUT, false);
  naive::linear_forward(out_ref.data(), in.data(), w.data(), b.data(), N, IN, OUT);
  EXPECT_TRUE(all_close(out, out_ref, kTol64, kTol64, "out"));

  std::vector<double> din(N * IN), dw(OUT * IN, 0.0), db(OUT, 0.0), din_ref(N * IN), dw_ref(OUT * IN, 0.0),
      db_ref(OUT, 0.0);
  linear_backward(din.data(), dw.data(), db.data(), r.data(), in.data(), w.data(), N, IN, OUT, false);
  naive::linear_backward(din_ref.data(), dw_ref.data(), db_ref.data(), r.data(), in.data(), w.data(), N, IN,
                         OUT);
  EXPECT_TRUE(all_close(din, din_ref, kTol64, kTol64, "din"));
  EXPECT_TRUE(all_close(dw, dw_ref, kTol64, kTol64, "dw"));
  EXPECT_TRUE(all_close(db, db_ref, kTol64, kTol64, "db"));

  auto loss = [&] {
    std::vector<double> o(N * OUT);
    linear_forward(o.data(), in.data(), w.data(), b.data(), N, IN, OUT, false);
    return dot(o, r);
  };
  EXPECT_TRUE(check_finite_differences(in, din, loss, "linear din"));
  EXPECT_TRUE(check_finite_differences(w, dw, loss, "linear dw"));
  EXPECT_TRUE(check_finite_differences(b, db, loss, "linear db"));

  // accumulate_out folds a residual add into the GEMM
  std::vector<double> acc(N * OUT, 1.0);
  linear_forward(acc.data(), in.data(), w.data(), b.data(), N, IN, OUT, true);
  for (auto& v : out_ref) v += 1.0;
  EXPECT_TRUE(all_close(acc, out_ref, kTol64, kTol64, "out += ..."));
}

// ---- RoPE ----------------------------------------------------------------------------------------

TEST(Rope, InvFreqFollowsTransformersLlama3Formula) {
  RopeScaling rs;
  rs.type = "llama3";
  rs.factor = 8.0;
  rs.low_freq_factor = 1.0;
  rs.high_freq_factor = 4.0;
  rs.original_max_position_embeddings = 64;
  const auto f = rope_inv_freq(8, 10000.0, rs);
  ASSERT_EQ(f.size(), 4u);
  // wavelength 2*pi < 16 = 64/4: kept
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  // wavelength 62.8 in [16, 64]: smooth = (64 / wavelen - 1) / (4 - 1), (1 - s) f/8 + s f
  const double wl = 2 * 3.14159265358979323846 / 0.1, s = (64.0 / wl - 1.0) / 3.0;
  EXPECT_NEAR(f[1], (1 - s) * 0.1 / 8 + s * 0.1, 1e-15);
  // wavelengths 628 and 6283 > 64: divided by factor
  EXPECT_NEAR(f[2], 0.01 / 8, 1e-17);
  EXPECT_NEAR(f[3], 0.001 / 8, 1e-18);

  RopeScaling none;
  const auto g = rope_inv_freq(8, 10000.0, none);
  EXPECT_NEAR(g[1], 0.1, 1e-16);
  RopeScaling linear;
  linear.type = "linear";
  linear.factor = 4.0;
  EXPECT_NEAR(rope_inv_freq(8, 10000.0, linear)[1], 0.025, 1e-16);
}

// Gemma 4: sliding layers rotate all 128 pairs at theta 1e4; full layers use "proportional" RoPE,
// inv_freq_i = 1e6^(-2i/512) for i < 64 and 0 after (shared/reference/model-families.md 2.4), so
// channels 64..255 and 320..511 pass through unrotated.
TEST(Rope, Gemma4ProportionalRopeRotatesOnlyTheFirstAngles) {
  const ModelCard c = model_preset("gemma-4-31b");
  const std::vector<double> sliding = proportional_rope_inv_freq(c.layer(0)),
                            full = proportional_rope_inv_freq(c.layer(5));
  ASSERT_EQ(sliding.size(), 128u);
  ASSERT_EQ(full.size(), 256u);
  for (size_t i = 0; i < 128; ++i) EXPECT_DOUBLE_EQ(sliding[i], std::pow(1e4, -2.0 * i / 256.0)) << i;
  for (size_t i = 0; i < 256; ++i) EXPECT_DOUBLE_EQ(full[i], i < 64 ? std::pow(1e6, -2.0 * i / 512.0) : 0.0) << i;
  const int64_t T = 5, hd = 512;
  std::vector<double> cos(T * hd / 2), sin(T * hd / 2);
  rope_tables(cos.data(), sin.data(), full, T);
  auto x = random_vector<double>(T * hd, 42);
  std::vector<double> y = x;
  rope_forward(y.data(), cos.data(), sin.data(), 1, T, 1, hd);
  for (int64_t t = 1; t < T; ++t)
    for (int64_t ch = 0; ch < hd; ++ch) {
      const bool rotated = ch % 256 < 64;
      if (rotated) EXPECT_NE(y[t * hd + ch], x[t * hd + ch]) << t << " " << ch;
      else EXPECT_EQ(y[t * hd + ch], x[t * hd + ch]) << t << " " << ch;
    }
}

TEST(Rope, ForwardBackwardMatchNaiveAndFiniteDifferences) {
  const int64_t B = 2, T = 9, nh = 3, hd = 8;
  RopeScaling rs;
  const auto inv_freq = rope_inv_freq(hd, 10000.0, rs);
  std::vector<double> cos(T * hd / 2), sin(T * hd / 2);
  rope_tables(cos.data(), sin.data(), inv_freq, T);
  auto x = random_vector<double>(B * T * nh * hd, 40);
  auto r = random_vector<double>(B * T * nh * hd, 41);
  std::vector<double> y = x, y_ref = x;
  rope_forward(y.data(), cos.data(), sin.data(), B, T, nh, hd);
  naive::rope_forward(y_ref.data(), inv_freq, B, T, nh, hd);
  EXPECT_TRUE(all_close(y, y_ref, kTol64, kTol64, "rope y"));
  std::vector<double> dx = r, dx_ref = r;
  rope_backward(dx.data(), cos.data(), sin.data(), B, T, nh, hd);
  naive::rope_backward(dx_ref.data(), inv_freq, B, T, nh, hd);
  EXPECT_TRUE(all_close(dx, dx_ref, kTol64, kTol64, "rope dx"));
  auto loss = [&] {
    std::vector<double> v = x;
    rope_forward(v.data(), cos.data(), sin.data(), B, T, nh, hd);
    return dot(v, r);
  };
  EXPECT_TRUE(check_finite_differences(x, dx, loss, "rope dx"));
}

// ---- SwiGLU --------------------------------------------------------------------------------------

TEST(SwiGlu, ForwardBackwardMatchNaiveAndFiniteDifferences) {
  const int64_t n = 37;
  auto g = random_vector<double>(n, 50, -6, 6);
  g[0] = 60.0;   // exp(-x) underflows
  g[1] = -60.0;  // exp(-x) large; in fp32 exp(90) overflows to inf and sigmoid must give 0
  g[2] = -95.0;
  auto u = random_vector<double>(n, 51, -2, 2);
  auto r = random_vector<double>(n, 52);
  std::vector<double> m(n), m_ref(n), dg(n), du(n), dg_ref(n), du_ref(n);
  swiglu_forward(m.data(), g.data(), u.data(), n);
  naive::swiglu_forward(m_ref.data(), g.data(), u.data(), n);
  EXPECT_TRUE(all_close(m, m_ref, kTol64, kTol64, "m"));
  swiglu_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  naive::swiglu_backward(dg_ref.data(), du_ref.data(), r.data(), g.data(), u.data(), n);
  EXPECT_TRUE(all_close(dg, dg_ref, kTol64, kTol64, "dg"));
  EXPECT_TRUE(all_close(du, du_ref, kTol64, kTol64, "du"));
  auto loss = [&] {
    std::vector<double> mm(n);
    swiglu_forward(mm.data(), g.data(), u.data(), n);
    return dot(mm, r);
  };
  EXPECT_TRUE(check_finite_differences(g, dg, loss, "swiglu dg"));
  EXPECT_TRUE(check_finite_differences(u, du, loss, "swiglu du"));

  std::vector<float> gf(g.begin(), g.end()), uf(u.begin(), u.end()), rf(r.begin(), r.end()), mf(n), dgf(n),
      duf(n);
  swiglu_forward(mf.data(), gf.data(), uf.data(), n);
  swiglu_backward(dgf.data(), duf.data(), rf.data(), gf.data(), uf.data(), n);
  EXPECT_TRUE(all_close(mf, m_ref, kTol32, kTol32, "m fp32"));
  EXPECT_TRUE(all_close(dgf, dg_ref, kTol32, kTol32, "dg fp32"));
}

TEST(SwiGlu, ThreadedSlicesAreBitwiseEqualToOneThread) {
  const int64_t n = 50001;  // several 4096-element slices, odd tail
  auto g = random_vector<float>(n, 53, -8, 8);
  auto u = random_vector<float>(n, 54);
  auto dm = random_vector<float>(n, 55);
  std::vector<float> m1(n), m3(n), dg1(n), du1(n), dg3(n), du3(n);
  swiglu_forward(m1.data(), g.data(), u.data(), n, 1);
  swiglu_forward(m3.data(), g.data(), u.data(), n, 3);
  swiglu_backward(dg1.data(), du1.data(), dm.data(), g.data(), u.data(), n, 1);
  swiglu_backward(dg3.data(), du3.data(), dm.data(), g.data(), u.data(), n, 3);
  EXPECT_EQ(m1, m3);
  EXPECT_EQ(dg1, dg3);
  EXPECT_EQ(du1, du3);
}

// ---- GeGLU (Gemma 4) ----------------------------------------------------------------------------

TEST(GeGlu, GeluMatchesTorchAndBackwardMatchesFiniteDifferences) {
  // torch.nn.functional.gelu(x, approximate="tanh") in float64 (python3-torch 1.13), printed by repr.
  const std::vector<std::pair<double, double>> torch_values = {{1.0, 0.8411919906082768},
                                                               {-2.5, -0.015084266089998577},
                                                               {0.3, 0.18537092354275922},
                                                               {4.0, 3.9999297540518075},
                                                               {-7.0, -2.3314683517128287e-15}};
  for (const auto& [x, y] : torch_values) EXPECT_NEAR(gelu_tanh(x), y, 1e-15 + 1e-14 * std::fabs(y)) << x;
  const int64_t n = 41;
  auto g = random_vector<double>(n, 56, -6, 6);
  g[0] = 40.0;  // tanh saturates at both ends
  g[1] = -40.0;
  auto u = random_vector<double>(n, 57, -2, 2);
  auto r = random_vector<double>(n, 58);
  std::vector<double> m(n), dg(n), du(n);
  geglu_forward(m.data(), g.data(), u.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(m[i], gelu_tanh(g[i]) * u[i]);
  geglu_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  auto loss = [&] {
    std::vector<double> mm(n);
    geglu_forward(mm.data(), g.data(), u.data(), n);
    return dot(mm, r);
  };
  EXPECT_TRUE(check_finite_differences(g, dg, loss, "geglu dg"));
  EXPECT_TRUE(check_finite_differences(u, du, loss, "geglu du"));
  // Threads split the elements without changing any value.
  auto gf = random_vector<float>(50001, 59, -8, 8), uf = random_vector<float>(50001, 60);
  std::vector<float> m1(50001), m3(50001), dg1(50001), du1(50001), dg3(50001), du3(50001);
  geglu_forward(m1.data(), gf.data(), uf.data(), 50001, 1);
  geglu_forward(m3.data(), gf.data(), uf.data(), 50001, 3);
  geglu_backward(dg1.data(), du1.data(), uf.data(), gf.data(), uf.data(), 50001, 1);
  geglu_backward(dg3.data(), du3.data(), uf.data(), gf.data(), uf.data(), 50001, 3);
  EXPECT_EQ(m1, m3);
  EXPECT_EQ(dg1, dg3);
  EXPECT_EQ(du1, du3);
}

// ---- Embedding -----------------------------------------------------------------------------------

// Gemma 4's scaled embedding: rows times sqrt(C) rounded to bf16 (53.0 for C = 2816), the gradient
// through the same scale (finite differences of the unit's forward), and the card's scale itself.
TEST(Embedding, GemmaScaleMultipliesRowsAndTheirGradient) {
  EXPECT_EQ(make_embedding_spec(model_preset("gemma-4-26b-a4b"), make_model_layout(model_preset("gemma-4-26b-a4b")).units[0]).scale, 53.0);
  EXPECT_EQ(make_embedding_spec(model_preset("gemma-4-31b"), make_model_layout(model_preset("gemma-4-31b")).units[0]).scale, 73.5);
  EmbeddingSpec spec;
  spec.V = 5, spec.C = 3, spec.weight = 0, spec.flat_numel = 15, spec.scale = 53.0;
  const std::vector<int32_t> tokens = {4, 0, 4, 2};
  auto w = random_vector<double>(spec.V * spec.C, 61);
  auto r = random_vector<double>(4 * spec.C, 62);
  std::vector<double> x(4 * spec.C), dw(spec.V * spec.C, 0.0);
  embedding_unit_forward(spec, w.data(), tokens.data(), 1, 4, x.data());
  for (int64_t c = 0; c < spec.C; ++c) EXPECT_EQ(x[c], 53.0 * w[4 * spec.C + c]);
  embedding_unit_backward(spec, tokens.data(), r.data(), dw.data(), 1, 4);
  auto loss = [&] {
    std::vector<double> y(4 * spec.C);
    embedding_unit_forward(spec, w.data(), tokens.data(), 1, 4, y.data());
    return dot(y, r);
  };
  EXPECT_TRUE(check_finite_differences(w, dw, loss, "scaled embedding dw"));
}

TEST(Embedding, GatherAndScatterAddWithRepeatedTokens) {
  const int64_t V = 5, C = 3, N = 6;
  const std::vector<int32_t> tokens = {4, 0, 4, 2, 4, 0};
  auto w = random_vector<double>(V * C, 60);
  std::vector<double> x(N * C);
  embedding_forward(x.data(), tokens.data(), w.data(), N, C, V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(x[n * C + c], w[tokens[n] * C + c]);
  auto dx = random_vector<double>(N * C, 61);
  std::vector<double> dw(V * C, 1.0), expect(V * C, 1.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) expect[tokens[n] * C + c] += dx[n * C + c];
  embedding_backward(dw.data(), tokens.data(), dx.data(), N, C, V);
  EXPECT_TRUE(all_close(dw, expect, kTol64, kTol64, "dw"));
  EXPECT_EQ(dw[1 * C], 1.0);  // token 1 never occurs: untouched
  EXPECT_EQ(dw[3 * C], 1.0);

  const std::vector<int32_t> bad = {1, 5};
  EXPECT_THROW(embedding_forward(x.data(), bad.data(), w.data(), 2, C, V), InputError);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(embedding_backward(dw.data(), negative.data(), dx.data(), 1, C, V), InputError);
}

// ---- Attention -----------------------------------------------------------------------------------

struct AttnCase {
  int64_t B, T, H, KV, hd, tile;
  double scale = 0;    // 0: 1/sqrt(hd)
  int64_t window = 0;  // 0: full causal
};

// The last five are Gemma 4's sliding-window attention (scale 1): windows shorter than a tile, equal
// to one, spanning several, of one key (the row sees itself only), and as long as the sequence.
std::vector<AttnCase> attention_cases() {
  return {{1, 1, 1, 1, 4, 4},         {2, 13, 4, 2, 8, 4},        {1, 17, 6, 2, 4, 5},
          {2, 8, 2, 1, 6, 8},         {1, 9, 3, 3, 4, 16},        {1, 33, 4, 1, 8, 7},
          {1, 12, 2, 2, 2, 1},        {2, 37, 4, 2, 8, 4, 1.0, 3}, {1, 40, 2, 1, 4, 8, 1.0, 8},
          {1, 50, 4, 2, 4, 8, 0.5, 19}, {1, 21, 2, 1, 4, 4, 1.0, 1}, {1, 20, 2, 2, 4, 4, 1.0, 20}};
}

template <typename Real>
void run_flash(const AttnCase& c, const std::vector<Real>& q, const std::vector<Real>& k,
               const std::vector<Real>& v, const std::vector<Real>& dout, std::vector<Real>& out,
               std::vector<Real>& lse, std::vector<Real>& dq, std::vector<Real>& dk, std::vector<Real>& dv,
               int64_t threads = 1) {
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.tile, threads};
  s.scale = c.scale;
  s.window = c.window;
  out.assign(c.B * c.T * c.H * c.hd, Real(0));
  lse.assign(c.B * c.H * c.T, Real(0));
  dq.assign(q.size(), Real(0));
  dk.assign(k.size(), Real(0));
  dv.assign(v.size(), Real(0));
  AlignedBuffer fws(attention_forward_workspace_bytes<Real>(s)),
      bws(attention_backward_workspace_bytes<Real>(s));
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s, fws.workspace());
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                     lse.data(), s, bws.workspace());
}

TEST(Attention, FlashMatchesFullSoftmaxForwardAndBackward) {
  for (const AttnCase& c : attention_cases()) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " KV=" << c.KV
                                      << " hd=" << c.hd << " tile=" << c.tile << " scale=" << c.scale
                                      << " window=" << c.window);
    // scores of a few units so the softmax is far from uniform
    auto q = random_vector<double>(c.B * c.T * c.H * c.hd, 70, -2, 2);
    auto k = random_vector<double>(c.B * c.T * c.KV * c.hd, 71, -2, 2);
    auto v = random_vector<double>(c.B * c.T * c.KV * c.hd, 72);
    auto dout = random_vector<double>(c.B * c.T * c.H * c.hd, 73);
    std::vector<double> out_ref(q.size()), lse_ref(c.B * c.H * c.T), dq_ref(q.size()), dk_ref(k.size()),
        dv_ref(v.size());
    naive::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), c.B, c.T, c.H,
                             c.KV, c.hd, c.scale, c.window);
    naive::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(),
                              v.data(), c.B, c.T, c.H, c.KV, c.hd, c.scale, c.window);
    std::vector<double> out, lse, dq, dk, dv;
    run_flash(c, q, k, v, dout, out, lse, dq, dk, dv);
    EXPECT_TRUE(all_close(out, out_ref, kTol64, kTol64, "out"));
    EXPECT_TRUE(all_close(lse, lse_ref, kTol64, kTol64, "lse"));
    EXPECT_TRUE(all_close(dq, dq_ref, kTol64, kTol64, "dq"));
    EXPECT_TRUE(all_close(dk, dk_ref, kTol64, kTol64, "dk"));
    EXPECT_TRUE(all_close(dv, dv_ref, kTol64, kTol64, "dv"));

    std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
        df(dout.begin(), dout.end()), outf, lsef, dqf, dkf, dvf;
    run_flash(c, qf, kf, vf, df, outf, lsef, dqf, dkf, dvf);
    EXPECT_TRUE(all_close(outf, out_ref, kTol32, kTol32, "out fp32"));
    EXPECT_TRUE(all_close(lsef, lse_ref, kTol32, kTol32, "lse fp32"));
    EXPECT_TRUE(all_close(dqf, dq_ref, kTol32, kTol32, "dq fp32"));
    EXPECT_TRUE(all_close(dkf, dk_ref, kTol32, kTol32, "dk fp32"));
    EXPECT_TRUE(all_close(dvf, dv_ref, kTol32, kTol32, "dv fp32"));
  }
}

TEST(Attention, WorkerThreadsGiveBitwiseIdenticalResults) {
  for (const AttnCase& c : attention_cases()) {
    auto q = random_vector<float>(c.B * c.T * c.H * c.hd, 74, -2, 2);
    auto k = random_vector<float>(c.B * c.T * c.KV * c.hd, 75, -2, 2);
    auto v = random_vector<float>(c.B * c.T * c.KV * c.hd, 76);
    auto dout = random_vector<float>(c.B * c.T * c.H * c.hd, 77);
    std::vector<float> o1, l1, dq1, dk1, dv1;
    run_flash(c, q, k, v, dout, o1, l1, dq1, dk1, dv1, 1);
    for (int64_t threads : {2, 3, 8}) {  // 8 > items for some cases: idle workers must be harmless
      std::vector<float> o, l, dq, dk, dv;
      run_flash(c, q, k, v, dout, o, l, dq, dk, dv, threads);
      EXPECT_EQ(o, o1);
      EXPECT_EQ(l, l1);
      EXPECT_EQ(dq, dq1);
      EXPECT_EQ(dk, dk1);
      EXPECT_EQ(dv, dv1);
    }
  }
}

// The flash kernel's gradients against finite differences of its own forward, for one case.
void expect_attention_matches_finite_differences(const AttnCase& c, uint64_t seed) {
  auto q = random_vector<double>(c.B * c.T * c.H * c.hd, seed, -2, 2);
  auto k = random_vector<double>(c.B * c.T * c.KV * c.hd, seed + 1, -2, 2);
  auto v = random_vector<double>(c.B * c.T * c.KV * c.hd, seed + 2);
  auto r = random_vector<double>(c.B * c.T * c.H * c.hd, seed + 3);
  std::vector<double> out, lse, dq, dk, dv;
  run_flash(c, q, k, v, r, out, lse, dq, dk, dv);
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.tile};
  s.scale = c.scale;
  s.window = c.window;
  AlignedBuffer fws(attention_forward_workspace_bytes<double>(s));
  auto loss = [&] {
    std::vector<double> o(out.size()), l(lse.size());
    attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), s, fws.workspace());
    return dot(o, r);
  };
  EXPECT_TRUE(check_finite_differences(q, dq, loss, "dq"));
  EXPECT_TRUE(check_finite_differences(k, dk, loss, "dk"));
  EXPECT_TRUE(check_finite_differences(v, dv, loss, "dv"));
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  expect_attention_matches_finite_differences(AttnCase{2, 7, 4, 2, 4, 3}, 80);
  // Gemma 4's sliding layers: a window shorter than a tile and one spanning tiles, scale 1
  expect_attention_matches_finite_differences(AttnCase{1, 11, 2, 1, 4, 4, 1.0, 3}, 84);
  expect_attention_matches_finite_differences(AttnCase{2, 9, 2, 2, 4, 2, 1.0, 5}, 88);
}

TEST(Attention, WorkingSetDoesNotGrowAsTSquared) {
  // Scratch = O(tile^2 + tile*hd) for forward (no T at all) and O(B*H*T) more for backward (one
  // value per row). Checked exactly: doubling T adds nothing to forward and exactly the row terms
  // to backward, where any (T x T) buffer would add 3 T^2 values.
  for (int64_t T : {256, 1024, 4096, 16384, 131072}) {
    const AttentionShape s{2, T, 14, 2, 64, 64};
    const AttentionShape s2{2, 2 * T, 14, 2, 64, 64};
    EXPECT_EQ(attention_forward_workspace_bytes<float>(s), attention_forward_workspace_bytes<float>(s2));
    const int64_t grow =
        attention_backward_workspace_bytes<float>(s2) - attention_backward_workspace_bytes<float>(s);
    EXPECT_EQ(grow, 2 * 14 * T * static_cast<int64_t>(sizeof(float)));  // exactly the (B, H, T) row terms
  }
  // Worker threads multiply the tile scratch, never add a T term.
  const AttentionShape one{2, 4096, 14, 2, 64, 64, 1}, four{2, 4096, 14, 2, 64, 64, 4};
  EXPECT_EQ(attention_forward_workspace_bytes<float>(four),
            4 * attention_forward_workspace_bytes<float>(one));
  // At T = 131072 the full score matrix of one head alone would be 64 GiB; the flash scratch is tiny.
  const AttentionShape big{1, 131072, 32, 8, 128, 64};
  EXPECT_LT(attention_backward_workspace_bytes<float>(big), int64_t{32} << 20);
}

// ---- Fused chunked cross-entropy -----------------------------------------------------------------

struct CeData {
  int64_t N = 11, C = 6, V = 13;
  std::vector<double> h, w;
  std::vector<int32_t> targets;
  CeData() {
    h = random_vector<double>(N * C, 90, -2, 2);
    w = random_vector<double>(V * C, 91, -1, 1);
    targets = {3, kIgnoreIndex, 0, 12, 7, kIgnoreIndex, 7, 1, 5, kIgnoreIndex, 12};
  }
};

template <typename Real>
LossResult run_fused(const CeData& d, const std::vector<Real>& h, const std::vector<Real>& w, int64_t chunk,
                     double scale, std::vector<Real>* dh, std::vector<Real>* dw, double softcap = 0) {
  AlignedBuffer ws(fused_cross_entropy_workspace_bytes<Real>(d.N, d.C, d.V, chunk, dh != nullptr));
  return fused_linear_cross_entropy(h.data(), w.data(), d.targets.data(), d.N, d.C, d.V, chunk, scale,
                                    dh ? dh->data() : nullptr, dw ? dw->data() : nullptr, ws.workspace(), softcap);
}

TEST(CrossEntropy, ChunkedEqualsUnchunkedAndNaiveForEveryChunkSize) {
  const CeData d;
  const double scale = 0.37;
  std::vector<double> dh_ref(d.N * d.C), dw_ref(d.V * d.C, 0.5);
  const LossResult ref = naive::cross_entropy(d.h.data(), d.w.data(), d.targets.data(), d.N, d.C, d.V, scale,
                                              dh_ref.data(), dw_ref.data());
  EXPECT_EQ(ref.num_tokens, 8);
  std::vector<double> dh_full(d.N * d.C), dw_full(d.V * d.C, 0.5);
  const LossResult full = run_fused<double>(d, d.h, d.w, d.N, scale, &dh_full, &dw_full);  // one chunk
  EXPECT_NEAR(full.loss_sum, ref.loss_sum, kTol64 * std::abs(ref.loss_sum));
  EXPECT_TRUE(all_close(dh_full, dh_ref, kTol64, kTol64, "dh unchunked vs naive"));
  EXPECT_TRUE(all_close(dw_full, dw_ref, kTol64, kTol64, "dw unchunked vs naive"));
  for (int64_t chunk = 1; chunk <= d.N + 2; ++chunk) {  // 3, 5, 6, 7 ... do not divide 8 unmasked tokens
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk);
    std::vector<double> dh(d.N * d.C, 9.0), dw(d.V * d.C, 0.5);  // dh is overwritten, dw accumulated
    const LossResult r = run_fused<double>(d, d.h, d.w, chunk, scale, &dh, &dw);
    EXPECT_EQ(r.num_tokens, full.num_tokens);
    EXPECT_NEAR(r.loss_sum, full.loss_sum, kTol64 * std::abs(full.loss_sum));
    EXPECT_TRUE(all_close(dh, dh_full, kTol64, kTol64, "dh"));
    EXPECT_TRUE(all_close(dw, dw_full, kTol64, kTol64, "dw"));
    const LossResult loss_only = run_fused<double>(d, d.h, d.w, chunk, scale, nullptr, nullptr);
    EXPECT_EQ(loss_only.loss_sum, r.loss_sum);  // same rows, same order: bitwise
    // fp32
    std::vector<float> hf(d.h.begin(), d.h.end()), wf(d.w.begin(), d.w.end()), dhf(d.N * d.C),
        dwf(d.V * d.C, 0.5f);
    const LossResult rf = run_fused<float>(d, hf, wf, chunk, scale, &dhf, &dwf);
    EXPECT_NEAR(rf.loss_sum, ref.loss_sum, kTol32 * std::abs(ref.loss_sum));
    EXPECT_TRUE(all_close(dhf, dh_ref, kTol32, kTol32, "dh fp32"));
    EXPECT_TRUE(all_close(dwf, dw_ref, kTol32, kTol32, "dw fp32"));
  }
  // masked rows get exactly zero gradient
  for (int64_t c = 0; c < d.C; ++c) EXPECT_EQ(dh_full[1 * d.C + c], 0.0);
}

TEST(CrossEntropy, GradientsMatchFiniteDifferencesOfScaledLossSum) {
  CeData d;
  const double scale = 1.0 / 8.0;  // what the executor passes: 1 / unmasked tokens
  std::vector<double> dh(d.N * d.C), dw(d.V * d.C, 0.0);
  run_fused<double>(d, d.h, d.w, 3, scale, &dh, &dw);
  auto loss = [&] { return scale * run_fused<double>(d, d.h, d.w, 3, scale, nullptr, nullptr).loss_sum; };
  EXPECT_TRUE(check_finite_differences(d.h, dh, loss, "dh"));
  EXPECT_TRUE(check_finite_differences(d.w, dw, loss, "dw"));
}

// Gemma 4's final logit softcap, cap * tanh(z / cap): against the naive reference (which applies the
// sech^2 Jacobian explicitly) and finite differences. Large h makes raw logits of +-10 and more, so
// the cap of 3 bends them hard and a missing tanh or Jacobian shows.
TEST(CrossEntropy, SoftcappedLogitsMatchNaiveAndFiniteDifferences) {
  CeData d;
  for (double& x : d.h) x *= 4.0;
  const double scale = 0.25, cap = 3.0;
  std::vector<double> dh_ref(d.N * d.C), dw_ref(d.V * d.C, 0.0);
  const LossResult ref = naive::cross_entropy(d.h.data(), d.w.data(), d.targets.data(), d.N, d.C, d.V, scale,
                                              dh_ref.data(), dw_ref.data(), cap);
  const LossResult uncapped = naive::cross_entropy(d.h.data(), d.w.data(), d.targets.data(), d.N, d.C, d.V, scale,
                                                   static_cast<double*>(nullptr), static_cast<double*>(nullptr));
  EXPECT_GT(std::abs(ref.loss_sum - uncapped.loss_sum), 0.1 * std::abs(ref.loss_sum));  // the cap matters here
  for (int64_t chunk : {1, 3, 11}) {
    std::vector<double> dh(d.N * d.C), dw(d.V * d.C, 0.0);
    const LossResult r = run_fused<double>(d, d.h, d.w, chunk, scale, &dh, &dw, cap);
    EXPECT_NEAR(r.loss_sum, ref.loss_sum, kTol64 * std::abs(ref.loss_sum));
    EXPECT_TRUE(all_close(dh, dh_ref, kTol64, kTol64, "dh softcap"));
    EXPECT_TRUE(all_close(dw, dw_ref, kTol64, kTol64, "dw softcap"));
    std::vector<float> hf(d.h.begin(), d.h.end()), wf(d.w.begin(), d.w.end()), dhf(d.N * d.C), dwf(d.V * d.C, 0.f);
    const LossResult rf = run_fused<float>(d, hf, wf, chunk, scale, &dhf, &dwf, cap);
    EXPECT_NEAR(rf.loss_sum, ref.loss_sum, kTol32 * std::abs(ref.loss_sum));
    EXPECT_TRUE(all_close(dhf, dh_ref, kTol32, kTol32, "dh softcap fp32"));
    EXPECT_TRUE(all_close(dwf, dw_ref, kTol32, kTol32, "dw softcap fp32"));
  }
  std::vector<double> dh(d.N * d.C), dw(d.V * d.C, 0.0);
  run_fused<double>(d, d.h, d.w, 4, scale, &dh, &dw, cap);
  auto loss = [&] { return scale * run_fused<double>(d, d.h, d.w, 4, scale, nullptr, nullptr, cap).loss_sum; };
  EXPECT_TRUE(check_finite_differences(d.h, dh, loss, "dh softcap"));
  EXPECT_TRUE(check_finite_differences(d.w, dw, loss, "dw softcap"));
}

TEST(CrossEntropy, AllMaskedAndBadTargets) {
  CeData d;
  d.targets.assign(d.N, kIgnoreIndex);
  std::vector<double> dh(d.N * d.C, 3.0), dw(d.V * d.C, 0.5);
  const LossResult r = run_fused<double>(d, d.h, d.w, 4, 1.0, &dh, &dw);
  EXPECT_EQ(r.num_tokens, 0);
  EXPECT_EQ(r.loss_sum, 0.0);
  for (double v : dh) EXPECT_EQ(v, 0.0);
  for (double v : dw) EXPECT_EQ(v, 0.5);
  d.targets[4] = d.V;  // one past the vocabulary
  EXPECT_THROW(run_fused<double>(d, d.h, d.w, 4, 1.0, &dh, &dw), InputError);
  d.targets[4] = -1;
  EXPECT_THROW(count_unmasked_targets(d.targets.data(), d.N, d.V), InputError);
}

}  // namespace
}  // namespace slidedp::kernels
