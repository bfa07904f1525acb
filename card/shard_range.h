#pragma once
// How a unit's flat buffer of `count` elements splits over ranks and nodes: the sharded route's
// deliveries, the reduced gradients each rank or node owns, and the gpu route's exchange staging.
// Read by the plan's users, the host state and the CUDA shard exchange alike.
#include <cstdint>

namespace slidedp {

// Rank r's share of `count` elements split over `ranks`: [begin, end), contiguous, the first
// count % ranks shards one element longer (the sharded route's deliveries and reduced gradients).
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
inline ShardRange shard_range(int64_t count, int ranks, int rank) {
  const int64_t base = count / ranks, extra = count % ranks;
  const int64_t begin = rank * base + (rank < extra ? rank : extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

// The gpu route's reduce-scatter within a node receives rank `rank`'s piece of its shard from each
// of the other ranks (kernels/cuda/shard_exchange_plan.h): its receive staging, in elements.
inline int64_t exchange_received_numel(int64_t count, int ranks, int rank) {
  return (ranks - 1) * shard_range(count, ranks, rank).size();
}

// Node `node`'s share of `count` elements split over `nodes` nodes of `ranks` ranks each: the union
// of its ranks' shard_ranges among all nodes x ranks, so that the gpu route's reduce-scatter over
// every node's ranks lands on each node exactly the part of a chunk its host state holds. With one
// rank per node it is shard_range(count, nodes, node).
inline ShardRange node_range(int64_t count, int nodes, int ranks, int node) {
  return {shard_range(count, nodes * ranks, node * ranks).begin,
          shard_range(count, nodes * ranks, node * ranks + ranks - 1).end};
}

}  // namespace slidedp
