// Backend consistency of the CUDA ops (label gpu; each test skips with a visible reason where no GPU
// exists): every op of kernels/cuda against the CPU reference of kernels/cpu/transformer, run on the
// SAME bf16 values (inputs rounded to bf16 on the host first, the CPU computing in fp32 from them).
// Odd sizes (0, 1, 7, 17, 1003), unaligned offsets and guard zones around every output.
//
// Tolerances (STYLE habit 4), |got - ref| <= atol + rtol |ref|:
//  * kOneRounding = 2^-8: an op that computes in fp32 and rounds its output to bf16 once differs from
//    the fp32 reference by half a bf16 ulp (2^-9 relative) plus fp32-level differences (expf, sum
//    order); twice the half-ulp leaves margin for those.
//  * Reductions over bf16 products (norm weight gradients, column sums) are fp32 sums in another
//    order: 1e-5 relative per term count is far above fp32 rounding and far below any real bug.
//  * Outputs behind several bf16 roundings are compared against the tensor's scale (close_to_scale):
//    an element that cancels to ~0 has no meaningful relative error, the tensor's max does.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/blas.h"
#include "kernels/cpu/transformer/embedding.h"
#include "kernels/cpu/transformer/gated_delta_rule.h"
#include "kernels/cpu/transformer/geglu.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cpu/transformer/router_aux_loss.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/rope.h"
#include "kernels/cpu/transformer/swiglu.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gated_delta_rule.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/shard_exchange.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/shard_exchange_replay.h"

namespace slidedp::kernels::cuda {
namespace {

using kernels::test::all_close;
using kernels::test::random_vector;
using kernels::test::unit_rows;
using test::bf;
using test::Bf16Array;
using test::close_to_scale;
using test::DeviceArray;
using test::random_bf16_values;
using test::to_bf16_bits;
using test::widen;

constexpr double kOneRounding = 1.0 / 256.0;  // see the header comment
constexpr cudaStream_t kStream = nullptr;     // the legacy default stream: tests run one op at a time

// Odd sizes take the scalar tails; 4, 1024 and 4100 the vectorized (4 at a time) paths (cuda-review D21).
const std::vector<int64_t> kSizes = {0, 1, 7, 17, 1003, 4, 1024, 4100};

std::vector<float> round_all(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

// ---- conversion ----

TEST(CudaConvert, F32ToBf16IsBitwiseTheScalarReferenceForEverySizeAndOffset) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t n : kSizes)
    for (int64_t offset : {0, 1, 3}) {
      std::vector<float> src = random_vector<float>(n + offset, 7 + n, -3.0, 3.0);
      if (n + offset > 8) {  // exact ties, infinities, signed zero, subnormals
        src[static_cast<size_t>(offset)] = std::bit_cast<float>(0x3f808000u);  // tie, rounds to even (down)
        src[static_cast<size_t>(offset + 1)] = std::bit_cast<float>(0x3f818000u);  // tie, rounds to even (up)
        src[static_cast<size_t>(offset + 2)] = std::numeric_limits<float>::infinity();
        src[static_cast<size_t>(offset + 3)] = -0.0f;
        src[static_cast<size_t>(offset + 4)] = std::bit_cast<float>(0x00012345u);  // subnormal
      }
      DeviceArray<float> d_src(src);
      Bf16Array d_dst(n);
      f32_to_bf16(d_src.get() + offset, bf(d_dst), n, kStream);
      std::vector<bf16_bits> got = d_dst.download();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[static_cast<size_t>(i)], float_to_bf16(src[static_cast<size_t>(i + offset)]))
            << "n " << n << " offset " << offset << " i " << i;
      EXPECT_TRUE(d_dst.check_guards("f32_to_bf16"));

      std::vector<bf16_bits> bits = to_bf16_bits(src);
      Bf16Array d_bits(bits);
      DeviceArray<float> d_back(n);
      bf16_to_f32(bf(d_bits) + offset, d_back.get(), n, kStream);
      std::vector<float> back = d_back.download();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(back[static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(bf16_to_float(bits[static_cast<size_t>(i + offset)])));
      EXPECT_TRUE(d_back.check_guards("bf16_to_f32"));
    }
}

// ---- SwiGLU, bias, column sums ----

// A gated activation against the CPU's, dg written in place over dm (the units' aliasing).
template <class GpuFwd, class GpuBwd, class CpuFwd, class CpuBwd>
void expect_gated_matches_cpu(GpuFwd gpu_fwd, GpuBwd gpu_bwd, CpuFwd cpu_fwd, CpuBwd cpu_bwd, uint64_t seed,
                              const std::string& what) {
  for (int64_t n : kSizes) {
    const std::vector<float> g = random_bf16_values(n, seed, -6, 6), u = random_bf16_values(n, seed + 1),
                             dm = random_bf16_values(n, seed + 2);
    std::vector<float> m_ref(static_cast<size_t>(n)), dg_ref(static_cast<size_t>(n)),
        du_ref(static_cast<size_t>(n));
    cpu_fwd(m_ref.data(), g.data(), u.data(), n, 1);
    cpu_bwd(dg_ref.data(), du_ref.data(), dm.data(), g.data(), u.data(), n, 1);
    Bf16Array d_g(to_bf16_bits(g)), d_u(to_bf16_bits(u)), d_m(n), d_du(n);
    Bf16Array d_dm(to_bf16_bits(dm));
    gpu_fwd(bf(d_m), bf(d_g), bf(d_u), n, kStream);
    gpu_bwd(bf(d_dm), bf(d_du), bf(d_dm), bf(d_g), bf(d_u), n, kStream);
    EXPECT_TRUE(all_close(widen(d_m.download()), m_ref, 1e-6, kOneRounding, what + " m"));
    EXPECT_TRUE(all_close(widen(d_dm.download()), dg_ref, 1e-6, kOneRounding, what + " dg"));
    EXPECT_TRUE(all_close(widen(d_du.download()), du_ref, 1e-6, kOneRounding, what + " du"));
    for (const Bf16Array* a : {&d_m, &d_dm, &d_du}) EXPECT_TRUE(a->check_guards(what));
  }
}

// The profiler's GEMM operands: the kernel writes what the device math gives on the host, rounded once.
TEST(CudaConvert, UniformFillIsTheDeviceMathRoundedToBf16) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t n : kSizes) {
    DeviceArray<bf16_bits> d(n);
    fill_uniform_bf16(reinterpret_cast<bf16*>(d.get()), n, 5, -2.0f, 3.0f, kStream);
    std::vector<bf16_bits> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = float_to_bf16(math::uniform_at(5, i, -2.0f, 3.0f));
    EXPECT_EQ(d.download(), want) << "n " << n;
    EXPECT_TRUE(d.check_guards("fill"));
  }
}

TEST(CudaSwiGlu, ForwardBackwardMatchCpuWithinOneRounding) {
  SLIDEDP_REQUIRE_GPU();
  expect_gated_matches_cpu(swiglu_forward, swiglu_backward, kernels::swiglu_forward<float>,
                           kernels::swiglu_backward<float>, 1, "swiglu");
}

TEST(CudaGeGlu, ForwardBackwardMatchCpuWithinOneRounding) {
  SLIDEDP_REQUIRE_GPU();
  expect_gated_matches_cpu(geglu_forward, geglu_backward, kernels::geglu_forward<float>,
                           kernels::geglu_backward<float>, 4, "geglu");
}

// Gemma 4's residual adds: h1 = x + norm(a) (no scale) and y = (h1 + norm(d)) * layer_scalar, one
// rounding of the fp32 sum; dh1 = dy * layer_scalar in fp32 (exact: a product of two bf16 values).
TEST(CudaResidual, ScaledAddAndScaleToF32AreOneRoundingOfTheFormula) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t n : kSizes) {
    const std::vector<float> a = random_bf16_values(n, 7, -3, 3), b = random_bf16_values(n, 8, -3, 3);
    const float scalar = round_to_bf16(0.7f);
    Bf16Array d_a(to_bf16_bits(a)), d_b(to_bf16_bits(b)), d_y(n),
        d_s(to_bf16_bits(std::vector<float>{scalar}));
    DeviceArray<float> d_f(n);
    add_scaled(bf(d_y), bf(d_a), bf(d_b), nullptr, n, kStream);
    const std::vector<float> sum = widen(d_y.download());
    add_scaled(bf(d_b), bf(d_a), bf(d_b), bf(d_s), n, kStream);  // in place over b
    const std::vector<float> scaled = widen(d_b.download());
    scale_to_f32(d_f.get(), bf(d_a), bf(d_s), n, kStream);
    const std::vector<float> f = d_f.download();
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      ASSERT_EQ(sum[k], round_to_bf16(a[k] + b[k])) << i;
      ASSERT_EQ(scaled[k], round_to_bf16((a[k] + b[k]) * scalar)) << i;
      ASSERT_EQ(f[k], a[k] * scalar) << i;
    }
    EXPECT_TRUE(d_y.check_guards("add_scaled") && d_b.check_guards("add_scaled in place") &&
                d_f.check_guards("scale"));
  }
}

