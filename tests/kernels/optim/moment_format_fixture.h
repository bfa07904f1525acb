// What the compressed-moment tests (bf16_moments_adamw_test.cc, q8_moments_adamw_test.cc) share: the
// hyper-parameters they update with and the master each state holds (an fp32 master or the split
// master's remainder, and the bf16 mirror), each format adding its moments.
#pragma once

#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/adamw.h"
#include "tests/kernels/optim/optim_test_util.h"

namespace slidedp::kernels::testing {

inline AdamwHyper moment_format_hyper() {
  AdamwHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.step = 7;
  h.grad_scale = 0.5;
  return h;
}

// The master of n elements, misaligned by `misalign`: an fp32 master or (split) the remainder, and
// the mirror; the same seeds in every format's state, so two states of one format start equal.
struct MasterUnderTest {
  GuardedBuffer<float> p;
  GuardedBuffer<bf16_bits> mirror;
  GuardedBuffer<uint16_t> remainder;
  bool split;
  MasterUnderTest(int64_t n, int misalign, bool split_master)
      : p(n, misalign), mirror(n, misalign), remainder(n, misalign), split(split_master) {
    p.assign(random_floats(n, 31, -1.0f, 1.0f));
    mirror.assign(random_bf16(n, 34, -1.0f, 1.0f));
    remainder.assign(std::vector<uint16_t>(static_cast<size_t>(n), 0x1234));
  }
  // The master's and the mirror's pointers of an update's state.
  void point(AdamwState& s) {
    if (split) {
      s.remainder = remainder.data();
    } else {
      s.param = p.data();
    }
    s.param_bf16 = mirror.data();
  }
  void expect_same_as(const MasterUnderTest& other, int64_t n) const {
    EXPECT_TRUE(same_bits(p.data(), other.p.data(), n)) << "p";
    EXPECT_TRUE(same_bits(mirror.data(), other.mirror.data(), n)) << "mirror";
    EXPECT_TRUE(same_bits(remainder.data(), other.remainder.data(), n)) << "remainder";
    EXPECT_TRUE(other.mirror.guards_intact() && other.p.guards_intact() && other.remainder.guards_intact());
  }
};

}  // namespace slidedp::kernels::testing
