// Polling wait on a host counter; see counter_wait.h.
#include "executor/cuda/counter_wait.h"
#include "kernels/cuda/cuda_check.h"

namespace slidedp::exec::cuda_detail {
namespace {

__global__ void counter_wait_kernel(const volatile uint64_t* counter, uint64_t value) {
  // volatile: every iteration reads host memory again; the host's store becomes visible over PCIe.
  while (static_cast<int64_t>(*counter - value) < 0) __nanosleep(2000);
}

}  // namespace

void enqueue_counter_wait_kernel(const uint64_t* counter, uint64_t value, cudaStream_t stream) {
  counter_wait_kernel<<<1, 1, 0, stream>>>(counter, value);
  // Launch errors only: even in the SLIDEDP_CUDA_SYNC=1 debug mode this must not wait for the
  // stream, which waits for a counter that the calling thread may be the one to advance.
  SLIDEDP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace slidedp::exec::cuda_detail
