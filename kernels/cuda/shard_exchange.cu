// The shard exchange and the rank-order sum; see shard_exchange.h.
#include <cuda_bf16.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/shard_exchange.h"

namespace slidedp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct Widen {
  __device__ float operator()(__nv_bfloat16 v) const { return to_f32(v); }
  __device__ float operator()(float v) const { return v; }
};

template <typename T>
__global__ void sum_received_kernel(const T* __restrict__ own, const T* __restrict__ received, int me,
                                    int ranks, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = math::reduced_shard_element(own, received, me, ranks, n, i, Widen{});
}

}  // namespace

void exchange_shards(const std::byte* input, int64_t esize, const ShardExchangePlan& plan,
                     std::byte* received, ncclComm_t comm, cudaStream_t stream) {
  // Bytes, not a float type: NCCL only moves them, and byte counts need no dtype support.
  SLIDEDP_CUDA_CHECK(ncclGroupStart());
  for (const ShardTransfer& t : plan.transfers) {
    if (t.send_count > 0)
      SLIDEDP_CUDA_CHECK(ncclSend(input + t.send_begin * esize, static_cast<size_t>(t.send_count * esize),
                                  ncclUint8, t.peer, comm, stream));
    if (plan.mine.size() > 0)
      SLIDEDP_CUDA_CHECK(ncclRecv(received + t.recv_begin * esize,
                                  static_cast<size_t>(plan.mine.size() * esize), ncclUint8, t.peer, comm,
                                  stream));
  }
  SLIDEDP_CUDA_CHECK(ncclGroupEnd());
}

void sum_received_shards(const std::byte* input, const std::byte* received, bool bf16,
                         const ShardExchangePlan& plan, int me, int ranks, float* out, cudaStream_t stream) {
  const int64_t n = plan.mine.size();
  if (n == 0) return;
  SLIDEDP_CHECK(me >= 0 && me < ranks, "sum_received_shards: rank outside the exchange");
  const unsigned grid = grid_for(n, kThreads);
  if (bf16) {
    const auto* own = reinterpret_cast<const __nv_bfloat16*>(input) + plan.mine.begin;
    sum_received_kernel<<<grid, kThreads, 0, stream>>>(own, reinterpret_cast<const __nv_bfloat16*>(received),
                                                       me, ranks, n, out);
  } else {
    const auto* own = reinterpret_cast<const float*>(input) + plan.mine.begin;
    sum_received_kernel<<<grid, kThreads, 0, stream>>>(own, reinterpret_cast<const float*>(received), me,
                                                       ranks, n, out);
  }
  SLIDEDP_CUDA_CHECK_LAUNCH(stream, "sum_received_shards");
}

}  // namespace slidedp::kernels::cuda
