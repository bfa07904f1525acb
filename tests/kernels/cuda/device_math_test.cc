// The CUDA kernels' math (kernels/cuda/device_math.h) run on the CPU against the CPU units
// (kernels/cpu/transformer), in CI where no GPU is. Each check drives the functions the way the kernel
// does (per element, or per row with the warp's lane split and butterfly sum emulated exactly), on
// fp32 inputs; only the bf16 stores and the launch are left to the GPU tests.
// Tolerances: where the kernel's formula is the CPU unit's, bitwise (SwiGLU, RoPE with the CPU's
// tables, the cross-entropy dlogits); where the sums differ (RMSNorm: fp32 per lane and a warp tree
// vs the CPU's double), the fp32 rounding of a length-C sum, C u with u = 2^-24 (C = 257: 1.5e-5),
// relative to the row's scale.
#include "kernels/cuda/device_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/embedding.h"
#include "kernels/cpu/transformer/gated_delta_rule.h"
#include "kernels/cpu/transformer/geglu.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/rope.h"
#include "kernels/cpu/transformer/swiglu.h"
#include "kernels/cuda/attention_tiles.h"
#include "kernels/cuda/scratch_sizes.h"
#include "tests/kernels/transformer/test_util.h"

namespace slidedp::kernels::cuda {
namespace {

using kernels::test::all_close;
using kernels::test::random_vector;
using kernels::test::unit_rows;

std::vector<float> random_floats(int64_t n, uint64_t seed, float lo = -3.0f, float hi = 3.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// A gated activation m = act(g) u and its gradients, element by element, against the CPU unit's
// forward and backward over the same values: bitwise (the same float formula in the same order).
template <class CpuForward, class CpuBackward, class Kernel, class KernelGrads>
void expect_gated_activation_bitwise(CpuForward cpu_forward, CpuBackward cpu_backward, Kernel kernel,
                                     KernelGrads kernel_grads, float g_range, uint64_t seed) {
  const int64_t n = 4099;
  const auto g = random_floats(n, seed, -g_range, g_range), u = random_floats(n, seed + 1), dm = random_floats(n, seed + 2);
  std::vector<float> m(n), dg(n), du(n);
  cpu_forward(m.data(), g.data(), u.data(), n, int64_t{1});
  cpu_backward(dg.data(), du.data(), dm.data(), g.data(), u.data(), n, int64_t{1});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(kernel(g[i], u[i]), m[i]) << i;
    float dgi, dui;
    kernel_grads(g[i], u[i], dm[i], &dgi, &dui);
    ASSERT_EQ(dgi, dg[i]) << i;
    ASSERT_EQ(dui, du[i]) << i;
  }
}

TEST(DeviceMath, SwiGluIsTheCpuUnitBitwise) {
  expect_gated_activation_bitwise(swiglu_forward<float>, swiglu_backward<float>, math::swiglu, math::swiglu_grads, 12, 1);
}

// The kernel computes each (t, i) angle itself; the CPU reads tables. Same double angle, same rounding.
TEST(DeviceMath, RopeIsTheCpuUnitBitwise) {
  const int64_t B = 2, T = 37, nh = 3, hd = 16, half = hd / 2;
  const std::vector<double> inv_freq = rope_inv_freq(hd, 10000.0, RopeScaling{});
  std::vector<float> cos(T * half), sin(T * half);
  rope_tables<float>(cos.data(), sin.data(), inv_freq, T);
  const auto x = random_floats(B * T * nh * hd, 4);
  for (float sign : {1.0f, -1.0f}) {
    std::vector<float> cpu = x, dev = x;
    if (sign > 0)
      rope_forward<float>(cpu.data(), cos.data(), sin.data(), B, T, nh, hd);
    else
      rope_backward<float>(cpu.data(), cos.data(), sin.data(), B, T, nh, hd);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < half; ++i) {
          float c, s;
          math::rope_cos_sin(t, inv_freq[static_cast<size_t>(i)], &c, &s);
          for (int64_t h = 0; h < nh; ++h) {
            float* v = dev.data() + ((b * T + t) * nh + h) * hd;
            math::rope_rotate(&v[i], &v[i + half], c, s, sign);
          }
        }
    ASSERT_EQ(dev, cpu) << "sign " << sign;
  }
}

// One row the way rmsnorm.cu's warp does it: lane l takes columns l, l + 32, ...; the lanes' fp32
// partials meet in the shuffle butterfly.
float warp_row_sum(int64_t C, const auto& term) {
  float lanes[math::kWarpSize] = {};
  for (int l = 0; l < math::kWarpSize; ++l)
    for (int64_t c = l; c < C; c += math::kWarpSize) lanes[l] += term(c);
  math::warp_butterfly_sum(lanes);
  for (int l = 1; l < math::kWarpSize; ++l) EXPECT_EQ(lanes[l], lanes[0]) << "every lane ends with the same sum";
  return lanes[0];
}

TEST(DeviceMath, RmsNormForwardAndBackwardFollowTheCpuUnit) {
  const int64_t N = 9, C = 257;
  const double eps = 1e-6, tol = static_cast<double>(C) * 0x1p-24;
  const auto x = random_floats(N * C, 5), w = random_floats(C, 6, 0.5f, 1.5f), dy = random_floats(N * C, 7);
  std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C, 0.0f);
  rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward<float>(dx.data(), dw.data(), dy.data(), x.data(), rstd.data(), w.data(), N, C, false);
  std::vector<float> dw_dev(C, 0.0f);
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x.data() + r * C;
    const float* dyr = dy.data() + r * C;
    const float ss = warp_row_sum(C, [&](int64_t c) { return xr[c] * xr[c]; });
    const float rs = math::rmsnorm_rstd(ss, C, eps);
    EXPECT_NEAR(rs, rstd[r], tol * rstd[r]) << "row " << r;
    double scale = 0;
    for (int64_t c = 0; c < C; ++c) scale = std::max(scale, std::abs(static_cast<double>(y[r * C + c])));
    for (int64_t c = 0; c < C; ++c)
      ASSERT_NEAR(math::rmsnorm_out(w[c], xr[c], rs), y[r * C + c], tol * scale) << "y " << r << "," << c;
    const float dot = warp_row_sum(C, [&](int64_t c) { return math::rmsnorm_dot_term(w[c], dyr[c], xr[c], rs); });
    const float mean_dot = dot / static_cast<float>(C);
    scale = 0;
    for (int64_t c = 0; c < C; ++c) scale = std::max(scale, std::abs(static_cast<double>(dx[r * C + c])));
    for (int64_t c = 0; c < C; ++c)
      ASSERT_NEAR(math::rmsnorm_dx(w[c], dyr[c], xr[c], rs, mean_dot), dx[r * C + c], 4 * tol * scale)
          << "dx " << r << "," << c;
  }
}

