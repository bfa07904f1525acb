// AdamW over a split master (kernels/cpu/optim/adamw.h, common/split_master.h), at every SIMD level:
//  * the reference is the fp32-master update with the split's mirror rule (ties toward zero), whose
//    result, split by common/split_master.h (checked on all 2^32 patterns in tests/common), must be
//    the split update's result bit for bit: mirror, remainder, moments;
//  * with lr = 0 the update leaves the master as it was, so the kernel's own join and split must give
//    back every input pattern: ties (low half 0x8000), one off either side, subnormals, zeros, Inf,
//    the largest finite values, all signs;
//  * the fp32 master's mirror with the toward-zero rule differs from torch's (nearest even) exactly on
//    the exact ties with an odd upper half.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <vector>

#include "common/split_master.h"
#include "kernels/cpu/optim/adamw.h"
#include "kernels/cpu/optim/bf16_convert.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {
namespace {

using SplitMasterAdamwTest = LevelTest;

// Finite-or-infinite fp32 patterns that stress the split: every 4th one an exact tie, others one
// below or above a tie, subnormals, zeros, infinities, the largest finite values.
std::vector<float> hard_patterns(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out;
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
                               0x7f7f8000u, 0x00008000u, 0x80018000u, 0x00000001u, 0x3f808000u, 0x3f818000u};
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = rng();
    switch (i % 8) {
      case 0:
        u = (u & 0xffff0000u) | 0x8000u;
        break;  // exact tie
      case 1:
        u = (u & 0xffff0000u) | 0x8001u;
        break;
      case 2:
        u = (u & 0xffff0000u) | 0x7fffu;
        break;
      case 3:
        u &= 0x807fffffu;
        break;  // subnormal (or zero)
      case 4:
        u = specials[static_cast<size_t>(i / 8) % std::size(specials)];
        break;
      default:
        break;
    }
    if (is_nan_bits(u)) u &= 0xff800000u;  // masters are never NaN (refused on load)
    out.push_back(std::bit_cast<float>(u));
  }
  return out;
}

struct SplitBuffers {
  GuardedBuffer<float> m, v;
  GuardedBuffer<bf16_bits> mirror;
  GuardedBuffer<uint16_t> remainder;
  SplitBuffers(const std::vector<float>& master, int mis)
      : m(static_cast<int64_t>(master.size()), mis),
        v(static_cast<int64_t>(master.size()), mis),
        mirror(static_cast<int64_t>(master.size()), mis),
        remainder(static_cast<int64_t>(master.size()), mis) {
    const auto n = static_cast<int64_t>(master.size());
    for (int64_t i = 0; i < n; ++i) {
      const SplitMaster s = split_master(master[static_cast<size_t>(i)]);
      mirror[i] = s.mirror;
      remainder[i] = s.remainder;
    }
    m.assign(random_floats(n, 12, -0.1f, 0.1f));
    v.assign(random_floats(n, 13, 0.0f, 0.01f));
  }
  AdamwState state() {
    AdamwState s;
    s.exp_avg = m.data();
    s.exp_avg_sq = v.data();
    s.param_bf16 = mirror.data();
    s.remainder = remainder.data();
    return s;
  }
};

struct Fp32Buffers {
  GuardedBuffer<float> p, m, v;
  GuardedBuffer<bf16_bits> mirror;
  Fp32Buffers(const std::vector<float>& master, int mis)
      : p(static_cast<int64_t>(master.size()), mis),
        m(static_cast<int64_t>(master.size()), mis),
        v(static_cast<int64_t>(master.size()), mis),
        mirror(static_cast<int64_t>(master.size()), mis) {
    const auto n = static_cast<int64_t>(master.size());
    p.assign(master);
    m.assign(random_floats(n, 12, -0.1f, 0.1f));
    v.assign(random_floats(n, 13, 0.0f, 0.01f));
  }
  AdamwState state(bool toward_zero) {
    AdamwState s{p.data(), m.data(), v.data(), mirror.data()};
    s.mirror_ties_toward_zero = toward_zero;
    return s;
  }
};

AdamwHyper hyper(double lr) {
  AdamwHyper h;
  h.lr = lr;
  h.weight_decay = lr > 0 ? 0.1 : 0.0;
  h.step = 3;
  h.grad_scale = 0.25;
  return h;
}

