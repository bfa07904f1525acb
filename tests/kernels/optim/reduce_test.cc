// N-way gradient reduction: fixed slot order, in-place accumulation over micro-batches, the fused
// reduce + AdamW equal bit for bit to reduce-then-update, and the reduced sum of squares equal bit for
// bit to sum_squares of the reduced buffer, at every SIMD level.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using ReduceTest = LevelTest;

template <class T>
std::vector<std::vector<T>> make_slots(int num, int64_t n, uint32_t seed) {
  std::vector<std::vector<T>> s;
  for (int k = 0; k < num; ++k) {
    if constexpr (std::is_same_v<T, float>) {
      s.push_back(random_floats(n, seed + static_cast<uint32_t>(k), -1.0f, 1.0f));
    } else {
      s.push_back(random_bf16(n, seed + static_cast<uint32_t>(k), -1.0f, 1.0f));
    }
  }
  return s;
}

template <class T>
std::vector<const T*> pointers(const std::vector<std::vector<T>>& s) {
  std::vector<const T*> p;
  for (const auto& v : s) p.push_back(v.data());
  return p;
}

// Fused == reduce_grads then adamw_update, for 1, 2 and 4 slots, with and without an accumulator.
template <class T>
void check_fused(const LevelCase& level) {
  const int64_t n = 1003, begin = 5, end = 1001;
  use_level(level);
  for (int num : {1, 2, 4}) {
    for (bool with_accum : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "slots=" << num << " accum=" << with_accum);
      const auto slots = make_slots<T>(num, n, 40);
      const auto ptrs = pointers(slots);
      const std::vector<float> accum = random_floats(n, 41, -2.0f, 2.0f);
      const GradSlots<T> gs{ptrs, 0.3f, with_accum ? accum.data() : nullptr};
      AdamwHyper h;
      h.lr = 3e-3;
      h.step = 7;
      h.grad_scale = 0.5;
      h.clip_coef = 0.8;

      const std::vector<float> p0 = random_floats(n, 42, -1, 1), m0 = random_floats(n, 43, -0.1f, 0.1f),
                               v0 = random_floats(n, 44, 0.0f, 0.01f);
      std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
      std::vector<bf16_bits> mir1(static_cast<size_t>(n), 0), mir2(static_cast<size_t>(n), 0);
      std::vector<float> reduced(static_cast<size_t>(n), 0.0f);

      reduce_grads(gs, reduced.data(), begin, end);
      adamw_update(AdamwState{p1.data(), m1.data(), v1.data(), mir1.data()}, reduced.data(), h, begin, end);
      reduce_adamw_update(AdamwState{p2.data(), m2.data(), v2.data(), mir2.data()}, gs, h, begin, end);

      EXPECT_TRUE(same_bits(p2.data(), p1.data(), n));
      EXPECT_TRUE(same_bits(m2.data(), m1.data(), n));
      EXPECT_TRUE(same_bits(v2.data(), v1.data(), n));
      EXPECT_TRUE(same_bits(mir2.data(), mir1.data(), n));
    }
  }
}

TEST_P(ReduceTest, FusedEqualsReduceThenUpdateFp32Slots) { check_fused<float>(GetParam()); }
TEST_P(ReduceTest, FusedEqualsReduceThenUpdateBf16Slots) { check_fused<bf16_bits>(GetParam()); }

// The sum runs in slot order in fp32: with 1e8, 1, -1e8 the order decides the answer (1e8 + 1 rounds
// back to 1e8), so this pins the order down rather than just the value.
TEST_P(ReduceTest, SlotOrderIsFixed) {
  const int64_t n = 19;
  std::vector<float> a(static_cast<size_t>(n), 1e8f), b(static_cast<size_t>(n), 1.0f),
      c(static_cast<size_t>(n), -1e8f), out(static_cast<size_t>(n), -7.0f);
  use_level(GetParam());
  std::vector<const float*> abc = {a.data(), b.data(), c.data()};
  reduce_grads(GradSlots<float>{abc, 1.0f, nullptr}, out.data(), 0, n);
  for (float x : out) EXPECT_EQ(x, 0.0f);  // (1e8 + 1) - 1e8 = 0 in fp32
  std::vector<const float*> acb = {a.data(), c.data(), b.data()};
  reduce_grads(GradSlots<float>{acb, 1.0f, nullptr}, out.data(), 0, n);
  for (float x : out) EXPECT_EQ(x, 1.0f);  // (1e8 - 1e8) + 1 = 1
}

// Gradient accumulation over 3 micro-batches: in-place accumulate equals the accum form of
// reduce_grads bit for bit, and the total is the double-precision sum within fp32 rounding (a few
// roundings of values of magnitude <= 4 * 3 slots: 1e-6 absolute is ~8 ulp of the largest partial).
TEST_P(ReduceTest, AccumulateOverMicroBatches) {
  const int64_t n = 1003;
  use_level(GetParam());
  std::vector<float> acc(static_cast<size_t>(n), 0.0f), acc2(static_cast<size_t>(n), 0.0f);
  std::vector<double> want(static_cast<size_t>(n), 0.0);
  for (int mb = 0; mb < 3; ++mb) {
    const auto slots = make_slots<bf16_bits>(3, n, 60 + static_cast<uint32_t>(10 * mb));
    const auto ptrs = pointers(slots);
    reduce_grads_accumulate(ptrs, 1.0f, acc.data(), 0, n);
    std::vector<float> next(static_cast<size_t>(n));
    reduce_grads(GradSlots<bf16_bits>{ptrs, 1.0f, acc2.data()}, next.data(), 0, n);
    acc2 = next;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      for (const auto& s : slots) want[i] += bf16_to_float(s[i]);
    }
  }
  EXPECT_TRUE(same_bits(acc.data(), acc2.data(), n));
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) EXPECT_NEAR(acc[i], want[i], 1e-6) << i;
}

// reduce_grads_sum_squares == sum_squares(reduce_grads(...)) bitwise, across several blocks and
// from a non-zero begin (blocks count from begin).
TEST_P(ReduceTest, ReducedSumSquaresEqualsSumSquaresOfReduced) {
  const int64_t begin = 3, n = 2 * kSumSquaresBlock + 1003;
  use_level(GetParam());
  const auto slots = make_slots<bf16_bits>(2, n, 80);
  const auto ptrs = pointers(slots);
  const std::vector<float> accum = random_floats(n, 81, -1.0f, 1.0f);
  for (bool with_accum : {false, true}) {
    const GradSlots<bf16_bits> gs{ptrs, 0.7f, with_accum ? accum.data() : nullptr};
    std::vector<float> reduced(static_cast<size_t>(n));
    reduce_grads(gs, reduced.data(), begin, n);
    EXPECT_EQ(reduce_grads_sum_squares(gs, begin, n), sum_squares(reduced.data() + begin, n - begin));
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, ReduceTest, ::testing::ValuesIn(simd_cases()), level_name);

}  // namespace
}  // namespace slidedp::kernels::testing