// The loss and dlogits of one row from cross_entropy.cu's per-element functions, with the row's max
// and sum of exp taken in the CPU's order (the block reduces them in another: the max is exact, the
// sum differs by rounding, which the GPU tests bound), against the CPU unit on the same row: h = the
// raw logits, W = identity (V x V), so logits = h W^T and dh = dlogits W are exact copies and the
// unit's own row math is what is compared. cap > 0: Gemma 4's softcap first, and each dlogit times
// its derivative 1 - (capped / cap)^2. dlogits within rel_tol of the largest one (0: bitwise); the
// loss, the same row math on bitwise the same (capped) logits, bitwise.
void expect_cross_entropy_row_follows_cpu(const std::vector<float>& raw, int32_t target, double grad_scale, float cap,
                                          float rel_tol) {
  const int64_t V = static_cast<int64_t>(raw.size());
  std::vector<float> logits(raw);
  if (cap > 0)
    for (float& z : logits) z = math::softcap(z, cap);
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += static_cast<double>(expf(v - mx));
  const float factor = static_cast<float>(grad_scale / sum);
  std::vector<float> d(V);
  float dmax = 0;
  for (int64_t c = 0; c < V; ++c) {
    d[c] = math::cross_entropy_dlogit(logits[c], mx, factor, c == target, static_cast<float>(grad_scale));
    if (cap > 0) d[c] *= math::softcap_derivative(logits[c], cap);
    dmax = std::max(dmax, std::abs(d[c]));
  }
  const double loss = math::cross_entropy_row_loss(mx, sum, logits[target]);
  std::vector<float> eye(V * V, 0.0f), dh(V), dw(V * V, 0.0f);
  for (int64_t c = 0; c < V; ++c) eye[c * V + c] = 1.0f;
  AlignedBuffer ws(fused_cross_entropy_workspace_bytes<float>(1, V, V, 1, true));
  const LossResult cpu = fused_linear_cross_entropy<float>(raw.data(), eye.data(), &target, 1, V, V, 1, grad_scale,
                                                           dh.data(), dw.data(), ws.workspace(), cap);
  EXPECT_EQ(loss, cpu.loss_sum);
  for (int64_t c = 0; c < V; ++c) {
    if (rel_tol == 0) {
      ASSERT_EQ(d[c], dh[c]) << c;
    } else {
      ASSERT_NEAR(d[c], dh[c], rel_tol * dmax) << c;
    }
  }
}

TEST(DeviceMath, CrossEntropyRowFollowsTheCpuUnit) {
  expect_cross_entropy_row_follows_cpu(random_floats(1000, 8, -8, 8), 417, 1.0 / 7, 0.0f, 0.0f);
}

// Gemma 4's softcapped row. The CPU unit recovers the capped logit as log(e) + max from its stored
// exponentials, the kernel keeps it, so the derivative's factor differs by the rounding of that log
// (a few ulps of a value <= 1): 1e-6 relative to the largest |dlogit|. Raw logits far enough out for
// the cap to bend them.
TEST(DeviceMath, SoftcappedCrossEntropyRowFollowsTheCpuUnit) {
  expect_cross_entropy_row_follows_cpu(random_floats(1000, 9, -80, 80), 123, 1.0 / 5, 30.0f, 1e-6f);
}

TEST(DeviceMath, GegluIsTheCpuUnitBitwise) {
  expect_gated_activation_bitwise(geglu_forward<float>, geglu_backward<float>, math::geglu, math::geglu_grads, 6, 11);
}

// Column sums in row segments: every segment is visited exactly once for segment counts on both
// sides of the 65,535 grid limit (16.78M rows of q/k-norm gradient at 256 rows per segment: the
// Qwen3-32B long-context case that used to throw), and the workspace holds one partial row each.
TEST(DeviceMath, SegmentedColumnSumsCoverEverySegmentOnceBeyondTheGridLimit) {
  for (int64_t N : {int64_t{1}, int64_t{256}, int64_t{257}, int64_t{65535} * 256, int64_t{16777216},
                    int64_t{40000000}}) {
    const int64_t S = math::segment_count(N, kRmsnormRowsPerSegment);
    const unsigned grid_y = math::segment_grid_y(S);
    EXPECT_LE(grid_y, 65535u);
    std::vector<uint8_t> seen(static_cast<size_t>(S), 0);
    for (unsigned y = 0; y < grid_y; ++y)
      for (int64_t s = y; s < S; s += grid_y) ++seen[static_cast<size_t>(s)];
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](uint8_t v) { return v == 1; })) << "N " << N;
    EXPECT_EQ(rmsnorm_backward_workspace_bytes(N, 8), S * 8 * 4);
    // the last segment ends at N
    EXPECT_EQ(std::min(N, S * kRmsnormRowsPerSegment), N);
    EXPECT_GT(N, (S - 1) * kRmsnormRowsPerSegment);
  }
}