TEST(CudaBias, AddAndColumnSumMatchCpu) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t N : {1, 7, 1003})
    for (int64_t C : {1, 17, 300}) {
      const std::vector<float> x = random_bf16_values(N * C, 4), b = random_bf16_values(C, 5);
      Bf16Array d_x(to_bf16_bits(x)), d_b(to_bf16_bits(b));
      add_bias(bf(d_x), bf(d_b), N, C, kStream);
      std::vector<float> ref(x.size());
      for (int64_t i = 0; i < N * C; ++i)
        ref[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] + b[static_cast<size_t>(i % C)];
      EXPECT_TRUE(all_close(widen(d_x.download()), ref, 1e-6, kOneRounding, "add_bias"));
      EXPECT_TRUE(d_x.check_guards("add_bias"));
      // column sums of the (rounded) biased values, accumulated onto an existing value
      const std::vector<float> xb = widen(d_x.download());
      std::vector<float> init = random_vector<float>(C, 6), sum_ref(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) {
        double s = init[static_cast<size_t>(c)];
        for (int64_t r = 0; r < N; ++r) s += xb[static_cast<size_t>(r * C + c)];
        sum_ref[static_cast<size_t>(c)] = static_cast<float>(s);
      }
      DeviceArray<float> d_sum(init);
      DeviceArray<std::byte> ws(std::max<int64_t>(colsum_workspace_bytes(N, C), 1));
      colsum_accumulate(d_sum.get(), bf(d_x), N, C, ws.get(), kStream);
      // fp32 sums of N terms of magnitude <= 2: N * 2^-24 * 2 relative to the scale, bounded by 1e-5 * N
      EXPECT_TRUE(all_close(d_sum.download(), sum_ref, 1e-5 * static_cast<double>(N), 1e-5, "colsum"));
      EXPECT_TRUE(d_sum.check_guards("colsum"));
    }
}

// ---- RMSNorm ----

TEST(CudaRmsNorm, ForwardAndEveryBackwardDtypeCombinationMatchCpu) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t N : {1, 7, 300})
    for (int64_t C : {8, 17, 1003}) {
      const std::vector<float> x = random_bf16_values(N * C, 10), w = random_bf16_values(C, 11, 0.5, 1.5);
      const std::vector<float> dy = random_bf16_values(N * C, 12), res = random_bf16_values(N * C, 13);
      const double eps = 1e-5;
      std::vector<float> y_ref(x.size()), rstd_ref(static_cast<size_t>(N));
      kernels::rmsnorm_forward<float>(y_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
      Bf16Array d_x(to_bf16_bits(x)), d_w(to_bf16_bits(w)), d_y(N * C);
      DeviceArray<float> d_rstd(N);
      rmsnorm_forward(bf(d_y), d_rstd.get(), bf(d_x), bf(d_w), N, C, eps, kStream);
      EXPECT_TRUE(all_close(widen(d_y.download()), y_ref, 1e-5, kOneRounding, "rmsnorm y"));
      // rstd: fp32 sums of C squares in another order (the CPU sums in double)
      EXPECT_TRUE(all_close(d_rstd.download(), rstd_ref, 0.0, 1e-5, "rmsnorm rstd"));
      EXPECT_TRUE(d_y.check_guards("rmsnorm y"));
      EXPECT_TRUE(d_rstd.check_guards("rmsnorm rstd"));

      // backward with the CPU's rstd on both sides, so only the backward is compared
      d_rstd.upload(rstd_ref);
      for (bool dy_f32 : {true, false})
        for (int residual : {0, 1, 2})  // none, bf16, fp32
          for (bool dx_f32 : {true, false}) {
            std::vector<float> dx_ref(x.size(), 0.0f), dw_ref = random_vector<float>(C, 14);
            const std::vector<float> dw_init = dw_ref;
            if (residual != 0) dx_ref = res;
            kernels::rmsnorm_backward<float>(dx_ref.data(), dw_ref.data(), dy.data(), x.data(),
                                             rstd_ref.data(), w.data(), N, C, residual != 0);
            DeviceArray<float> d_dy32(dy), d_res32(res), d_dx32(N * C), d_dw(dw_init);
            Bf16Array d_dy16(to_bf16_bits(dy)), d_res16(to_bf16_bits(res)), d_dx16(N * C);
            DeviceArray<std::byte> ws(rmsnorm_backward_workspace_bytes(N, C));
            RmsnormBackwardArgs a;
            a.dy = dy_f32 ? static_cast<const void*>(d_dy32.get()) : d_dy16.get();
            a.dy_f32 = dy_f32;
            a.x = bf(d_x), a.rstd = d_rstd.get(), a.w = bf(d_w);
            a.residual = residual == 0   ? nullptr
                         : residual == 1 ? static_cast<const void*>(d_res16.get())
                                         : d_res32.get();
            a.residual_f32 = residual == 2;
            a.dx = dx_f32 ? static_cast<void*>(d_dx32.get()) : d_dx16.get();
            a.dx_f32 = dx_f32;
            a.dw = d_dw.get(), a.N = N, a.C = C;
            rmsnorm_backward(a, ws.get(), kStream);
            const std::vector<float> dx = dx_f32 ? d_dx32.download() : widen(d_dx16.download());
            const std::string what = "rmsnorm backward dy_f32 " + std::to_string(dy_f32) + " residual " +
                                     std::to_string(residual) + " dx_f32 " + std::to_string(dx_f32);
            // dx: fp32 row dot of C terms in another order, then one rounding when dx is bf16
            EXPECT_TRUE(close_to_scale(dx, dx_ref, 1e-4, dx_f32 ? 1e-4 : kOneRounding, what + " dx"));
            // dw: sums of N products in another order
            EXPECT_TRUE(
                all_close(d_dw.download(), dw_ref, 1e-5 * static_cast<double>(N), 1e-5, what + " dw"));
            EXPECT_TRUE(d_dx32.check_guards(what) && d_dx16.check_guards(what) && d_dw.check_guards(what));
          }
    }
}

// Gemma 4's weightless norms (v_norm, the router's): a null weight is w = 1, in both directions, and
// the fp32 residual accumulates in place (dx is the residual), as the unit calls it for K=V layers.
TEST(CudaRmsNorm, WeightlessNormAndInPlaceResidualMatchCpu) {
  SLIDEDP_REQUIRE_GPU();
  const int64_t N = 37, C = 512;
  const std::vector<float> x = random_bf16_values(N * C, 15), dy = random_bf16_values(N * C, 16);
  const std::vector<float> res = random_vector<float>(N * C, 17);
  const double eps = 1e-6;
  std::vector<float> y_ref(x.size()), rstd_ref(static_cast<size_t>(N)), dx_ref = res;
  kernels::rmsnorm_forward<float>(y_ref.data(), rstd_ref.data(), x.data(), nullptr, N, C, eps);
  kernels::rmsnorm_backward<float>(dx_ref.data(), nullptr, dy.data(), x.data(), rstd_ref.data(), nullptr, N,
                                   C, true);
  Bf16Array d_x(to_bf16_bits(x)), d_y(N * C), d_dy(to_bf16_bits(dy));
  DeviceArray<float> d_rstd(N), d_dx(res);
  rmsnorm_forward(bf(d_y), d_rstd.get(), bf(d_x), nullptr, N, C, eps, kStream);
  EXPECT_TRUE(all_close(widen(d_y.download()), y_ref, 1e-5, kOneRounding, "weightless rmsnorm y"));
  d_rstd.upload(rstd_ref);
  RmsnormBackwardArgs a;
  a.dy = d_dy.get(), a.dy_f32 = false, a.x = bf(d_x), a.rstd = d_rstd.get(), a.w = nullptr;
  a.residual = d_dx.get(), a.residual_f32 = true, a.dx = d_dx.get(), a.dx_f32 = true, a.N = N, a.C = C;
  rmsnorm_backward(a, nullptr, kStream);
  EXPECT_TRUE(close_to_scale(d_dx.download(), dx_ref, 1e-4, 1e-4, "weightless rmsnorm dx (in place)"));
  EXPECT_TRUE(d_y.check_guards("weightless y") && d_dx.check_guards("weightless dx"));
}

