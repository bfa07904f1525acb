// The split master (common/split_master.h) against every one of the 2^32 fp32 patterns: each non-NaN
// pattern rebuilds bit for bit from its mirror and remainder, a NaN as a NaN of the same sign; the
// mirror is torch's cast (float_to_bf16, round to nearest even) except on exact ties with an odd
// upper half, where it is the value rounded toward zero, and the count of those is the closed form
// (32768 odd upper halves, less the 128 that make a NaN). A mirror with torch's tie rule fails the
// first check on 32,640 patterns (half a bf16 step above and below share a pair).
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "common/split_master.h"

namespace slidedp {
namespace {

struct Tally {
  uint64_t not_exact = 0, nan_lost = 0, differs_from_torch = 0, differs_not_at_a_tie = 0;
};

Tally check_range(uint64_t begin, uint64_t end) {
  Tally t;
  for (uint64_t i = begin; i < end; ++i) {
    const auto u = static_cast<uint32_t>(i);
    const float f = std::bit_cast<float>(u);
    const SplitMaster s = split_master(f);
    const uint32_t back = std::bit_cast<uint32_t>(join_master(s.mirror, s.remainder));
    if (is_nan_bits(u)) {
      t.nan_lost += !is_nan_bits(back) || (back >> 31) != (u >> 31);
      continue;
    }
    t.not_exact += back != u;
    if (s.mirror != float_to_bf16(f)) {
      ++t.differs_from_torch;
      const bool odd_tie = (u & 0xffffu) == 0x8000u && ((u >> 16) & 1u) == 1u;
      t.differs_not_at_a_tie += !(odd_tie && s.mirror == static_cast<bf16_bits>(u >> 16));
    }
  }
  return t;
}

TEST(SplitMaster, EveryFp32PatternRebuildsExactly) {
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  const uint64_t total = uint64_t{1} << 32, slice = total / threads;
  std::vector<Tally> tallies(threads);
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; ++k)
    pool.emplace_back([&, k] { tallies[k] = check_range(k * slice, k + 1 == threads ? total : (k + 1) * slice); });
  for (auto& th : pool) th.join();
  Tally sum;
  for (const Tally& t : tallies) {
    sum.not_exact += t.not_exact;
    sum.nan_lost += t.nan_lost;
    sum.differs_from_torch += t.differs_from_torch;
    sum.differs_not_at_a_tie += t.differs_not_at_a_tie;
  }
  EXPECT_EQ(sum.not_exact, 0u);
  EXPECT_EQ(sum.nan_lost, 0u);
  EXPECT_EQ(sum.differs_not_at_a_tie, 0u);
  // Odd upper halves: 32768; of them 128 are NaN patterns (exponent all ones, a non-zero odd upper
  // mantissa: 64 per sign).
  EXPECT_EQ(sum.differs_from_torch, 32768u - 128u);
}

TEST(SplitMaster, TheMirrorIsWhatTheGpusReceive) {
  // Away from ties the mirror is torch's cast; at a tie it rounds toward zero for either sign.
  EXPECT_EQ(split_master(1.0f + 0x1.0p-9f).mirror, float_to_bf16(1.0f + 0x1.0p-9f));
  const float odd_tie = std::bit_cast<float>(0x3f818000u);  // upper half 0x3f81 (odd), low half 0x8000
  EXPECT_EQ(float_to_bf16(odd_tie), 0x3f82u);               // torch: up to even
  EXPECT_EQ(split_master(odd_tie).mirror, 0x3f81u);         // here: toward zero
  EXPECT_EQ(split_master(-odd_tie).mirror, 0xbf81u);
  EXPECT_EQ(split_master(std::numeric_limits<float>::max()).mirror, 0x7f80u);  // rounds up to Inf, as torch's
  EXPECT_EQ(std::bit_cast<uint32_t>(join_master(0x7f80u, split_master(std::numeric_limits<float>::max()).remainder)),
            std::bit_cast<uint32_t>(std::numeric_limits<float>::max()));
}

}  // namespace
}  // namespace slidedp