// Attention forward: the reference kernel's per-row recurrence (lanes over head dims, the warp's
// butterfly for each q.k, the natural-domain online softmax) and the tensor-core kernel's tile loop
// (64-key tiles up to the query's tile, the causal mask, the log2-domain step, probabilities
// rounded to bf16 for the P V product as in shared memory, the lse converted back), both emulated
// on the CPU with device_math.h's functions, against the CPU unit. Tolerances: the reference path
// sums in another order, T u relative (T = 150: 1e-5); the tensor-core path's bf16 probabilities
// move each output by at most 2^-9 of max |v| (4e-3 with margin), and its lse keeps fp32 sums (1e-5).
struct AttentionCase {
  int64_t B = 1, T = 150, H = 4, KV = 2, hd = 64;
};

void expect_attention_emulations_match_cpu(const AttentionCase& c) {
  const int64_t B = c.B, T = c.T, H = c.H, KV = c.KV, hd = c.hd, group = H / KV;
  const auto q = random_floats(B * T * H * hd, 31, -1, 1), k = random_floats(B * T * KV * hd, 32, -1, 1),
             v = random_floats(B * T * KV * hd, 33, -1, 1);
  std::vector<float> out(q.size()), lse(B * H * T);
  AttentionShape shape{B, T, H, KV, hd, 16, 1};
  AlignedBuffer ws(attention_forward_workspace_bytes<float>(shape));
  attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, ws.workspace());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, static_cast<double>(std::abs(x)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / group;
        const float* qr = q.data() + ((b * T + i) * H + h) * hd;
        auto key = [&](int64_t t) { return k.data() + ((b * T + t) * KV + g) * hd; };
        auto val = [&](int64_t t) { return v.data() + ((b * T + t) * KV + g) * hd; };
        const float* cpu_o = out.data() + ((b * T + i) * H + h) * hd;
        const float cpu_lse = lse[(b * H + h) * T + i];
        // the reference kernel
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::vector<float> acc(hd, 0.0f);
        for (int64_t t = 0; t <= i; ++t) {
          const float dot = warp_row_sum(hd, [&](int64_t d) { return qr[d] * key(t)[d]; });
          float corr, p;
          math::online_softmax_add(dot * scale, &m, &l, &corr, &p);
          for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * corr + p * val(t)[d];
        }
        ASSERT_NEAR(m + std::log(l), cpu_lse, 1e-5) << "reference lse " << i;
        for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(acc[d] / l, cpu_o[d], 1e-5) << "reference out " << i << "," << d;
        // the tensor-core kernel
        const float scale_log2 = scale * math::kLog2e;
        const int64_t i0 = i / kTile * kTile;
        m = -std::numeric_limits<float>::infinity(), l = 0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
          float s[kTile], tile_max = -std::numeric_limits<float>::infinity();
          for (int t = 0; t < kTile; ++t) {
            float dot = 0;
            if (j0 + t < T)
              for (int64_t d = 0; d < hd; ++d) dot += qr[d] * key(j0 + t)[d];
            s[t] = math::causal_visible(j0 + t, i, T) ? dot * scale_log2 : -std::numeric_limits<float>::infinity();
            tile_max = std::max(tile_max, s[t]);
          }
          const float corr = math::online_softmax_tile_log2(tile_max, &m);
          float sum = 0;
          for (int64_t d = 0; d < hd; ++d) acc[d] *= corr;
          for (int t = 0; t < kTile; ++t) {
            const float p = exp2f(s[t] - m);
            sum += p;
            const float p16 = bf16_to_float(float_to_bf16(p));
            if (p16 != 0.0f)
              for (int64_t d = 0; d < hd; ++d) acc[d] += p16 * val(j0 + t)[d];
          }
          l = l * corr + sum;
        }
        ASSERT_NEAR(math::lse_from_log2(m, l), cpu_lse, 1e-5) << "tensor-core lse " << i;
        for (int64_t d = 0; d < hd; ++d)
          ASSERT_NEAR(acc[d] / l, cpu_o[d], 4e-3 * vmax) << "tensor-core out " << i << "," << d;
      }
}

// A sliding window: the reference row recurrence over the keys window_visible admits, starting at
// the query tile's first key tile (window_first_key_tile), against the CPU unit with the same window
// and Gemma 4's scale 1. The skipped tiles hold no visible key for any row of the query tile. The
// tolerance of the reference forward above.
TEST(DeviceMath, SlidingWindowAttentionSkipsTilesAndFollowsTheCpuUnit) {
  const int64_t T = 300, H = 2, KV = 1, hd = 64, window = 70;
  const auto q = random_floats(T * H * hd, 61, -0.3f, 0.3f), k = random_floats(T * KV * hd, 62, -0.3f, 0.3f),
             v = random_floats(T * KV * hd, 63, -1, 1);
  std::vector<float> out(q.size()), lse(H * T);
  AttentionShape shape{1, T, H, KV, hd, 16, 1};
  shape.scale = 1.0;
  shape.window = window;
  AlignedBuffer ws(attention_forward_workspace_bytes<float>(shape));
  attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, ws.workspace());
  int64_t visited_tiles = 0, causal_tiles = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t i0 = i / kTile * kTile;
      float m = -std::numeric_limits<float>::infinity(), l = 0;
      std::vector<float> acc(hd, 0.0f);
      for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
        const bool skipped = j0 < math::window_first_key_tile(i0, window, kTile);
        for (int64_t t = j0; t < std::min(j0 + kTile, T); ++t) {
          if (!math::window_visible(t, i, T, window)) continue;
          ASSERT_FALSE(skipped) << "a skipped tile holds key " << t << " visible to row " << i;
          const float dot = warp_row_sum(hd, [&](int64_t d) { return q[(i * H + h) * hd + d] * k[t * hd + d]; });
          float corr, p;
          math::online_softmax_add(dot, &m, &l, &corr, &p);
          for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * corr + p * v[t * hd + d];
        }
        if (h == 0 && i == i0) ++causal_tiles, visited_tiles += skipped ? 0 : 1;
      }
      ASSERT_NEAR(m + std::log(l), lse[h * T + i], 1e-5) << i;
      for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(acc[d] / l, out[(i * H + h) * hd + d], 1e-5) << i << "," << d;
    }
  EXPECT_LT(visited_tiles, causal_tiles) << "the window skips tiles";
}