// ---- RoPE ----

TEST(CudaRope, ForwardAndBackwardMatchCpuIncludingLlama3Scaling) {
  SLIDEDP_REQUIRE_GPU();
  RopeScaling llama3;
  llama3.type = "llama3";
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position_embeddings = 64;
  for (int64_t hd : {8, 64, 128})
    for (const RopeScaling& scaling : {RopeScaling{}, llama3}) {
      const int64_t B = 2, T = 300, nh = 3;
      const std::vector<double> inv_freq = kernels::rope_inv_freq(hd, 500000.0, scaling);
      std::vector<float> cos(static_cast<size_t>(T * hd / 2)), sin(cos.size());
      kernels::rope_tables<float>(cos.data(), sin.data(), inv_freq, T);
      const std::vector<float> x = random_bf16_values(B * T * nh * hd, 20);
      for (bool backward : {false, true}) {
        std::vector<float> ref = x;
        if (backward) {
          kernels::rope_backward<float>(ref.data(), cos.data(), sin.data(), B, T, nh, hd);
        } else {
          kernels::rope_forward<float>(ref.data(), cos.data(), sin.data(), B, T, nh, hd);
        }
        Bf16Array d_x(to_bf16_bits(x));
        rope(bf(d_x), make_rope_freqs(inv_freq), B, T, nh, hd, backward, kStream);
        EXPECT_TRUE(
            all_close(widen(d_x.download()), ref, 1e-6, kOneRounding, "rope hd " + std::to_string(hd)));
        EXPECT_TRUE(d_x.check_guards("rope"));
      }
    }
}

// ---- embedding ----

TEST(CudaEmbedding, GatherIsExactAndScatterAddIsBitwiseTheCpusTokenOrderSum) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t N : {1, 7, 1003})
    for (int64_t C : {8, 17, 64}) {
      const int64_t V = 37;
      std::vector<int32_t> tok(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i)
        tok[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + i / 3) % 11);  // repeats
      const std::vector<float> w = random_bf16_values(V * C, 30), dx = random_bf16_values(N * C, 31);
      Bf16Array d_w(to_bf16_bits(w)), d_x(N * C), d_dx(to_bf16_bits(dx));
      DeviceArray<int32_t> d_tok(tok);
      embedding_forward(bf(d_x), d_tok.get(), bf(d_w), N, C, V, 1.0f, kStream);
      std::vector<float> x_ref(static_cast<size_t>(N * C));
      kernels::embedding_forward<float>(x_ref.data(), tok.data(), w.data(), N, C, V);
      EXPECT_EQ(widen(d_x.download()), x_ref);
      EXPECT_TRUE(d_x.check_guards("embedding forward"));

      std::vector<float> dw_ref = random_vector<float>(V * C, 32);
      DeviceArray<float> d_dw(dw_ref);
      kernels::embedding_backward<float>(dw_ref.data(), tok.data(), dx.data(), N, C, V);
      DeviceArray<std::byte> ws(embedding_backward_workspace_bytes(N, V));
      embedding_backward(d_dw.get(), d_tok.get(), bf(d_dx), N, C, V, 1.0f, ws.get(), kStream);
      EXPECT_EQ(d_dw.download(), dw_ref) << "N " << N << " C " << C;  // same fp32 adds in the same order
      EXPECT_TRUE(d_dw.check_guards("embedding backward"));
    }
}

TEST(CudaEmbedding, OutOfRangeIdsGiveNanRowsAndAreSkippedInBackward) {
  SLIDEDP_REQUIRE_GPU();
  const int64_t N = 3, C = 8, V = 5;
  const std::vector<int32_t> tok = {1, 9, -2};
  const std::vector<float> w = random_bf16_values(V * C, 40);
  Bf16Array d_w(to_bf16_bits(w)), d_x(N * C), d_dx(to_bf16_bits(random_bf16_values(N * C, 41)));
  DeviceArray<int32_t> d_tok(tok);
  embedding_forward(bf(d_x), d_tok.get(), bf(d_w), N, C, V, 1.0f, kStream);
  const std::vector<float> x = widen(d_x.download());
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(x[static_cast<size_t>(c)], w[static_cast<size_t>(C + c)]);
    EXPECT_TRUE(std::isnan(x[static_cast<size_t>(C + c)]) && std::isnan(x[static_cast<size_t>(2 * C + c)]));
  }
  DeviceArray<float> d_dw(std::vector<float>(static_cast<size_t>(V * C), 0.0f));
  DeviceArray<std::byte> ws(embedding_backward_workspace_bytes(N, V));
  embedding_backward(d_dw.get(), d_tok.get(), bf(d_dx), N, C, V, 1.0f, ws.get(), kStream);
  const std::vector<float> dw = d_dw.download();
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < C; ++c)
      if (v != 1) {
        EXPECT_EQ(dw[static_cast<size_t>(v * C + c)], 0.0f) << "row " << v;
      }
}

// ---- GEMM ----

// The reference is exact in double: ref = beta c + AB, AB = sum_k a_ik b_kj. With s the fp32
// accumulation of AB, |s - AB| <= e = (K + 1) 2^-24 sum |terms| (the standard gamma bound; the test
// allows 2e). An fp32 output adds no rounding beyond that. A bf16 output (u = 2^-8) is rounded once,
// D = bf16(s + beta c): |D - ref| <= u |ref| + (1 + u) e. But cuBLASLt may also round the product to
// the output type before adding beta C, D = bf16(bf16(s) + beta c); then
// |D - ref| <= u |ref| + u (1 + u) |AB| + (1 + u)^2 e (within the 2e allowed), the middle term being
// the product's rounding (u |s|) plus the second rounding's share of it. The first GPU check (H200,
// cuBLASLt 13) did this: M 64 N 48 K 80, beta 1, C = D, element (0, 4): AB = 2.899910,
// c = 0.166016, ref = 3.065926 (its bf16 is 3.0625), got 3.078125 = bf16(bf16(AB) + c) =
// bf16(2.90625 + 0.166016), 0.78 of a bf16 ulp off, beyond one rounding's half ulp.
TEST(CudaGemm, AllTransposesStridesDtypesAndBetasWithinTheAccumulationBound) {
  SLIDEDP_REQUIRE_GPU();
  GemmContext ctx;
  DeviceArray<std::byte> ws(kGemmWorkspaceBytes);
  struct Shape {
    int64_t M, N, K, pad;
  };
  for (const Shape sh :
       {Shape{1, 1, 1, 0}, Shape{7, 17, 33, 3}, Shape{64, 48, 80, 0}, Shape{130, 70, 257, 8}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool out_f32 : {false, true})
          for (int beta : {0, 1})
            for (bool separate_c : {false, true}) {
              const int64_t M = sh.M, N = sh.N, K = sh.K;
              const int64_t lda = (ta ? M : K) + sh.pad, ldb = (tb ? K : N) + sh.pad, ldd = N + sh.pad;
              const int64_t a_rows = ta ? K : M, b_rows = tb ? N : K;
              const std::vector<float> A = random_bf16_values(a_rows * lda, 50),
                                       B = random_bf16_values(b_rows * ldb, 51);
              const std::vector<float> Cv = random_bf16_values(M * ldd, 52),
                                       D0 = random_bf16_values(M * ldd, 53);
              auto a_at = [&](int64_t i, int64_t k) {
                return A[static_cast<size_t>(ta ? k * lda + i : i * lda + k)];
              };
              auto b_at = [&](int64_t k, int64_t j) {
                return B[static_cast<size_t>(tb ? j * ldb + k : k * ldb + j)];
              };
              Bf16Array d_A(to_bf16_bits(A)), d_B(to_bf16_bits(B)), d_C16(to_bf16_bits(Cv)),
                  d_D16(to_bf16_bits(D0));
              DeviceArray<float> d_C32(Cv), d_D32(D0);
              GemmArgs g;
              g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K;
              g.A = bf(d_A), g.lda = lda, g.B = bf(d_B), g.ldb = ldb;
              g.beta = static_cast<float>(beta);
              g.out_f32 = out_f32;
              g.D = out_f32 ? static_cast<void*>(d_D32.get()) : d_D16.get();
              g.ldd = ldd;
              if (separate_c)
                g.C = out_f32 ? static_cast<const void*>(d_C32.get()) : d_C16.get(), g.ldc = ldd;
              ctx.run(g, ws.get(), kStream);
              const std::vector<float> got = out_f32 ? d_D32.download() : widen(d_D16.download());
              const std::vector<float>& c_in = separate_c ? Cv : D0;
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  double ref = beta * static_cast<double>(c_in[static_cast<size_t>(i * ldd + j)]),
                         mag = std::fabs(ref), ab = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const double p = static_cast<double>(a_at(i, k)) * b_at(k, j);
                    ab += p;
                    mag += std::fabs(p);
                  }
                  ref += ab;
                  // the product's own rounding when beta C is added after it (see above)
                  const double product_rounding =
                      beta != 0 ? kOneRounding * (1 + kOneRounding) * std::fabs(ab) : 0.0;
                  const double tol = (out_f32 ? 0.0 : kOneRounding * std::fabs(ref) + product_rounding) +
                                     2.0 * (K + 1) * 0x1p-24 * mag + 1e-30;
                  ASSERT_LE(std::fabs(got[static_cast<size_t>(i * ldd + j)] - ref), tol)
                      << "M " << M << " N " << N << " K " << K << " ta " << ta << " tb " << tb << " f32 "
                      << out_f32 << " beta " << beta << " separate C " << separate_c << " at (" << i << ", "
                      << j << ")";
                }
              // padding columns of D untouched
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = N; j < ldd; ++j)
                  ASSERT_EQ(got[static_cast<size_t>(i * ldd + j)], D0[static_cast<size_t>(i * ldd + j)]);
              EXPECT_TRUE(d_D16.check_guards("gemm D") && d_D32.check_guards("gemm D"));
            }
}

