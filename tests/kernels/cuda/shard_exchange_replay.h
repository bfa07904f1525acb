// The deliveries of the gpu route's shard exchange, done on the host from every rank's plan: what each
// peer's plan sends rank `me` lands where me's plan receives it. Shared by the CPU replay test (CI) and
// the GPU test of the sum kernel.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/shard_exchange_plan.h"

namespace slidedp::kernels::cuda::test {

// The receive staging of rank `me` after the exchange of the ranks' chunks `in` (one per rank).
// Unwritten elements keep `fill`. Fails the calling test when a send and its receive differ in size.
template <typename T>
std::vector<T> received_pieces(const std::vector<std::vector<T>>& in,
                               const std::vector<ShardExchangePlan>& plans, int me, T fill) {
  const ShardExchangePlan& p = plans[static_cast<size_t>(me)];
  const int64_t n = p.mine.size();
  std::vector<T> received(static_cast<size_t>(p.received_numel), fill);
  for (const ShardTransfer& t : p.transfers) {
    const auto& theirs = plans[static_cast<size_t>(t.peer)].transfers;
    auto to_me =
        std::find_if(theirs.begin(), theirs.end(), [&](const ShardTransfer& u) { return u.peer == me; });
    EXPECT_NE(to_me, theirs.end()) << "rank " << t.peer << " sends rank " << me << " nothing";
    if (to_me == theirs.end()) continue;
    EXPECT_EQ(to_me->send_count, n) << "a send and its receive must have one size (NCCL matches them)";
    EXPECT_LE(t.recv_begin + n, p.received_numel);
    if (to_me->send_count != n || t.recv_begin + n > p.received_numel) continue;
    std::copy_n(in[static_cast<size_t>(t.peer)].begin() + to_me->send_begin, n,
                received.begin() + t.recv_begin);
  }
  return received;
}

}  // namespace slidedp::kernels::cuda::test
