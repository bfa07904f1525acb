// Which bytes the gpu route's reduce-scatter moves between the ranks of one node: every rank sends
// each peer that peer's shard of its gradient chunk and receives its own shard from every peer (an
// all-to-all of bf16 pieces, (N-1)/N of the chunk each way, what a ring reduce-scatter moves), then
// sums the N pieces in rank order on its own GPU (device_math.h's sum_in_rank_order). NCCL's ring
// would add in ring order, in the input dtype or after a widening copy; this way the wire carries the
// wire dtype and the sum is the cpu route's, bit for bit. Pure C++: the CUDA code issues these
// transfers, the CPU tests replay them.
#pragma once

#include <cstdint>
#include <vector>

#include "card/shard_range.h"
#include "kernels/cuda/device_math.h"

namespace slidedp::kernels::cuda {

// One peer's part of the exchange, in elements of the chunk.
struct ShardTransfer {
  int peer = 0;
  int64_t send_begin = 0, send_count = 0;  // the peer's shard of this rank's input
  int64_t recv_begin = 0;                  // where the peer's piece of this rank's shard lands
};

struct ShardExchangePlan {
  ShardRange mine;                       // this rank's shard of the chunk
  std::vector<ShardTransfer> transfers;  // every peer, in rank order
  int64_t received_numel = 0;            // (N-1) x mine.size(): the receive staging
};

inline ShardExchangePlan shard_exchange_plan(int64_t count, int ranks, int me) {
  ShardExchangePlan p;
  p.mine = shard_range(count, ranks, me);
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    const ShardRange theirs = shard_range(count, ranks, r);
    p.transfers.push_back({r, theirs.begin, theirs.size(), math::received_slot(r, me) * p.mine.size()});
  }
  p.received_numel = exchange_received_numel(count, ranks, me);
  return p;
}

}  // namespace slidedp::kernels::cuda
