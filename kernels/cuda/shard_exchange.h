// The gpu route's reduce-scatter within one node (plan: shard_exchange_plan.h): the all-to-all of
// shards through NCCL point-to-point calls, and the rank-order sum of what arrived.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/shard_exchange_plan.h"

namespace slidedp::kernels::cuda {

// Sends each peer its shard of `input` (`esize` bytes per element) and receives this rank's shard from
// every peer into `received` (plan.received_numel elements), as one NCCL group. Every rank of `comm`
// must call it for the same chunk. Inside an outer ncclGroupStart/End (one thread driving several
// GPUs) the transfers start at the outer end.
void exchange_shards(const std::byte* input, int64_t esize, const ShardExchangePlan& plan,
                     std::byte* received, ncclComm_t comm, cudaStream_t stream);

// out (plan.mine.size()) fp32 = the rank-order sum of the ranks' pieces of this rank's shard: its own
// from `input` (the whole chunk), the peers' from `received`. `bf16`: the pieces are bf16, else fp32.
void sum_received_shards(const std::byte* input, const std::byte* received, bool bf16,
                         const ShardExchangePlan& plan, int me, int ranks, float* out, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
