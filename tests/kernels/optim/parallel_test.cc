// The parallel forms give the same bits as the range forms for any pool size and tile size, and the
// sum of squares follows its documented order (checked against an independent double loop).
#include <gtest/gtest.h>

#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

// Three and a bit sum-of-squares blocks, so block order matters; still fast (about 0.1 M elements).
constexpr int64_t kN = 3 * kSumSquaresBlock + 777;

struct Outputs {
  std::vector<float> p, m, v, fused_p, reduced;
  std::vector<bf16_bits> mirror, fused_mirror, converted;
  double sq = 0, sq_bf16 = 0, reduced_sq = 0;
};

// Runs every kernel over [0, kN) on `pool` (or on the calling thread when pool is null).
Outputs run_all(ThreadPool* pool, int64_t tile) {
  Outputs o;
  const std::vector<float> g = random_floats(kN, 1, -1, 1);
  const std::vector<bf16_bits> g16 = random_bf16(kN, 2, -1, 1), g16b = random_bf16(kN, 3, -1, 1);
  o.p = random_floats(kN, 4, -1, 1);
  o.m = random_floats(kN, 5, -0.1f, 0.1f);
  o.v = random_floats(kN, 6, 0, 0.01f);
  o.fused_p = o.p;
  std::vector<float> fm = o.m, fv = o.v;
  o.mirror.assign(static_cast<size_t>(kN), 0);
  o.fused_mirror.assign(static_cast<size_t>(kN), 0);
  o.converted.assign(static_cast<size_t>(kN), 0);
  o.reduced.assign(static_cast<size_t>(kN), 0.0f);
  const std::vector<const bf16_bits*> slots = {g16.data(), g16b.data()};
  const GradSlots<bf16_bits> gs{slots, 0.5f, nullptr};
  AdamwHyper h;
  h.step = 4;
  const AdamwState st{o.p.data(), o.m.data(), o.v.data(), o.mirror.data()};
  const AdamwState fst{o.fused_p.data(), fm.data(), fv.data(), o.fused_mirror.data()};
  if (pool) {
    adamw_update(*pool, st, g16.data(), h, 0, kN, tile);
    reduce_adamw_update(*pool, fst, gs, h, 0, kN, tile);
    reduce_grads(*pool, gs, o.reduced.data(), 0, kN, tile);
    f32_to_bf16(*pool, g.data(), o.converted.data(), kN, tile);
    o.sq = sum_squares(*pool, g.data(), kN);
    o.sq_bf16 = sum_squares(*pool, g16.data(), kN);
    o.reduced_sq = reduce_grads_sum_squares(*pool, gs, 0, kN);
  } else {
    adamw_update(st, g16.data(), h, 0, kN);
    reduce_adamw_update(fst, gs, h, 0, kN);
    reduce_grads(gs, o.reduced.data(), 0, kN);
    f32_to_bf16(g.data(), o.converted.data(), kN);
    o.sq = sum_squares(g.data(), kN);
    o.sq_bf16 = sum_squares(g16.data(), kN);
    o.reduced_sq = reduce_grads_sum_squares(gs, 0, kN);
  }
  return o;
}

TEST(OptimParallel, ResultsIndependentOfThreadCountAndTiling) {
  const Outputs ref = run_all(nullptr, kTileNumel);
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t tile : {kTileNumel, int64_t{1000}, int64_t{17}}) {
      SCOPED_TRACE(::testing::Message() << "threads=" << threads << " tile=" << tile);
      const Outputs o = run_all(&pool, tile);
      EXPECT_TRUE(same_bits(o.p.data(), ref.p.data(), kN));
      EXPECT_TRUE(same_bits(o.m.data(), ref.m.data(), kN));
      EXPECT_TRUE(same_bits(o.v.data(), ref.v.data(), kN));
      EXPECT_TRUE(same_bits(o.mirror.data(), ref.mirror.data(), kN));
      EXPECT_TRUE(same_bits(o.fused_p.data(), ref.fused_p.data(), kN));
      EXPECT_TRUE(same_bits(o.fused_mirror.data(), ref.fused_mirror.data(), kN));
      EXPECT_TRUE(same_bits(o.reduced.data(), ref.reduced.data(), kN));
      EXPECT_TRUE(same_bits(o.converted.data(), ref.converted.data(), kN));
      EXPECT_EQ(o.sq, ref.sq);
      EXPECT_EQ(o.sq_bf16, ref.sq_bf16);
      EXPECT_EQ(o.reduced_sq, ref.reduced_sq);
    }
  }
}

// The documented order of sum_squares.h, written out independently with plain doubles.
TEST(OptimParallel, SumSquaresFollowsDocumentedOrder) {
  const std::vector<float> x = random_floats(kN, 9, -3, 3);
  double total = 0.0;
  for (int64_t b = 0; b < kN; b += kSumSquaresBlock) {
    double lanes[16] = {};
    for (int64_t j = 0; b + j < kN && j < kSumSquaresBlock; ++j) {
      const double xi = x[static_cast<size_t>(b + j)];
      lanes[j % 16] += xi * xi;
    }
    for (int w = 8; w >= 1; w /= 2) {
      for (int i = 0; i < w; ++i) lanes[i] += lanes[i + w];
    }
    total += lanes[0];
  }
  for (const LevelCase& level : simd_cases()) {
    if (!unavailable_reason(level).empty()) continue;  // the level tests report the skip
    use_level(level);
    ThreadPool pool(3);
    EXPECT_EQ(sum_squares(x.data(), kN), total) << level.name;
    EXPECT_EQ(sum_squares(pool, x.data(), kN), total) << level.name;
  }
  set_simd_level(best_simd_level());
}

}  // namespace
}  // namespace slidedp::kernels::testing
