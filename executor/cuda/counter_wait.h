// The last-resort way for a CUDA stream to wait on a host counter, for drivers without stream memory
// operations: a one-thread kernel that polls the pinned, mapped counter word until it reaches the
// value (cyclic >=, like cuStreamWaitValue64). Work queued after it in the stream starts when it
// exits. It occupies one block slot on one multiprocessor while it waits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::exec::cuda_detail {

// counter: device address of the pinned word (cudaHostGetDevicePointer).
void enqueue_counter_wait_kernel(const uint64_t* counter, uint64_t value, cudaStream_t stream);

}  // namespace slidedp::exec::cuda_detail