// ---- attention ----

struct AttnCase {
  int64_t B, T, H, KV, hd;
  double scale = 0;    // 0: 1/sqrt(hd)
  int64_t window = 0;  // 0: none
};
const std::vector<AttnCase> kAttnCases = {{2, 1, 4, 2, 8},     {1, 17, 4, 2, 8},  {2, 130, 4, 1, 64},
                                          {1, 200, 8, 2, 128}, {1, 64, 2, 2, 64}, {1, 65, 4, 4, 128}};

struct AttnData {
  std::vector<float> q, k, v, dout;
  std::vector<float> out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
};

// CPU fp32 flash attention on the bf16 values; the CPU forward's output is rounded to bf16 because
// that is what the GPU backward receives as `out`.
AttnData attention_reference(const AttnCase& c, const std::vector<int32_t>& positions = {}) {
  AttnData d;
  d.q = random_bf16_values(c.B * c.T * c.H * c.hd, 60, -2, 2);
  d.k = random_bf16_values(c.B * c.T * c.KV * c.hd, 61, -2, 2);
  d.v = random_bf16_values(c.B * c.T * c.KV * c.hd, 62);
  d.dout = random_bf16_values(c.B * c.T * c.H * c.hd, 63);
  kernels::AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, 16, 1};
  if (!positions.empty()) s.positions = positions.data();
  s.scale = c.scale;
  s.window = c.window;
  d.out_ref.resize(d.q.size());
  d.lse_ref.resize(static_cast<size_t>(c.B * c.H * c.T));
  kernels::AlignedBuffer fws(kernels::attention_forward_workspace_bytes<float>(s));
  kernels::attention_forward<float>(d.out_ref.data(), d.lse_ref.data(), d.q.data(), d.k.data(), d.v.data(), s,
                                    fws.workspace());
  d.out_ref = round_all(d.out_ref);
  d.dq_ref.resize(d.q.size());
  d.dk_ref.resize(d.k.size());
  d.dv_ref.resize(d.v.size());
  kernels::AlignedBuffer bws(kernels::attention_backward_workspace_bytes<float>(s));
  kernels::attention_backward<float>(d.dq_ref.data(), d.dk_ref.data(), d.dv_ref.data(), d.dout.data(),
                                     d.q.data(), d.k.data(), d.v.data(), d.out_ref.data(), d.lse_ref.data(),
                                     s, bws.workspace());
  return d;
}

struct AttnResult {
  std::vector<float> out, lse, dq, dk, dv;
};

AttnResult run_attention(const AttnCase& c, const AttnData& d, AttentionImpl impl,
                         const std::vector<int32_t>& positions = {}) {
  Bf16Array q(to_bf16_bits(d.q)), k(to_bf16_bits(d.k)), v(to_bf16_bits(d.v)), dout(to_bf16_bits(d.dout));
  Bf16Array out(static_cast<int64_t>(d.q.size())), out_ref(to_bf16_bits(d.out_ref));
  Bf16Array dq(static_cast<int64_t>(d.q.size())), dk(static_cast<int64_t>(d.k.size())),
      dv(static_cast<int64_t>(d.v.size()));
  DeviceArray<float> lse(c.B * c.H * c.T), lse_ref(d.lse_ref);
  DeviceArray<int32_t> pos(positions.empty() ? std::vector<int32_t>{0} : positions);
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd};
  if (!positions.empty()) s.positions = pos.get();
  s.scale = c.scale;
  s.window = c.window;
  attention_forward(bf(out), lse.get(), bf(q), bf(k), bf(v), s, impl, kStream);
  // backward from the CPU's out and lse, so the comparison isolates the backward
  DeviceArray<std::byte> ws(std::max<int64_t>(attention_backward_workspace_bytes(s), 1));
  attention_backward(bf(dq), bf(dk), bf(dv), bf(dout), bf(q), bf(k), bf(v), bf(out_ref), lse_ref.get(), s,
                     impl, ws.get(), kStream);
  for (const Bf16Array* a : {&out, &dq, &dk, &dv}) EXPECT_TRUE(a->check_guards("attention"));
  EXPECT_TRUE(lse.check_guards("attention lse"));
  return AttnResult{widen(out.download()), lse.download(), widen(dq.download()), widen(dk.download()),
                    widen(dv.download())};
}

// Both paths' results against the CPU's, with the tolerances the next comment derives: the reference
// path within fp32 sums and one rounding, tensor cores within 2e-2 of each tensor's scale.
void expect_attention_close(const AttnResult& r, const AttnData& d, bool tc) {
  const double frac = tc ? 2e-2 : 2e-3, rtol = tc ? 2e-2 : kOneRounding;
  EXPECT_TRUE(close_to_scale(r.out, d.out_ref, frac, rtol, "out"));
  EXPECT_TRUE(all_close(r.lse, d.lse_ref, tc ? 2e-3 : 1e-4, 1e-4, "lse"));  // fp32 row statistics
  EXPECT_TRUE(close_to_scale(r.dq, d.dq_ref, frac, rtol, "dq"));
  EXPECT_TRUE(close_to_scale(r.dk, d.dk_ref, frac, rtol, "dk"));
  EXPECT_TRUE(close_to_scale(r.dv, d.dv_ref, frac, rtol, "dv"));
}

// Reference path: fp32 throughout, one rounding per output. Tensor cores: P (forward) and P, dS
// (backward) are rounded to bf16 before their products, like FlashAttention-2; sums over up to 200
// keys of such terms stay within a few bf16 ulps of the tensor's scale: 2e-2 of it.
TEST(CudaAttention, BothImplementationsMatchTheCpuFlashAttention) {
  SLIDEDP_REQUIRE_GPU();
  for (const AttnCase& c : kAttnCases) {
    const AttnData d = attention_reference(c);
    for (AttentionImpl impl : {AttentionImpl::kReference, AttentionImpl::kTensorCore}) {
      if (impl == AttentionImpl::kTensorCore && !attention_tensor_core_supports(c.hd)) continue;
      const bool tc = impl == AttentionImpl::kTensorCore;
      SCOPED_TRACE(::testing::Message() << (tc ? "tensor cores" : "reference") << " B=" << c.B << " T=" << c.T
                                        << " H=" << c.H << " KV=" << c.KV << " hd=" << c.hd);
      const AttnResult r = run_attention(c, d, impl);
      expect_attention_close(r, d, tc);
    }
  }
}

