// Every kernel at every SIMD level against the scalar reference, bit for bit, on sizes around the
// vector widths (0, 1, 7, 15, 16, 17, 1003), on element-misaligned pointers, with guard bytes around
// every buffer. Bitwise, not a tolerance: all levels run the same correctly rounded fp32 operations
// in the same order (kernels/cpu/optim/simd_impl.h), so any difference is a bug. Inputs are finite;
// NaN propagation is tested separately (which NaN payload wins may differ between instruction forms).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cpu/optim/sum_squares.h"
#include "kernels/cpu/optim/triad.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using SimdLevelsTest = LevelTest;

AdamwHyper test_hyper() {
  AdamwHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.step = 3;
  h.grad_scale = 0.25;
  h.clip_coef = 0.7;
  return h;
}

// One set of AdamW buffers (state + mirror), filled from the same seeds each time.
struct AdamwBuffers {
  GuardedBuffer<float> p, m, v;
  GuardedBuffer<bf16_bits> mirror;
  AdamwBuffers(int64_t n, int mis) : p(n, mis), m(n, mis), v(n, mis), mirror(n, mis) {
    p.assign(random_floats(n, 11, -1.0f, 1.0f));
    m.assign(random_floats(n, 12, -0.1f, 0.1f));
    v.assign(random_floats(n, 13, 0.0f, 0.01f));
  }
  AdamwState state(bool with_mirror) {
    return {p.data(), m.data(), v.data(), with_mirror ? mirror.data() : nullptr};
  }
  void expect_same(const AdamwBuffers& o, bool with_mirror) const {
    const int64_t n = p.size();
    EXPECT_TRUE(same_bits(p.data(), o.p.data(), n)) << "param";
    EXPECT_TRUE(same_bits(m.data(), o.m.data(), n)) << "exp_avg";
    EXPECT_TRUE(same_bits(v.data(), o.v.data(), n)) << "exp_avg_sq";
    if (with_mirror) {
      EXPECT_TRUE(same_bits(mirror.data(), o.mirror.data(), n)) << "mirror";
    }
    EXPECT_TRUE(p.guards_intact() && m.guards_intact() && v.guards_intact() && mirror.guards_intact());
  }
};

// The range [begin, n) the kernels update: starting past 0 when possible, to check that elements
// before `begin` are left alone.
int64_t first_index(int64_t n) { return n > 2 ? 2 : 0; }

template <class G>
std::vector<G> random_grad(int64_t n, uint32_t seed) {
  if constexpr (std::is_same_v<G, float>) {
    return random_floats(n, seed, -2.0f, 2.0f);
  } else {
    return random_bf16(n, seed, -2.0f, 2.0f);
  }
}

template <class G>
void check_adamw(const LevelCase& level, int64_t n, int mis, bool with_mirror) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis << " mirror=" << with_mirror);
  GuardedBuffer<G> grad(n, mis);
  grad.assign(random_grad<G>(n, 14));
  const int64_t begin = first_index(n);
  AdamwBuffers ref(n, mis), got(n, mis), untouched(n, mis);
  use_scalar();
  adamw_update(ref.state(with_mirror), grad.data(), test_hyper(), begin, n);
  use_level(level);
  adamw_update(got.state(with_mirror), grad.data(), test_hyper(), begin, n);
  got.expect_same(ref, with_mirror);
  EXPECT_TRUE(same_bits(got.p.data(), untouched.p.data(), begin)) << "elements before begin changed";
  EXPECT_TRUE(grad.guards_intact());
}

TEST_P(SimdLevelsTest, AdamwMatchesScalar) {
  for (int64_t n : odd_sizes()) {
    for (int mis : {0, 1}) {
      for (bool mirror : {true, false}) {
        check_adamw<float>(GetParam(), n, mis, mirror);
        check_adamw<bf16_bits>(GetParam(), n, mis, mirror);
      }
    }
  }
}

// N slot buffers of one dtype plus an optional fp32 accumulator.
template <class T>
struct Slots {
  std::vector<std::unique_ptr<GuardedBuffer<T>>> buf;
  std::vector<const T*> ptr;
  GuardedBuffer<float> accum;
  Slots(int num, int64_t n, int mis) : accum(n, mis) {
    for (int k = 0; k < num; ++k) {
      buf.push_back(std::make_unique<GuardedBuffer<T>>(n, mis));
      buf.back()->assign(random_grad<T>(n, 100 + static_cast<uint32_t>(k)));
      ptr.push_back(buf.back()->data());
    }
    accum.assign(random_floats(n, 99, -1.0f, 1.0f));
  }
  GradSlots<T> slots(float scale, bool with_accum) const {
    return GradSlots<T>{ptr, scale, with_accum ? accum.data() : nullptr};
  }
};

