// The gpu route's reduce-scatter within a node, replayed on the CPU (CI has no GPU): every rank's
// plan (kernels/cuda/shard_exchange_plan.h) says what it sends each peer and where each peer's piece
// lands; the test delivers exactly that, then sums with the kernel's per-element function
// (device_math.h reduced_shard_element). The result must be bitwise the host reduction of the same
// gradients (kernels/cpu/optim/grad_reduce.h, what the cpu route computes): both add the widened
// inputs in rank order in fp32, so there is no tolerance.
#include "kernels/cuda/shard_exchange_plan.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/bf16.h"
#include "kernels/cpu/optim/grad_reduce.h"
#include "kernels/cuda/device_math.h"
#include "tests/kernels/cuda/shard_exchange_replay.h"

namespace slidedp::kernels::cuda {
namespace {

struct WidenBf16 {
  float operator()(bf16_bits v) const { return bf16_to_float(v); }
};

// Gradients whose sums round differently in different orders: magnitudes spread over 2^-20 .. 2^20,
// both signs, and some negative zeros (0 + -0 is +0: an order that starts from zero shows).
std::vector<bf16_bits> gradient(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mant(1.0, 2.0), expo(-20.0, 20.0);
  std::vector<bf16_bits> g(static_cast<size_t>(n));
  for (auto& x : g) {
    const uint64_t r = rng();
    const double v =
        (r % 13 == 0) ? -0.0 : mant(rng) * std::exp2(std::floor(expo(rng))) * ((r & 1) ? -1.0 : 1.0);
    x = float_to_bf16(static_cast<float>(v));
  }
  return g;
}

TEST(ShardExchange, EachRanksShardIsTheHostReductionOfTheChunkBitwise) {
  for (int ranks : {2, 3, 4, 5, 8})
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{64}, int64_t{1000}, int64_t{1003}}) {
      std::vector<std::vector<bf16_bits>> in;
      std::vector<const bf16_bits*> slots;
      for (int r = 0; r < ranks; ++r) in.push_back(gradient(count, 1000 * ranks + 10 * r + count));
      for (const auto& v : in) slots.push_back(v.data());
      std::vector<float> want(static_cast<size_t>(count));
      kernels::reduce_grads(
          kernels::GradSlots<bf16_bits>{std::span<const bf16_bits* const>(slots), 1.0f, nullptr}, want.data(),
          0, count);

      std::vector<ShardExchangePlan> plans;
      for (int me = 0; me < ranks; ++me) plans.push_back(shard_exchange_plan(count, ranks, me));
      int64_t covered = 0;
      for (int me = 0; me < ranks; ++me) {
        const ShardExchangePlan& p = plans[static_cast<size_t>(me)];
        ASSERT_EQ(p.mine.begin, covered) << "shards must tile the chunk in rank order";
        covered = p.mine.end;
        const int64_t n = p.mine.size();
        ASSERT_EQ(p.received_numel, (ranks - 1) * n);
        ASSERT_EQ(static_cast<int>(p.transfers.size()), ranks - 1);
        const std::vector<bf16_bits> received =
            test::received_pieces(in, plans, me, bf16_bits{0x7fc1});  // NaN if unwritten
        const bf16_bits* own = in[static_cast<size_t>(me)].data() + p.mine.begin;
        for (int64_t i = 0; i < n; ++i) {
          const float got = math::reduced_shard_element(own, received.data(), me, ranks, n, i, WidenBf16{});
          ASSERT_EQ(std::bit_cast<uint32_t>(got),
                    std::bit_cast<uint32_t>(want[static_cast<size_t>(p.mine.begin + i)]))
              << ranks << " ranks, count " << count << ", rank " << me << ", element " << i;
        }
      }
      EXPECT_EQ(covered, count);
    }
}

}  // namespace
}  // namespace slidedp::kernels::cuda