// The router kernel's top-k: K rounds of a warp argmax (each lane's best over its experts lane,
// lane + 32, ..., then the shuffle butterfly) with topk_before, against the CPU's serial scan, on
// rows with tied logits (a tie must go to the lower expert whatever lane holds it); then the weights
// and the backward through router_weight / router_dlogit against the CPU's. E = 128 (Gemma 4) and
// 5 (the tiny cards). Exact: the same comparisons on the same probabilities, the same double sums.
TEST(DeviceMath, RouterTopKWarpArgmaxPicksTheCpusExpertsAndItsGradients) {
  for (const auto& [E, K] : {std::pair<int64_t, int64_t>{128, 8}, std::pair<int64_t, int64_t>{5, 2}}) {
    const int64_t N = 9;
    std::vector<float> logits = random_floats(N * E, 90, -2, 2);
    for (int64_t t = 0; t < N; ++t)  // ties across lanes and within one lane's experts
      for (int64_t e = 0; e < E; e += 3) logits[t * E + e] = logits[t * E + (e * 7 + t) % E];
    std::vector<float> probs(N * E), w(N * K), dlogits(N * E);
    std::vector<int32_t> idx(N * K);
    kernels::router_topk_forward<float>(probs.data(), idx.data(), w.data(), logits.data(), N, E, K);
    const std::vector<float> dw = random_floats(N * K, 91);
    kernels::router_topk_backward<float>(dlogits.data(), dw.data(), probs.data(), idx.data(), N, E, K);
    for (int64_t t = 0; t < N; ++t) {
      const float* p = probs.data() + t * E;
      std::vector<bool> taken(static_cast<size_t>(E), false);
      std::vector<int32_t> chosen;
      double top = 0;
      for (int64_t k = 0; k < K; ++k) {
        float bp[32];
        int32_t be[32];
        for (int lane = 0; lane < 32; ++lane) {
          bp[lane] = -1.0f, be[lane] = -1;
          for (int64_t e = lane; e < E; e += 32)
            if (!taken[e] && (be[lane] < 0 || math::topk_before(p[e], static_cast<int32_t>(e), bp[lane], be[lane])))
              bp[lane] = p[e], be[lane] = static_cast<int32_t>(e);
        }
        for (int o = 16; o > 0; o >>= 1) {
          float np[32];
          int32_t ne[32];
          for (int lane = 0; lane < 32; ++lane) {
            const float op = bp[lane ^ o];
            const int32_t oe = be[lane ^ o];
            const bool other = oe >= 0 && (be[lane] < 0 || math::topk_before(op, oe, bp[lane], be[lane]));
            np[lane] = other ? op : bp[lane], ne[lane] = other ? oe : be[lane];
          }
          std::copy(np, np + 32, bp), std::copy(ne, ne + 32, be);
        }
        for (int lane = 1; lane < 32; ++lane) ASSERT_EQ(be[lane], be[0]) << "every lane agrees";
        chosen.push_back(be[0]);
        taken[static_cast<size_t>(be[0])] = true;
        top += bp[0];
      }
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(chosen[k], idx[t * K + k]) << "token " << t << " slot " << k;
        ASSERT_EQ(static_cast<float>(math::router_weight(p[chosen[k]], top)), w[t * K + k]);
      }
      double coupling = 0;
      for (int64_t k = 0; k < K; ++k) coupling += dw[t * K + k] * math::router_weight(p[chosen[k]], top);
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(static_cast<float>(math::router_dlogit(math::router_weight(p[chosen[k]], top), dw[t * K + k], coupling)),
                  dlogits[t * E + chosen[k]]);
    }
  }
}

// Packed documents under a sliding window (Gemma 4's sliding layers on packed data): the kernels'
// combined mask against its definition (causal, same document, fewer than `window` keys back), the
// dK/dV bound (no row past window_rows_end sees the key), and the reference row recurrence from
// key_floor against the CPU unit with the same positions and window. Tolerance of the reference
// forward above.
TEST(DeviceMath, DocumentsUnderAWindowMaskAsDefinedAndFollowTheCpuUnit) {
  const int64_t T = 200, H = 2, KV = 1, hd = 32, window = 50, split = 90;  // documents [0, 90) and [90, 200)
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t < split ? t : t - split);
  for (int64_t row = 0; row < T; ++row)
    for (int64_t key = 0; key < T; ++key) {
      const bool defined = key <= row && (key < split) == (row < split) && row - key < window;
      ASSERT_EQ(math::key_visible(key, row, T, pos.data(), window), defined) << key << " " << row;
      if (row >= math::window_rows_end(key, T, window)) {
        ASSERT_FALSE(math::key_visible(key, row, T, pos.data(), window)) << key << " " << row;
      }
    }
  const auto q = random_floats(T * H * hd, 71, -0.5f, 0.5f), k = random_floats(T * KV * hd, 72, -0.5f, 0.5f),
             v = random_floats(T * KV * hd, 73, -1, 1);
  std::vector<float> out(q.size()), lse(H * T);
  AttentionShape shape{1, T, H, KV, hd, 16, 1};
  shape.scale = 1.0;
  shape.window = window;
  shape.positions = pos.data();
  AlignedBuffer ws(attention_forward_workspace_bytes<float>(shape));
  attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, ws.workspace());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      float m = -std::numeric_limits<float>::infinity(), l = 0;
      std::vector<float> acc(hd, 0.0f);
      for (int64_t t = math::key_floor(i, pos.data(), T, window); t <= i; ++t) {
        const float dot = warp_row_sum(hd, [&](int64_t d) { return q[(i * H + h) * hd + d] * k[t * hd + d]; });
        float corr, p;
        math::online_softmax_add(dot, &m, &l, &corr, &p);
        for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * corr + p * v[t * hd + d];
      }
      ASSERT_NEAR(m + std::log(l), lse[h * T + i], 1e-5) << i;
      for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(acc[d] / l, out[(i * H + h) * hd + d], 1e-5) << i << "," << d;
    }
}