template <class T>
void check_reduce(const LevelCase& level, int64_t n, int mis, int num, bool with_accum) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis << " slots=" << num
                                    << " accum=" << with_accum);
  Slots<T> s(num, n, mis);
  const int64_t begin = first_index(n);
  GuardedBuffer<float> ref(n, mis), got(n, mis);
  use_scalar();
  reduce_grads(s.slots(0.37f, with_accum), ref.data(), begin, n);
  const double ref_sq = reduce_grads_sum_squares(s.slots(0.37f, with_accum), begin, n);
  use_level(level);
  reduce_grads(s.slots(0.37f, with_accum), got.data(), begin, n);
  const double got_sq = reduce_grads_sum_squares(s.slots(0.37f, with_accum), begin, n);
  EXPECT_TRUE(same_bits(got.data() + begin, ref.data() + begin, n - begin));
  EXPECT_TRUE(got.guards_intact());
  EXPECT_EQ(got_sq, ref_sq);

  // In-place accumulation over a micro-batch.
  GuardedBuffer<float> ref_acc(n, mis), got_acc(n, mis);
  ref_acc.assign(s.accum.to_vector());
  got_acc.assign(s.accum.to_vector());
  use_scalar();
  reduce_grads_accumulate(s.ptr, 0.37f, ref_acc.data(), begin, n);
  use_level(level);
  reduce_grads_accumulate(s.ptr, 0.37f, got_acc.data(), begin, n);
  EXPECT_TRUE(same_bits(got_acc.data(), ref_acc.data(), n));
  EXPECT_TRUE(got_acc.guards_intact());

  // Fused reduction + AdamW.
  AdamwBuffers fref(n, mis), fgot(n, mis);
  use_scalar();
  reduce_adamw_update(fref.state(true), s.slots(0.37f, with_accum), test_hyper(), begin, n);
  use_level(level);
  reduce_adamw_update(fgot.state(true), s.slots(0.37f, with_accum), test_hyper(), begin, n);
  fgot.expect_same(fref, true);
}

TEST_P(SimdLevelsTest, ReductionsMatchScalar) {
  for (int64_t n : odd_sizes()) {
    for (int mis : {0, 1}) {
      for (int num : {1, 3}) {
        for (bool accum : {false, true}) {
          check_reduce<float>(GetParam(), n, mis, num, accum);
          check_reduce<bf16_bits>(GetParam(), n, mis, num, accum);
        }
      }
    }
  }
}

TEST_P(SimdLevelsTest, ConversionsSumSquaresAndTriadMatchScalar) {
  for (int64_t n : odd_sizes()) {
    for (int mis : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis);
      GuardedBuffer<float> f(n, mis), f_ref(n, mis), f_got(n, mis), c(n, mis);
      GuardedBuffer<bf16_bits> h(n, mis), h_ref(n, mis), h_got(n, mis);
      f.assign(random_floats(n, 21, -3.0f, 3.0f));
      c.assign(random_floats(n, 22, -3.0f, 3.0f));
      h.assign(random_bf16(n, 23, -3.0f, 3.0f));

      use_scalar();
      f32_to_bf16(f.data(), h_ref.data(), n);
      bf16_to_f32(h.data(), f_ref.data(), n);
      const double sq_f_ref = sum_squares(f.data(), n);
      const double sq_h_ref = sum_squares(h.data(), n);
      use_level(GetParam());
      f32_to_bf16(f.data(), h_got.data(), n);
      bf16_to_f32(h.data(), f_got.data(), n);
      EXPECT_TRUE(same_bits(h_got.data(), h_ref.data(), n));
      EXPECT_TRUE(same_bits(f_got.data(), f_ref.data(), n));
      EXPECT_TRUE(h_got.guards_intact() && f_got.guards_intact());
      EXPECT_EQ(sum_squares(f.data(), n), sq_f_ref);
      EXPECT_EQ(sum_squares(h.data(), n), sq_h_ref);

      GuardedBuffer<float> a_ref(n, mis), a_got(n, mis);
      use_scalar();
      stream_triad(a_ref.data(), f.data(), c.data(), 1.5f, n);
      use_level(GetParam());
      stream_triad(a_got.data(), f.data(), c.data(), 1.5f, n);
      EXPECT_TRUE(same_bits(a_got.data(), a_ref.data(), n));
      EXPECT_TRUE(a_got.guards_intact());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, SimdLevelsTest, ::testing::ValuesIn(simd_cases()), level_name);

}  // namespace
}  // namespace slidedp::kernels::testing