// Packed documents: each query sees only its own document's keys. Documents of 40, 70 and 40
// tokens and of 1, 149 tokens: one crosses a 64-key tile, so a tile's rows start in different
// documents, and rows of a later document meet whole key tiles they must skip (the tensor-core
// forward's online softmax then stays at -inf without a NaN). Tolerances of the test above.
TEST(CudaAttention, PackedDocumentsMatchTheCpuFlashAttention) {
  SLIDEDP_REQUIRE_GPU();
  const AttnCase c{2, 150, 4, 2, 64};
  std::vector<int32_t> positions;
  for (const std::vector<int>& docs : {std::vector<int>{40, 70, 40}, std::vector<int>{1, 149}})
    for (int len : docs)
      for (int p = 0; p < len; ++p) positions.push_back(p);
  ASSERT_EQ(static_cast<int64_t>(positions.size()), c.B * c.T);
  const AttnData d = attention_reference(c, positions);
  for (AttentionImpl impl : {AttentionImpl::kReference, AttentionImpl::kTensorCore}) {
    const bool tc = impl == AttentionImpl::kTensorCore;
    SCOPED_TRACE(tc ? "tensor cores" : "reference");
    const AttnResult r = run_attention(c, d, impl, positions);
    expect_attention_close(r, d, tc);
  }
}

// Gemma 4's attention: scale 1 and a sliding window (on head_dim 64 and 128 for both paths, with
// packed documents too), and its head sizes 256 and 512 (reference path only) with and without the
// window. Windows of 50 and 70 keys on 150-200 tokens: whole 64-key tiles are skipped, rows cross
// tiles. Small inputs (scale 1 with unnormalised q, k would saturate the softmax). Tolerances of the
// tests above.
TEST(CudaAttention, ScaleOneSlidingWindowAndGemmaHeadSizesMatchTheCpuFlashAttention) {
  SLIDEDP_REQUIRE_GPU();
  const std::vector<AttnCase> cases = {{1, 200, 4, 2, 64, 1.0, 70},
                                       {2, 150, 4, 1, 128, 0.0, 50},
                                       {1, 130, 4, 2, 256, 1.0, 50},
                                       {1, 90, 2, 1, 512, 1.0, 0},
                                       {1, 90, 4, 1, 512, 1.0, 40}};
  for (const AttnCase& c : cases)
    for (bool documents : {false, true}) {
      std::vector<int32_t> positions;
      if (documents)
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < c.T; ++t)
            positions.push_back(static_cast<int32_t>(t < c.T / 3 ? t : t - c.T / 3));
      AttnData d = attention_reference(c, positions);
      for (AttentionImpl impl : {AttentionImpl::kReference, AttentionImpl::kTensorCore}) {
        if (impl == AttentionImpl::kTensorCore && !attention_tensor_core_supports(c.hd)) continue;
        const bool tc = impl == AttentionImpl::kTensorCore;
        SCOPED_TRACE(::testing::Message()
                     << (tc ? "tensor cores" : "reference") << " T=" << c.T << " hd=" << c.hd
                     << " scale=" << c.scale << " window=" << c.window << " documents=" << documents);
        const AttnResult r = run_attention(c, d, impl, positions);
        expect_attention_close(r, d, tc);
      }
    }
}