// Packed documents, the tensor-core forward's tile loop: from the key tile of the query tile's first
// row's document on, keys outside a row's document masked, weights through tile_weight_log2 and the
// running max through the guarded tile step, so a row that meets whole tiles of an earlier
// document first stays at -inf without a NaN; against the CPU unit with the same positions.
// Documents of 40, 70 and 40 tokens (one crosses a 64-key tile). Tolerance of the tensor-core
// emulation above.
TEST(DeviceMath, PackedDocumentsTensorCoreForwardFollowsTheCpuUnit) {
  const int64_t T = 150, H = 2, KV = 1, hd = 64;
  std::vector<int32_t> pos;
  for (int len : {40, 70, 40})
    for (int p = 0; p < len; ++p) pos.push_back(p);
  const auto q = random_floats(T * H * hd, 71, -1, 1), k = random_floats(T * KV * hd, 72, -1, 1),
             v = random_floats(T * KV * hd, 73, -1, 1);
  std::vector<float> out(q.size()), lse(H * T);
  AttentionShape shape{1, T, H, KV, hd, 16, 1};
  shape.positions = pos.data();
  AlignedBuffer ws(attention_forward_workspace_bytes<float>(shape));
  attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, ws.workspace());
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))) * math::kLog2e;
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, static_cast<double>(std::abs(x)));
  int64_t rows_meeting_masked_tiles = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t i0 = i / kTile * kTile;
      float m = -std::numeric_limits<float>::infinity(), l = 0;
      std::vector<float> acc(hd, 0.0f);
      bool met_masked_tile = false;
      for (int64_t j0 = math::document_key_floor(i0, pos.data(), T) / kTile * kTile; j0 <= i0; j0 += kTile) {
        float s[kTile], tile_max = -std::numeric_limits<float>::infinity();
        for (int t = 0; t < kTile; ++t) {
          float dot = 0;
          if (j0 + t < T)
            for (int64_t d = 0; d < hd; ++d) dot += q[(i * H + h) * hd + d] * k[(j0 + t) * hd + d];
          s[t] = math::document_visible(j0 + t, i, T, pos.data()) ? dot * scale_log2 : -std::numeric_limits<float>::infinity();
          tile_max = std::max(tile_max, s[t]);
        }
        if (tile_max == -std::numeric_limits<float>::infinity() && m == tile_max) met_masked_tile = true;
        const float corr = math::online_softmax_tile_log2(tile_max, &m);
        float sum = 0;
        for (int64_t d = 0; d < hd; ++d) acc[d] *= corr;
        for (int t = 0; t < kTile; ++t) {
          const float p = math::tile_weight_log2(s[t], m);
          sum += p;
          const float p16 = bf16_to_float(float_to_bf16(p));
          if (p16 != 0.0f)
            for (int64_t d = 0; d < hd; ++d) acc[d] += p16 * v[(j0 + t) * hd + d];
        }
        l = l * corr + sum;
      }
      rows_meeting_masked_tiles += met_masked_tile ? 1 : 0;
      ASSERT_NEAR(math::lse_from_log2(m, l), lse[h * T + i], 1e-5) << i;
      for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(acc[d] / l, out[(i * H + h) * hd + d], 4e-3 * vmax) << i << "," << d;
    }
  EXPECT_GT(rows_meeting_masked_tiles, 0) << "the case has rows that start on a tile of another document";
}

TEST(DeviceMath, AttentionForwardEmulationsFollowTheCpuUnit) {
  expect_attention_emulations_match_cpu({1, 150, 4, 2, 64});  // 150: the last tile is partial
  expect_attention_emulations_match_cpu({2, 70, 2, 1, 128});
}