// The split update equals the fp32 update with the toward-zero mirror, split afterwards.
void check_against_fp32(const LevelCase& level, int64_t n, int mis, const std::vector<float>& master,
                        double lr) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " misalign=" << mis << " lr=" << lr);
  GuardedBuffer<float> grad(n, mis);
  grad.assign(random_floats(n, 14, -2.0f, 2.0f));
  const int64_t begin = n > 2 ? 2 : 0;
  use_scalar();
  Fp32Buffers ref(master, mis);
  adamw_update(ref.state(true), grad.data(), hyper(lr), begin, n);
  use_level(level);
  SplitBuffers got(master, mis);
  adamw_update(got.state(), grad.data(), hyper(lr), begin, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(ref.p[i]);
    const uint32_t have = std::bit_cast<uint32_t>(join_master(got.mirror[i], got.remainder[i]));
    ASSERT_EQ(have, want) << "master " << i;
    if (i < begin) continue;  // not updated: the fp32 run wrote no mirror there
    ASSERT_EQ(got.mirror[i], ref.mirror[i]) << "mirror " << i;
    // With lr = 0 the update is p = fma(-0, m / denom, p): every pattern comes back, but a zero may
    // change sign (-0 + +0 = +0), in the fp32 update as well.
    if (lr == 0 && master[static_cast<size_t>(i)] != 0.0f) {
      ASSERT_EQ(have, std::bit_cast<uint32_t>(master[static_cast<size_t>(i)])) << i;
    }
  }
  EXPECT_TRUE(same_bits(got.m.data(), ref.m.data(), n));
  EXPECT_TRUE(same_bits(got.v.data(), ref.v.data(), n));
  EXPECT_TRUE(got.mirror.guards_intact() && got.remainder.guards_intact() && got.m.guards_intact());
}

TEST_P(SplitMasterAdamwTest, SplitUpdateEqualsTheFp32UpdateWithTheSameMirrorRule) {
  for (int64_t n : odd_sizes())
    for (int mis : {0, 1}) {
      check_against_fp32(GetParam(), n, mis, random_floats(n, 11, -1.0f, 1.0f), 1e-2);
      check_against_fp32(GetParam(), n, mis, hard_patterns(n, 15), 1e-2);
    }
}

TEST_P(SplitMasterAdamwTest, WithoutAStepTheSplitGivesBackEveryPattern) {
  for (int64_t n : {int64_t{17}, int64_t{4099}})
    for (int mis : {0, 1}) check_against_fp32(GetParam(), n, mis, hard_patterns(n, 16), 0.0);
}

// The toward-zero mirror differs from nearest-even exactly on ties with an odd upper half.
TEST_P(SplitMasterAdamwTest, TowardZeroMirrorDiffersFromNearestEvenOnlyOnOddTies) {
  const std::vector<float> master = hard_patterns(4099, 17);
  const auto n = static_cast<int64_t>(master.size());
  GuardedBuffer<float> grad(n, 0);
  grad.assign(std::vector<float>(static_cast<size_t>(n), 0.0f));
  use_level(GetParam());
  Fp32Buffers even(master, 0), zero(master, 0);
  adamw_update(even.state(false), grad.data(), hyper(0.0), 0, n);
  adamw_update(zero.state(true), grad.data(), hyper(0.0), 0, n);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(master[static_cast<size_t>(i)]);
    const bool odd_tie =
        (u & 0xffffu) == 0x8000u && ((u >> 16) & 1u) == 1u && (u & 0x7f800000u) != 0x7f800000u;
    ASSERT_EQ(even.mirror[i] != zero.mirror[i], odd_tie) << std::hex << u;
    differ += odd_tie;
  }
  EXPECT_GT(differ, 100);
}

// The bulk split (the host state's load) equals common/split_master.h element by element, with and
// without the remainder.
TEST_P(SplitMasterAdamwTest, BulkSplitEqualsTheScalarSplit) {
  use_level(GetParam());
  for (int64_t n : odd_sizes())
    for (int mis : {0, 1}) {
      const std::vector<float> in = hard_patterns(n, 18);
      GuardedBuffer<bf16_bits> mirror(n, mis), alone(n, mis);
      GuardedBuffer<uint16_t> remainder(n, mis);
      f32_to_split(in.data(), mirror.data(), remainder.data(), n);
      f32_to_split(in.data(), alone.data(), nullptr, n);
      for (int64_t i = 0; i < n; ++i) {
        const SplitMaster s = split_master(in[static_cast<size_t>(i)]);
        ASSERT_EQ(mirror[i], s.mirror) << i;
        ASSERT_EQ(alone[i], s.mirror) << i;
        ASSERT_EQ(remainder[i], s.remainder) << i;
      }
      EXPECT_TRUE(mirror.guards_intact() && alone.guards_intact() && remainder.guards_intact());
    }
}

INSTANTIATE_TEST_SUITE_P(Levels, SplitMasterAdamwTest, ::testing::ValuesIn(simd_cases()), level_name);

}  // namespace
}  // namespace slidedp::kernels::testing