TEST(CudaAttention, ResultsAreBitwiseReproducible) {
  SLIDEDP_REQUIRE_GPU();
  const AttnCase c{2, 150, 8, 2, 64};
  const AttnData d = attention_reference(c);
  for (AttentionImpl impl : {AttentionImpl::kReference, AttentionImpl::kTensorCore}) {
    const AttnResult a = run_attention(c, d, impl), b = run_attention(c, d, impl);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

// Long sequence: memory stays O(T) (no T x T buffer exists to allocate) and the tensor-core path
// still agrees with the reference path on the GPU.
TEST(CudaAttention, LongSequenceTensorCoresAgreeWithTheReferencePath) {
  SLIDEDP_REQUIRE_GPU();
  const AttnCase c{1, 2048, 4, 2, 128};
  AttnData d;
  d.q = random_bf16_values(c.B * c.T * c.H * c.hd, 70, -2, 2);
  d.k = random_bf16_values(c.B * c.T * c.KV * c.hd, 71, -2, 2);
  d.v = random_bf16_values(c.B * c.T * c.KV * c.hd, 72);
  d.dout = random_bf16_values(c.B * c.T * c.H * c.hd, 73);
  // out and lse for the backward come from the reference path's forward
  const AttentionShape s{c.B, c.T, c.H, c.KV, c.hd};
  Bf16Array q(to_bf16_bits(d.q)), k(to_bf16_bits(d.k)), v(to_bf16_bits(d.v)),
      out(static_cast<int64_t>(d.q.size()));
  DeviceArray<float> lse(c.B * c.H * c.T);
  attention_forward(bf(out), lse.get(), bf(q), bf(k), bf(v), s, AttentionImpl::kReference, kStream);
  d.out_ref = widen(out.download());
  d.lse_ref = lse.download();
  const AttnResult ref = run_attention(c, d, AttentionImpl::kReference);
  const AttnResult tc = run_attention(c, d, AttentionImpl::kTensorCore);
  EXPECT_TRUE(close_to_scale(tc.out, ref.out, 2e-2, 2e-2, "out"));
  EXPECT_TRUE(all_close(tc.lse, ref.lse, 2e-3, 1e-4, "lse"));
  EXPECT_TRUE(close_to_scale(tc.dq, ref.dq, 2e-2, 2e-2, "dq"));
  EXPECT_TRUE(close_to_scale(tc.dk, ref.dk, 2e-2, 2e-2, "dk"));
  EXPECT_TRUE(close_to_scale(tc.dv, ref.dv, 2e-2, 2e-2, "dv"));
}

// ---- cross-entropy kernels ----

// The chunk kernel against the formula in double, with Gemma 4's logit softcap when cap > 0: the
// loss of cap tanh(z / cap) and dlogits times its derivative 1 - tanh^2.
void expect_chunk_matches_the_formula(double cap) {
  const int64_t nc = 9, V = 1003;
  const std::vector<float> logits = random_vector<float>(nc * V, 80, -4, 4);
  std::vector<int32_t> targets = {0, 5, -100, 1002, 17, -100, 3, 999, 500};
  const double scale = 0.125;
  DeviceArray<float> d_logits(logits);
  Bf16Array d_dl(nc * V);
  DeviceArray<double> d_rows(nc), d_out(2);
  DeviceArray<int32_t> d_t(targets);
  cross_entropy_chunk(d_logits.get(), bf(d_dl), d_rows.get(), d_t.get(), nc, V, scale, cap, kStream);
  cross_entropy_finish(d_out.get(), d_rows.get(), d_t.get(), nc, kStream);
  const std::vector<float> dl = widen(d_dl.download());
  const std::vector<double> out = d_out.download();
  double loss = 0;
  for (int64_t r = 0; r < nc; ++r) {
    std::vector<double> row(static_cast<size_t>(V)), chain(static_cast<size_t>(V), 1.0);
    for (int64_t c = 0; c < V; ++c) {
      const double z = logits[static_cast<size_t>(r * V + c)];
      row[c] = cap > 0 ? cap * std::tanh(z / cap) : z;
      if (cap > 0) chain[c] = 1.0 - std::tanh(z / cap) * std::tanh(z / cap);
    }
    const int32_t t = targets[static_cast<size_t>(r)];
    double mx = -1e300, sum = 0;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, row[c]);
    for (int64_t c = 0; c < V; ++c) sum += std::exp(row[c] - mx);
    for (int64_t c = 0; c < V; ++c) {
      const double ref =
          t == -100 ? 0.0 : scale * (std::exp(row[c] - mx) / sum - (c == t ? 1.0 : 0.0)) * chain[c];
      // one bf16 rounding of a value computed in fp32 (the cap's fp32 tanh adds a few fp32 ulps)
      ASSERT_NEAR(dl[static_cast<size_t>(r * V + c)], ref, kOneRounding * std::fabs(ref) + 1e-7 * scale)
          << r << " " << c;
    }
    if (t != -100) loss += mx + std::log(sum) - row[t];
  }
  EXPECT_NEAR(out[0], loss, 1e-5 * loss);  // fp32 exponentials summed in double
  EXPECT_EQ(out[1], 7.0);
  EXPECT_TRUE(d_dl.check_guards("dlogits") && d_rows.check_guards("loss rows") && d_out.check_guards("loss"));
}

TEST(CudaCrossEntropy, ChunkKernelAndFinishMatchTheFormula) {
  SLIDEDP_REQUIRE_GPU();
  expect_chunk_matches_the_formula(0);
}

// A cap of 3 on logits in [-4, 4] bends most of them: a kernel that skipped the cap or its
// derivative would miss by far more than one rounding.
TEST(CudaCrossEntropy, SoftcappedChunkMatchesTheFormula) {
  SLIDEDP_REQUIRE_GPU();
  expect_chunk_matches_the_formula(3.0);
}

TEST(CudaCrossEntropy, ATargetOutsideTheVocabularyGivesANanLoss) {
  SLIDEDP_REQUIRE_GPU();
  const int64_t nc = 2, V = 10;
  DeviceArray<float> d_logits(random_vector<float>(nc * V, 81));
  Bf16Array d_dl(nc * V);
  DeviceArray<double> d_rows(nc), d_out(2);
  DeviceArray<int32_t> d_t(std::vector<int32_t>{3, 10});
  cross_entropy_chunk(d_logits.get(), bf(d_dl), d_rows.get(), d_t.get(), nc, V, 1.0, 0.0, kStream);
  cross_entropy_finish(d_out.get(), d_rows.get(), d_t.get(), nc, kStream);
  EXPECT_TRUE(std::isnan(d_out.download()[0]));
}

// ---- the mixture-of-experts router ----

// Against the CPU's router on random logits (no ties: the CPU emulation test covers those): the same
// experts in the same order; probabilities, weights and logit gradients within a few fp32 ulps (the
// softmax's double sum runs in another order: warp butterfly vs index order).
TEST(CudaRouter, TopKForwardAndBackwardMatchTheCpu) {
  SLIDEDP_REQUIRE_GPU();
  for (const auto& [E, K] : {std::pair<int64_t, int64_t>{128, 8}, std::pair<int64_t, int64_t>{5, 2},
                             std::pair<int64_t, int64_t>{256, 8}}) {
    SCOPED_TRACE(::testing::Message() << "E=" << E << " K=" << K);
    const int64_t N = 37;
    const std::vector<float> logits = random_vector<float>(N * E, 95, -3, 3), dw = random_vector<float>(N * K, 96);
    std::vector<float> probs(N * E), w(N * K), dl(N * E);
    std::vector<int32_t> idx(N * K);
    kernels::router_topk_forward<float>(probs.data(), idx.data(), w.data(), logits.data(), N, E, K);
    kernels::router_topk_backward<float>(dl.data(), dw.data(), probs.data(), idx.data(), N, E, K);
    DeviceArray<float> d_logits(logits), d_probs(N * E), d_w(N * K), d_dw(dw), d_dl(N * E);
    DeviceArray<int32_t> d_idx(N * K);
    router_topk_forward(d_probs.get(), d_idx.get(), d_w.get(), d_logits.get(), N, E, K, kStream);
    router_topk_backward(d_dl.get(), d_dw.get(), d_probs.get(), d_idx.get(), N, E, K, kStream);
    EXPECT_EQ(d_idx.download(), idx);
    EXPECT_TRUE(all_close(d_probs.download(), probs, 1e-9, 1e-6, "router probs"));
    EXPECT_TRUE(all_close(d_w.download(), w, 1e-9, 1e-6, "router weights"));
    EXPECT_TRUE(all_close(d_dl.download(), dl, 1e-9, 1e-5, "router dlogits"));
    EXPECT_TRUE(d_probs.check_guards("probs") && d_idx.check_guards("idx") && d_w.check_guards("w") &&
                d_dl.check_guards("dlogits"));
  }
}

// Gemma 4's per-expert scale and the load-balancing loss against the CPU layer's loops and
// router_aux_loss.cc: the statistics are the CPU's sums in the CPU's order (bitwise), the rest one
// fp32 rounding apart (per-expert sums in a different but fixed order).
TEST(CudaRouter, ExpertScaleAndLoadBalancingFollowTheCpu) {
  SLIDEDP_REQUIRE_GPU();
  const int64_t B = 3, T = 29, N = B * T, E = 6, K = 2;
  const std::vector<float> logits = random_vector<float>(N * E, 301, -3, 3), dw0 = random_vector<float>(N * K, 302);
  std::vector<float> probs(N * E), w_renorm(N * K), dl_unused(N * E);
  std::vector<int32_t> idx(N * K);
  kernels::router_topk_forward<float>(probs.data(), idx.data(), w_renorm.data(), logits.data(), N, E, K);
  const std::vector<float> scale = round_all(random_vector<float>(E, 303, 0.5, 1.5));
  // the CPU layer's loops (gemma4_layer.cc)
  std::vector<float> w(N * K), dw = dw0, dscale(E, 0.25f);
  for (int64_t i = 0; i < N * K; ++i) w[i] = w_renorm[i] * scale[idx[i]];
  std::vector<double> dscale_sum(E, 0.0);
  for (int64_t i = 0; i < N * K; ++i) {
    dscale_sum[idx[i]] += static_cast<double>(dw[i]) * w_renorm[i];
    dw[i] *= scale[idx[i]];
  }
  for (int64_t e = 0; e < E; ++e) dscale[e] += static_cast<float>(dscale_sum[e]);
  std::vector<double> stats_ref(2 * B * E, 0.0);
  const RouterStats st_ref = router_stats_view(stats_ref.data(), B, E, 2 * T, 0.3);
  std::vector<float> dlogits_ref = random_vector<float>(N * E, 304);
  const std::vector<float> dlogits0 = dlogits_ref;
  kernels::router_stats_add<float>(st_ref, probs.data(), idx.data(), B, T, E, K);  // two layers' worth
  kernels::router_stats_add<float>(st_ref, probs.data(), idx.data(), B, T, E, K);
  kernels::router_aux_backward<float>(dlogits_ref.data(), probs.data(), st_ref, B, T, E);
  const double loss_ref = 1.5 + 0.3 * kernels::router_aux_loss_sum(st_ref, B, E) * 4.0;

  DeviceArray<float> d_w(N * K), d_wr(w_renorm), d_dw(dw0), d_dscale(std::vector<float>(E, 0.25f)), d_probs(probs),
      d_dl(dlogits0);
  DeviceArray<int32_t> d_idx(idx);
  Bf16Array d_scale(to_bf16_bits(scale));
  DeviceArray<double> d_stats(std::vector<double>(2 * B * E, 0.0)), d_loss(std::vector<double>{1.5, 0.0});
  expert_scale_forward(d_w.get(), d_wr.get(), bf(d_scale), d_idx.get(), N * K, kStream);
  expert_scale_backward(d_dscale.get(), d_dw.get(), d_wr.get(), bf(d_scale), d_idx.get(), N * K, E, kStream);
  const RouterStats st = router_stats_view(d_stats.get(), B, E, 2 * T, 0.3);
  router_stats_add(st, d_probs.get(), d_idx.get(), B, T, E, K, kStream);
  router_stats_add(st, d_probs.get(), d_idx.get(), B, T, E, K, kStream);
  router_aux_backward(d_dl.get(), d_probs.get(), st, B, T, E, kStream);
  router_aux_loss_add(d_loss.get(), st, B, E, 4.0, kStream);
  EXPECT_EQ(d_w.download(), w) << "one fp32 product each";
  EXPECT_EQ(d_dw.download(), dw) << "one fp32 product each";
  EXPECT_TRUE(all_close(d_dscale.download(), dscale, 1e-7, 1e-6, "dscale"));
  EXPECT_EQ(d_stats.download(), stats_ref) << "the CPU's sums in its order";
  EXPECT_TRUE(all_close(d_dl.download(), dlogits_ref, 1e-9, 1e-6, "aux dlogits"));
  EXPECT_NEAR(d_loss.download()[0], loss_ref, 1e-12 * loss_ref);
  EXPECT_TRUE(d_w.check_guards("w") && d_dw.check_guards("dw") && d_dscale.check_guards("dscale") &&
              d_stats.check_guards("stats") && d_dl.check_guards("dlogits") && d_loss.check_guards("loss"));
}

// ---- mixture-of-experts experts (grouped GEMMs) ----

// The routed experts against the CPU's experts_forward / experts_backward in fp32 from the same bf16
// values. Shapes that reach every edge of the grouped GEMM: C and Ie not multiples of the 64 x 64
// tile or the 32-deep k step, one expert with more rows than a tile (several tiles, one partial), one
// expert never chosen (no tiles; its gradients must stay as they were), both activations. Tolerances
// as the decoder's (units_test.cc): the GPU rounds g, u, m, the expert outputs and the weighted
// gradients to bf16 on the way, each one 2^-9 relative rounding.
TEST(CudaMoeExperts, ForwardAndBackwardFollowTheCpuExperts) {
  SLIDEDP_REQUIRE_GPU();
  for (ExpertActivation act : {ExpertActivation::kGeluTanh, ExpertActivation::kSilu}) {
    SCOPED_TRACE(act == ExpertActivation::kGeluTanh ? "GeGLU" : "SwiGLU");
    MoeSpec s;
    s.C = 96, s.E = 7, s.K = 2, s.Ie = 40, s.activation = act;
    const int64_t N = 150, R = N * s.K, unused = 3;
    std::vector<int32_t> idx(R);
    for (int64_t t = 0; t < N; ++t) {  // expert 0 on every token (150 rows: three tiles), never expert 3
      idx[t * 2] = t % 5 == 4 ? 6 : 0;
      idx[t * 2 + 1] = static_cast<int32_t>(1 + (t * 7) % 6);
      if (idx[t * 2 + 1] == unused) idx[t * 2 + 1] = 5;
      if (idx[t * 2 + 1] == idx[t * 2]) idx[t * 2 + 1] = 2;
    }
    const std::vector<float> gate_up = random_bf16_values(s.E * 2 * s.Ie * s.C, 311, -0.2, 0.2),
                             down = random_bf16_values(s.E * s.C * s.Ie, 312, -0.2, 0.2),
                             z = random_bf16_values(N * s.C, 313, -2, 2), dy = random_bf16_values(N * s.C, 314),
                             w = random_vector<float>(R, 315, 0.1, 0.9);
    const std::vector<float> dgu0 = random_vector<float>(gate_up.size(), 316),
                             dd0 = random_vector<float>(down.size(), 317);
    // CPU reference
    std::vector<float> y_ref(N * s.C), dz_ref(N * s.C), dw_ref(R), dgu_ref = dgu0, dd_ref = dd0;
    kernels::AlignedBuffer saved(kernels::experts_saved_bytes<float>(s, N)),
        fws(kernels::experts_forward_workspace_bytes<float>(s, N)),
        bws(kernels::experts_backward_workspace_bytes<float>(s, N));
    kernels::experts_forward<float>(s, gate_up.data(), down.data(), z.data(), idx.data(), w.data(), y_ref.data(),
                                    saved.workspace(), N, fws.workspace());
    kernels::experts_backward<float>(s, gate_up.data(), down.data(), z.data(), idx.data(), w.data(), saved.workspace(),
                                     dy.data(), dz_ref.data(), dw_ref.data(), dgu_ref.data(), dd_ref.data(), N,
                                     bws.workspace());
    // GPU
    Bf16Array d_gu(to_bf16_bits(gate_up)), d_down(to_bf16_bits(down)), d_z(to_bf16_bits(z)), d_dy(to_bf16_bits(dy)),
        d_y(N * s.C);
    DeviceArray<int32_t> d_idx(idx);
    DeviceArray<float> d_w(w), d_dz(N * s.C), d_dw(R), d_dgu(dgu0), d_dd(dd0);
    DeviceArray<std::byte> d_saved(experts_saved_bytes(s, N)), d_fws(experts_forward_workspace_bytes(s, N)),
        d_bws(experts_backward_workspace_bytes(s, N));
    experts_forward(s, bf(d_gu), bf(d_down), bf(d_z), d_idx.get(), d_w.get(), bf(d_y), {d_saved.get(), d_saved.size()},
                    N, {d_fws.get(), d_fws.size()}, kStream);
    experts_backward(s, bf(d_gu), bf(d_down), bf(d_z), d_idx.get(), d_w.get(), {d_saved.get(), d_saved.size()},
                     bf(d_dy), d_dz.get(), d_dw.get(), d_dgu.get(), d_dd.get(), N, {d_bws.get(), d_bws.size()}, kStream);
    EXPECT_TRUE(close_to_scale(widen(d_y.download()), y_ref, 2e-2, 2e-2, "y"));
    EXPECT_TRUE(close_to_scale(d_dz.download(), dz_ref, 3e-2, 3e-2, "dz"));
    EXPECT_TRUE(close_to_scale(d_dw.download(), dw_ref, 3e-2, 3e-2, "dw"));
    const std::vector<float> dgu = d_dgu.download(), dd = d_dd.download();
    std::vector<float> dgu_delta(dgu.size()), dgu_ref_delta(dgu.size()), dd_delta(dd.size()), dd_ref_delta(dd.size());
    for (size_t i = 0; i < dgu.size(); ++i) dgu_delta[i] = dgu[i] - dgu0[i], dgu_ref_delta[i] = dgu_ref[i] - dgu0[i];
    for (size_t i = 0; i < dd.size(); ++i) dd_delta[i] = dd[i] - dd0[i], dd_ref_delta[i] = dd_ref[i] - dd0[i];
    EXPECT_TRUE(close_to_scale(dgu_delta, dgu_ref_delta, 3e-2, 3e-2, "dgate_up"));
    EXPECT_TRUE(close_to_scale(dd_delta, dd_ref_delta, 3e-2, 3e-2, "ddown"));
    for (int64_t i = unused * 2 * s.Ie * s.C; i < (unused + 1) * 2 * s.Ie * s.C; ++i)
      ASSERT_EQ(dgu[i], dgu0[i]) << "expert " << unused << " has no rows: its gradient stays untouched";
    EXPECT_TRUE(d_y.check_guards("y") && d_dz.check_guards("dz") && d_dw.check_guards("dw") &&
                d_dgu.check_guards("dgate_up") && d_dd.check_guards("ddown") && d_saved.check_guards("saved") &&
                d_fws.check_guards("fwd ws") && d_bws.check_guards("bwd ws"));
    // deterministic: a second run gives the same bits
    DeviceArray<float> d_dgu2(dgu0), d_dd2(dd0), d_dz2(N * s.C), d_dw2(R);
    experts_backward(s, bf(d_gu), bf(d_down), bf(d_z), d_idx.get(), d_w.get(), {d_saved.get(), d_saved.size()},
                     bf(d_dy), d_dz2.get(), d_dw2.get(), d_dgu2.get(), d_dd2.get(), N, {d_bws.get(), d_bws.size()}, kStream);
    EXPECT_EQ(d_dgu2.download(), dgu);
    EXPECT_EQ(d_dz2.download(), d_dz.download());
  }
}

// ---- gated delta rule (Qwen3.6) ----

// The GPU's column recurrence (fp32) against the CPU's chunked form in fp64 on the same values, with
// document starts from positions as the CPU's segments: several chunks of the backward's checkpoints
// (150 tokens), a one-token document, grouped value heads, and a 128 x 128 state that needs the
// shared-memory opt-in. Tolerances: fp32 sums of dk terms per token over 150 tokens of a contracting
// recurrence, about 1e-6 relative; 1e-4 of each tensor's scale leaves room, and a wrong term (a sign,
// a missing reset) moves results by O(1) of it.
TEST(CudaDeltaRule, ForwardAndBackwardFollowTheCpuChunkedForm) {
  SLIDEDP_REQUIRE_GPU();
  struct Shape { int64_t B, T, nk, nv, dk, dv; bool packed; };
  for (const Shape& sh : {Shape{2, 150, 2, 4, 64, 32, true}, Shape{1, 70, 1, 2, 128, 128, false}}) {
    SCOPED_TRACE(::testing::Message() << "dk " << sh.dk << " dv " << sh.dv);
    const int64_t N = sh.B * sh.T;
    std::vector<int32_t> positions(static_cast<size_t>(N));
    std::vector<int64_t> seg = {0};
    for (int64_t b = 0; b < sh.B; ++b)
      for (int64_t t = 0, p = 0; t < sh.T; ++t, ++p) {
        const bool start = t == 0 || (sh.packed && b == 1 && (t == 40 || t == 41 || t == 100));
        if (start) p = 0;
        if (start && b * sh.T + t > 0) seg.push_back(b * sh.T + t);
        positions[static_cast<size_t>(b * sh.T + t)] = static_cast<int32_t>(p);
      }
    seg.push_back(N);
      const std::vector<double> q = unit_rows(random_vector<double>(N * sh.nk * sh.dk, 901), sh.dk, 1 / std::sqrt(double(sh.dk))),
                              k = unit_rows(random_vector<double>(N * sh.nk * sh.dk, 902), sh.dk, 1.0),
                              v = random_vector<double>(N * sh.nv * sh.dv, 903, -2, 2),
                              g = random_vector<double>(N * sh.nv, 904, -1.5, 0),
                              b = random_vector<double>(N * sh.nv, 905, 0.05, 0.95),
                              dO = random_vector<double>(N * sh.nv * sh.dv, 906);
    const kernels::DeltaRuleSpec sp{sh.nk, sh.nv, sh.dk, sh.dv, 64, 1};
    const kernels::DeltaRuleSegments segs{seg.data(), static_cast<int64_t>(seg.size()) - 1};
    std::vector<double> o(v.size()), dq(q.size()), dk(k.size()), dv(v.size()), dg(g.size()), db(b.size());
    kernels::AlignedBuffer fws(kernels::delta_rule_forward_workspace_bytes<double>(sp, kernels::extent_of(segs))),
        bws(kernels::delta_rule_backward_workspace_bytes<double>(sp, kernels::extent_of(segs)));
    kernels::delta_rule_forward<double>(sp, segs, q.data(), k.data(), v.data(), g.data(), b.data(), o.data(), fws.workspace());
    kernels::delta_rule_backward<double>(sp, segs, q.data(), k.data(), v.data(), g.data(), b.data(), dO.data(), dq.data(),
                                         dk.data(), dv.data(), dg.data(), db.data(), bws.workspace());
    auto f32 = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    DeviceArray<float> d_q(f32(q)), d_k(f32(k)), d_v(f32(v)), d_g(f32(g)), d_b(f32(b)), d_do(f32(dO)), d_o(N * sh.nv * sh.dv),
        d_dq(q.size()), d_dk(k.size()), d_dv(v.size()), d_dg(g.size()), d_db(b.size());
    DeviceArray<int32_t> d_pos(positions);
    DeviceArray<std::byte> ws(delta_rule_backward_workspace_bytes(sh.B, sh.T, sh.nv, sh.dk, sh.dv));
    DeltaRuleShape s{sh.B, sh.T, sh.nk, sh.nv, sh.dk, sh.dv, sh.packed ? d_pos.get() : nullptr};
    delta_rule_forward(s, d_q.get(), d_k.get(), d_v.get(), d_g.get(), d_b.get(), d_o.get(), kStream);
    delta_rule_backward(s, d_q.get(), d_k.get(), d_v.get(), d_g.get(), d_b.get(), d_do.get(), d_dq.get(), d_dk.get(),
                        d_dv.get(), d_dg.get(), d_db.get(), ws.get(), kStream);
    EXPECT_TRUE(close_to_scale(d_o.download(), f32(o), 1e-4, 1e-3, "o"));
    EXPECT_TRUE(close_to_scale(d_dq.download(), f32(dq), 1e-4, 1e-3, "dq"));
    EXPECT_TRUE(close_to_scale(d_dk.download(), f32(dk), 1e-4, 1e-3, "dk"));
    EXPECT_TRUE(close_to_scale(d_dv.download(), f32(dv), 1e-4, 1e-3, "dv"));
    EXPECT_TRUE(close_to_scale(d_dg.download(), f32(dg), 1e-4, 1e-3, "dg"));
    EXPECT_TRUE(close_to_scale(d_db.download(), f32(db), 1e-4, 1e-3, "db"));
    EXPECT_TRUE(d_o.check_guards("o") && d_dq.check_guards("dq") && d_dk.check_guards("dk") && d_dv.check_guards("dv") &&
                d_dg.check_guards("dg") && d_db.check_guards("db") && ws.check_guards("workspace"));
  }
}

// ---- FSDP2's optimizer ----

// The GPU AdamW is the CPU kernel's arithmetic operation for operation (fmaf, IEEE sqrt and division,
// no contraction), with the same fp32 constants: bitwise equal, over several steps, with weight decay,
// a gradient scale and a clip coefficient; and the accumulation is one fp32 add.
TEST(CudaAdamw, IsBitwiseTheCpuKernelOverSeveralSteps) {
  SLIDEDP_REQUIRE_GPU();
  for (int64_t n : kSizes) {
    std::vector<float> p = random_vector<float>(n, 11 + n, -1.0, 1.0), m(static_cast<size_t>(n), 0.0f),
                       v(static_cast<size_t>(n), 0.0f);
    DeviceArray<float> dp(p), dm(m), dv(v);
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> g = random_vector<float>(n, 100 * step + n, -0.1, 0.1);
      const std::vector<float> extra = random_vector<float>(n, 200 * step + n, -0.1, 0.1);
      DeviceArray<float> dg(g), dx(extra);
      add_f32(dg.get(), dx.get(), n, kStream);
      std::vector<float> gsum(g);
      for (int64_t i = 0; i < n; ++i)
        gsum[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] + extra[static_cast<size_t>(i)];
      kernels::AdamwHyper h;
      h.lr = 1e-3 * step, h.weight_decay = 0.1, h.step = step, h.grad_scale = 0.5, h.clip_coef = 0.75;
      adamw(dp.get(), dm.get(), dv.get(), dg.get(), n, kernels::adamw_constants(h), kStream);
      kernels::AdamwState st{p.data(), m.data(), v.data(), nullptr};
      kernels::adamw_update(st, gsum.data(), h, 0, n);
      EXPECT_EQ(dg.download(), gsum) << "n " << n << " step " << step;
      EXPECT_TRUE(dg.check_guards("gradient"));
    }
    EXPECT_EQ(dp.download(), p) << "n " << n;
    EXPECT_EQ(dm.download(), m) << "n " << n;
    EXPECT_EQ(dv.download(), v) << "n " << n;
    for (const DeviceArray<float>* a : {&dp, &dm, &dv}) EXPECT_TRUE(a->check_guards("state"));
  }
}