// Attention backward: the reference kernels' rows (dq per query; dk, dv per key over the group's
// heads and the queries that see it), with D = rowsum(dO * O), the recomputed probability and dS
// from device_math.h and every dot product a warp's lane split and butterfly, against the CPU unit's
// backward. Then the tensor-core kernels' dS and P, rounded to bf16 before their products. Tolerance
// of the reference rows: the sums run in another order than the CPU's blocked ones, T terms of fp32
// rounding, 1e-5 relative to the sum of the terms' magnitudes; of the tensor-core dq, that plus the
// bf16 rounding of each dS (at most 2^-8 relative: 8 significant bits) in the same sum of magnitudes.
void expect_attention_backward_emulations_match_cpu(const AttentionCase& c) {
  const int64_t B = c.B, T = c.T, H = c.H, KV = c.KV, hd = c.hd, group = H / KV;
  const auto q = random_floats(B * T * H * hd, 41, -1, 1), k = random_floats(B * T * KV * hd, 42, -1, 1),
             v = random_floats(B * T * KV * hd, 43, -1, 1), dout = random_floats(B * T * H * hd, 44, -1, 1);
  std::vector<float> out(q.size()), lse(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
  AttentionShape shape{B, T, H, KV, hd, 16, 1};
  {
    AlignedBuffer ws(attention_forward_workspace_bytes<float>(shape));
    attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, ws.workspace());
  }
  AlignedBuffer ws(attention_backward_workspace_bytes<float>(shape));
  attention_backward<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                            lse.data(), shape, ws.workspace());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  auto at = [&](const std::vector<float>& x, int64_t b, int64_t t, int64_t heads, int64_t h) {
    return x.data() + ((b * T + t) * heads + h) * hd;
  };
  auto dot = [&](const float* a, const float* b) { return warp_row_sum(hd, [&](int64_t d) { return a[d] * b[d]; }); };
  for (int64_t b = 0; b < B; ++b) {
    // D per (h, i), as attention_d_kernel: a warp over the head dims.
    std::vector<float> D(static_cast<size_t>(H * T));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) D[h * T + i] = dot(at(dout, b, i, H, h), at(out, b, i, H, h));
    auto prob = [&](int64_t h, int64_t i, int64_t t, float* ds) {
      const int64_t g = h / group;
      const float p = math::attention_prob(dot(at(q, b, i, H, h), at(k, b, t, KV, g)), scale, lse[(b * H + h) * T + i]);
      *ds = math::attention_ds(p, dot(at(dout, b, i, H, h), at(v, b, t, KV, g)), D[h * T + i]);
      return p;
    };
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / group;
        std::vector<float> acc(hd, 0.0f), mag(hd, 0.0f), tc(hd, 0.0f);
        for (int64_t t = 0; t <= i; ++t) {
          float ds;
          prob(h, i, t, &ds);
          const float ds16 = bf16_to_float(float_to_bf16(ds));  // the tensor-core kernel's sdS
          for (int64_t d = 0; d < hd; ++d) {
            acc[d] += ds * at(k, b, t, KV, g)[d];
            tc[d] += ds16 * at(k, b, t, KV, g)[d];
            mag[d] += std::abs(ds * at(k, b, t, KV, g)[d]);
          }
        }
        const float* cpu = at(dq, b, i, H, h);
        for (int64_t d = 0; d < hd; ++d) {
          ASSERT_NEAR(acc[d] * scale, cpu[d], 1e-5f * scale * mag[d] + 1e-7f) << "reference dq " << h << "," << i << "," << d;
          ASSERT_NEAR(tc[d] * scale, cpu[d], (1e-5f + 0x1p-8f) * scale * mag[d] + 1e-7f) << "tensor-core dq " << i << "," << d;
        }
      }
    for (int64_t g = 0; g < KV; ++g)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> dk_acc(hd, 0.0f), dv_acc(hd, 0.0f), dk_mag(hd, 0.0f), dv_mag(hd, 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          for (int64_t i = t; i < T; ++i) {
            float ds;
            const float p = prob(h, i, t, &ds);
            for (int64_t d = 0; d < hd; ++d) {
              dv_acc[d] += p * at(dout, b, i, H, h)[d];
              dk_acc[d] += ds * at(q, b, i, H, h)[d];
              dv_mag[d] += std::abs(p * at(dout, b, i, H, h)[d]);
              dk_mag[d] += std::abs(ds * at(q, b, i, H, h)[d]);
            }
          }
        for (int64_t d = 0; d < hd; ++d) {
          ASSERT_NEAR(dk_acc[d] * scale, at(dk, b, t, KV, g)[d], 1e-5f * scale * dk_mag[d] + 1e-7f) << "dk " << t << "," << d;
          ASSERT_NEAR(dv_acc[d], at(dv, b, t, KV, g)[d], 1e-5f * dv_mag[d] + 1e-7f) << "dv " << t << "," << d;
        }
      }
  }
}

TEST(DeviceMath, AttentionBackwardEmulationsFollowTheCpuUnit) {
  expect_attention_backward_emulations_match_cpu({1, 150, 4, 2, 64});
  expect_attention_backward_emulations_match_cpu({2, 70, 2, 1, 128});
}

// The embedding backward's scatter order: sort keys, a stable sort (CUB's radix sort is stable),
// runs of one token each added in position order; bitwise the CPU unit's loop over positions
// (fp32, the same additions in the same order). Invalid ids sort last and are never added (the
// CPU unit refuses them, so its reference gets the valid positions only, in order).
// The grouped expert GEMM's schedule (grouped_gemm.cu): every grid tile below the total maps to an
// expert with rows, the tiles of each expert cover its rows exactly once (64 at a time, the last one
// partial), tiles past the total map to none, and the host's launch bound (rows / 64 + E) is never
// short. Counts with empty experts first, last and in runs, and experts of exactly one tile.
TEST(DeviceMath, GroupedGemmTilesCoverEachExpertsRowsOnceWithinTheLaunchBound) {
  constexpr int64_t kRows = 64;
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t E = 1 + static_cast<int32_t>(rng() % 40);
    std::vector<int64_t> counts(static_cast<size_t>(E));
    for (int64_t& c : counts) {
      const uint64_t kind = rng() % 4;
      c = kind == 0 ? 0 : kind == 1 ? kRows * static_cast<int64_t>(1 + rng() % 3) : static_cast<int64_t>(rng() % 300);
    }
    if (trial == 0) counts.front() = counts.back() = 0;
    std::vector<int64_t> offsets(static_cast<size_t>(E) + 1, 0);
    std::vector<int32_t> tiles(static_cast<size_t>(E) + 1, 0);
    for (int32_t e = 0; e < E; ++e) {
      offsets[e + 1] = offsets[e] + counts[e];
      tiles[e + 1] = tiles[e] + static_cast<int32_t>(math::grouped_tiles(counts[e], kRows));
    }
    const int64_t rows = offsets[E], bound = math::grouped_tiles(rows, kRows) + E;
    ASSERT_LE(tiles[E], bound) << "trial " << trial;
    std::vector<int> covered(static_cast<size_t>(rows), 0);
    for (int64_t tile = 0; tile < bound; ++tile) {
      const int32_t e = math::tile_expert(tiles.data(), E, tile);
      if (tile >= tiles[E]) {
        ASSERT_EQ(e, -1) << "trial " << trial << " tile " << tile;
        continue;
      }
      ASSERT_GE(e, 0);
      ASSERT_GT(counts[e], 0) << "a tile of an expert without rows";
      const int64_t first = offsets[e] + (tile - tiles[e]) * kRows;
      ASSERT_LT(first, offsets[e + 1]);
      for (int64_t r = first; r < std::min(first + kRows, offsets[e + 1]); ++r) ++covered[static_cast<size_t>(r)];
    }
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(covered[static_cast<size_t>(r)], 1) << "trial " << trial << " row " << r;
  }
}

// ---- gated delta rule: the GPU's column recurrence against the CPU's chunked form ----

struct DeltaRuleData {
  std::vector<double> q, k, v, g, b;
};

// The kernel's loops on the CPU (kernels/cuda/gated_delta_rule.cu): per segment and value head, a
// column per "thread" through the tokens in order; backward in reverse from every token's state
// before it, row and column phases as the kernel runs them, each value head's dq / dk summed over the
// heads sharing a key head in head order.
DeltaRuleData emulate_delta_rule(const DeltaRuleSpec& sp, const std::vector<int64_t>& seg, const DeltaRuleData& in,
                                 const std::vector<double>& dO, std::vector<double>* o) {
  const int64_t N = seg.back(), dk = sp.dk, dv = sp.dv, nv = sp.nv, group = sp.nv / sp.nk;
  DeltaRuleData d;
  d.q.assign(static_cast<size_t>(N * sp.nk * dk), 0.0), d.k = d.q;
  d.v.assign(in.v.size(), 0.0), d.g.assign(in.g.size(), 0.0), d.b.assign(in.b.size(), 0.0);
  o->assign(static_cast<size_t>(N * nv * dv), 0.0);
  for (size_t si = 0; si + 1 < seg.size(); ++si)
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t kh = h / group;
      std::vector<double> S(static_cast<size_t>(dk * dv), 0.0), dS = S;
      std::vector<std::vector<double>> before;
      auto at = [&](int64_t t) {
        return std::tuple{&in.k[static_cast<size_t>((t * sp.nk + kh) * dk)], &in.q[static_cast<size_t>((t * sp.nk + kh) * dk)],
                          std::exp(in.g[static_cast<size_t>(t * nv + h)]), in.b[static_cast<size_t>(t * nv + h)],
                          static_cast<size_t>((t * nv + h) * dv)};
      };
      for (int64_t t = seg[si]; t < seg[si + 1]; ++t) {
        before.push_back(S);
        const auto [k, q, a, b, vo] = at(t);
        for (int64_t j = 0; j < dv; ++j)
          (*o)[vo + j] = math::delta_column_forward(&S[static_cast<size_t>(j)], dv, dk, k, q, a, b, in.v[vo + j]);
      }
      for (int64_t t = seg[si + 1] - 1; t >= seg[si]; --t) {
        const std::vector<double>& P = before[static_cast<size_t>(t - seg[si])];
        const auto [k, q, a, b, vo] = at(t);
        const double* dout = &dO[vo];
        std::vector<math::DeltaColumnGrad<double>> cols(static_cast<size_t>(dv));
        for (int64_t j = 0; j < dv; ++j)
          cols[j] = math::delta_column_grad(&P[static_cast<size_t>(j)], &dS[static_cast<size_t>(j)], dv, dk, k, q, a, b,
                                            in.v[vo + j], dout[j]);
        for (int64_t i = 0; i < dk; ++i) {
          double dq_i, dk_i;
          math::delta_row_grads(&P[static_cast<size_t>(i * dv)], &dS[static_cast<size_t>(i * dv)], dv, k[i], q[i], a, b,
                                dout, cols.data(), &dq_i, &dk_i);
          d.q[static_cast<size_t>((t * sp.nk + kh) * dk + i)] += dq_i;
          d.k[static_cast<size_t>((t * sp.nk + kh) * dk + i)] += dk_i;
        }
        double da = 0, db = 0;
        for (int64_t j = 0; j < dv; ++j) {
          da += math::delta_column_step_back(&P[static_cast<size_t>(j)], &dS[static_cast<size_t>(j)], dv, dk, k, q, a, b,
                                             dout[j], cols[j]);
          db += (in.v[vo + j] - a * cols[j].ks) * cols[j].ddelta;
          d.v[vo + j] = b * cols[j].ddelta;
        }
        d.g[static_cast<size_t>(t * nv + h)] = da * a;
        d.b[static_cast<size_t>(t * nv + h)] = db;
      }
    }
  return d;
}

// Both directions against the CPU's chunked delta rule in fp64 (a different algorithm: chunk
// matrices, triangular solves), so agreement to 1e-10 says the per-column formulas are its math.
// Segments of 9, 0 and 14 rows, a chunk of 4 that ends inside them, strong decay on some tokens.
TEST(DeviceMath, DeltaRuleColumnRecurrenceFollowsTheCpuChunkedForm) {
  const DeltaRuleSpec sp{2, 4, 5, 3, 4, 1};
  const std::vector<int64_t> seg = {0, 9, 9, 23};
  const int64_t N = seg.back();
  DeltaRuleData in;
  in.q = unit_rows(random_vector<double>(N * sp.nk * sp.dk, 801), sp.dk, 1.0 / std::sqrt(5.0));
  in.k = unit_rows(random_vector<double>(N * sp.nk * sp.dk, 802), sp.dk, 1.0);
  in.v = random_vector<double>(N * sp.nv * sp.dv, 803, -2, 2);
  in.g = random_vector<double>(N * sp.nv, 804, -1.5, 0);
  in.g[5] = -30;  // a nearly forgetting token
  in.b = random_vector<double>(N * sp.nv, 805, 0.05, 0.95);
  const std::vector<double> dO = random_vector<double>(N * sp.nv * sp.dv, 806);

  const DeltaRuleSegments segs{seg.data(), static_cast<int64_t>(seg.size()) - 1};
  std::vector<double> o_ref(dO.size());
  AlignedBuffer fws(delta_rule_forward_workspace_bytes<double>(sp, extent_of(segs)));
  delta_rule_forward<double>(sp, segs, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.b.data(), o_ref.data(),
                             fws.workspace());
  DeltaRuleData ref;
  ref.q.resize(in.q.size()), ref.k.resize(in.k.size()), ref.v.resize(in.v.size()), ref.g.resize(in.g.size()),
      ref.b.resize(in.b.size());
  AlignedBuffer bws(delta_rule_backward_workspace_bytes<double>(sp, extent_of(segs)));
  delta_rule_backward<double>(sp, segs, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.b.data(), dO.data(),
                              ref.q.data(), ref.k.data(), ref.v.data(), ref.g.data(), ref.b.data(), bws.workspace());
  std::vector<double> o;
  const DeltaRuleData got = emulate_delta_rule(sp, seg, in, dO, &o);
  EXPECT_TRUE(all_close(o, o_ref, 1e-10, 1e-9, "o"));
  EXPECT_TRUE(all_close(got.q, ref.q, 1e-10, 1e-9, "dq"));
  EXPECT_TRUE(all_close(got.k, ref.k, 1e-10, 1e-9, "dk"));
  EXPECT_TRUE(all_close(got.v, ref.v, 1e-10, 1e-9, "dv"));
  EXPECT_TRUE(all_close(got.g, ref.g, 1e-10, 1e-9, "dg"));
  EXPECT_TRUE(all_close(got.b, ref.b, 1e-10, 1e-9, "db"));
}