// ---- the gpu route's reduce-scatter: the rank-order sum of the exchanged pieces ----

// The sum kernel on the pieces the exchange would deliver (replayed on the host from every rank's plan;
// the NCCL transfers themselves need two GPUs): bitwise the host reduction of the ranks' chunks, the
// cpu route's result, for bf16 and fp32 pieces, unequal shards and an empty one.
TEST(CudaShardExchange, SumOfTheReceivedPiecesIsBitwiseTheHostReduction) {
  SLIDEDP_REQUIRE_GPU();
  for (int ranks : {2, 3, 8})
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{4100}}) {
      std::vector<std::vector<float>> f32;
      std::vector<std::vector<bf16_bits>> b16;
      for (int r = 0; r < ranks; ++r) {
        f32.push_back(random_vector<float>(count, 31 * ranks + r + count, -1e3, 1e3));
        b16.push_back(to_bf16_bits(f32.back()));
      }
      std::vector<ShardExchangePlan> plans;
      for (int me = 0; me < ranks; ++me) plans.push_back(shard_exchange_plan(count, ranks, me));
      for (bool bf16_pieces : {true, false}) {
        std::vector<const float*> fs;
        std::vector<const bf16_bits*> bs;
        for (int r = 0; r < ranks; ++r) {
          fs.push_back(f32[static_cast<size_t>(r)].data());
          bs.push_back(b16[static_cast<size_t>(r)].data());
        }
        std::vector<float> want(static_cast<size_t>(count));
        if (bf16_pieces)
          kernels::reduce_grads(kernels::GradSlots<bf16_bits>{std::span<const bf16_bits* const>(bs), 1.0f, nullptr}, want.data(), 0, count);
        else
          kernels::reduce_grads(kernels::GradSlots<float>{std::span<const float* const>(fs), 1.0f, nullptr}, want.data(), 0, count);
        for (int me = 0; me < ranks; ++me) {
          const ShardExchangePlan& p = plans[static_cast<size_t>(me)];
          DeviceArray<float> out(p.mine.size());
          if (bf16_pieces) {
            DeviceArray<bf16_bits> in(b16[static_cast<size_t>(me)]);
            DeviceArray<bf16_bits> received(test::received_pieces(b16, plans, me, bf16_bits{0x7fc1}));
            sum_received_shards(reinterpret_cast<const std::byte*>(in.get()), reinterpret_cast<const std::byte*>(received.get()),
                                true, p, me, ranks, out.get(), kStream);
          } else {
            DeviceArray<float> in(f32[static_cast<size_t>(me)]);
            DeviceArray<float> received(test::received_pieces(f32, plans, me, std::numeric_limits<float>::quiet_NaN()));
            sum_received_shards(reinterpret_cast<const std::byte*>(in.get()), reinterpret_cast<const std::byte*>(received.get()),
                                false, p, me, ranks, out.get(), kStream);
          }
          const std::vector<float> got = out.download();
          const std::vector<float> mine(want.begin() + p.mine.begin, want.begin() + p.mine.end);
          EXPECT_EQ(got, mine) << ranks << " ranks, count " << count << ", rank " << me << (bf16_pieces ? ", bf16" : ", fp32");
          EXPECT_TRUE(out.check_guards("reduced shard"));
        }
      }
    }
}

}  // namespace
}  // namespace slidedp::kernels::cuda