TEST(DeviceMath, EmbeddingScatterOrderIsTheCpuUnitsBitwise) {
  const int64_t N = 517, C = 40, V = 23;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int32_t> id(-2, static_cast<int32_t>(V) + 1);  // some invalid ids
  std::vector<int32_t> tokens(N);
  for (auto& t : tokens) t = id(rng);
  const auto dx = random_floats(N * C, 51), dw0 = random_floats(V * C, 52);
  std::vector<int32_t> keys(N), positions(N);
  for (int64_t n = 0; n < N; ++n) keys[n] = math::embedding_sort_key(tokens[n], V), positions[n] = static_cast<int32_t>(n);
  std::stable_sort(positions.begin(), positions.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
  std::vector<int32_t> sorted(N);
  for (int64_t i = 0; i < N; ++i) sorted[i] = keys[positions[i]];
  std::vector<float> dw = dw0;
  int64_t runs = 0, added = 0;
  for (int64_t i = 0; i < N; ++i) {  // one block per sorted index, as embedding_accumulate_kernel
    if (!math::embedding_run_starts(sorted.data(), i, V)) continue;
    const int64_t end = math::embedding_run_end(sorted.data(), i, N);
    ++runs, added += end - i;
    for (int64_t c = 0; c < C; ++c) {
      float acc = dw[sorted[i] * C + c];
      for (int64_t j = i; j < end; ++j) acc += dx[positions[j] * C + c];
      dw[sorted[i] * C + c] = acc;
    }
  }
  std::vector<int32_t> valid_tokens;
  std::vector<float> valid_dx;
  for (int64_t n = 0; n < N; ++n)
    if (tokens[n] >= 0 && tokens[n] < V) {
      valid_tokens.push_back(tokens[n]);
      valid_dx.insert(valid_dx.end(), dx.begin() + n * C, dx.begin() + (n + 1) * C);
    }
  std::vector<float> cpu = dw0;
  embedding_backward<float>(cpu.data(), valid_tokens.data(), valid_dx.data(), static_cast<int64_t>(valid_tokens.size()), C, V);
  EXPECT_EQ(added, static_cast<int64_t>(valid_tokens.size()));
  EXPECT_LE(runs, V);
  EXPECT_LT(added, N) << "the case has invalid ids";
  EXPECT_EQ(0, std::memcmp(dw.data(), cpu.data(), dw.size() * sizeof(float)));
}

// Shared memory per block of the tensor-core kernels against each generation's opt-in limit (the
// static_asserts in attention_tiles.h hold the same at compile time): head_dim 64 fits Ada, 128
// needs Ampere or Hopper, which is where attention.cu sends each case.
TEST(DeviceMath, TensorCoreTilesFitTheSharedMemoryTheDispatchAssumes) {
  EXPECT_LE(TcDims<64>::kFwdBytes, kSharedOptinAda);
  EXPECT_LE(tc_backward_bytes<64>(), kSharedOptinAda);
  EXPECT_GT(TcDims<128>::kFwdBytes, kSharedOptinAda);  // Ada takes the reference path at 128
  EXPECT_LE(tc_backward_bytes<128>(), kSharedOptinAmpere);
  EXPECT_LE(tc_backward_bytes<128>(), kSharedOptinHopper);
  EXPECT_EQ(TcDims<64>::kFwdBytes % 128, 0);
}


// The profiler's GEMM operands (cuda-review D10): splitmix64 is the published generator (its first
// outputs from state 0, Steele, Lea and Flood 2014 / Vigna's splitmix64.c: splitmix64(x) here is the
// output after the state advanced to x + golden), and the values cover [lo, hi) evenly: over 2^16
// indices the mean is within 4 standard errors of the middle ((hi-lo)/sqrt(12 n) = 0.0023 for [-1, 1))
// and fewer than 1% of them round to zero in bf16 (a zero-filled operand would be 100%).
TEST(DeviceMath, UniformFillIsSplitMix64SpreadOverTheRange) {
  EXPECT_EQ(math::splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(math::splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(math::splitmix64(2 * 0x9E3779B97F4A7C15ull), 0x06C45D188009454Full);
  const int64_t n = int64_t{1} << 16;
  double sum = 0;
  int64_t zeros = 0;
  float lo_seen = 1, hi_seen = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = math::uniform_at(7, i, -1.0f, 1.0f);
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    sum += v;
    zeros += round_to_bf16(v) == 0.0f;
    lo_seen = std::min(lo_seen, v), hi_seen = std::max(hi_seen, v);
  }
  EXPECT_NEAR(sum / n, 0.0, 4 * 2.0 / std::sqrt(12.0 * n));
  EXPECT_LT(zeros, n / 100);
  EXPECT_LT(lo_seen, -0.99f);
  EXPECT_GT(hi_seen, 0.99f);
  EXPECT_NE(math::uniform_at(7, 0, -1.0f, 1.0f), math::uniform_at(8, 0, -1.0f, 1.0f)) << "the seed must matter";
}

}  // namespace
}  // namespace slidedp::kernels::cuda
