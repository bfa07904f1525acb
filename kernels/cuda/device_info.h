// What the process can see of its GPUs, asked without ever throwing (CI has no GPU and no driver),
// and the one piece of process environment the CUDA backend depends on.
#pragma once

#include <string>

namespace slidedp::kernels::cuda {

// Sets CUDA_DEVICE_MAX_CONNECTIONS=32 unless the user set it. Must run before the first CUDA call of
// the process to take effect, so device_count() and the backend call it first. Why: the backend's
// streams wait on host counters (cuStreamWaitValue64), which the hardware scheduler cannot see; with
// the default 8 hardware queues two streams can share one, and a compute stream queued behind a
// copy stream's counter wait would stall until the updater (which may need that compute) runs.
void prepare_cuda_environment();

// GPUs visible to this process; 0 when there is no driver, no GPU or CUDA fails to initialize.
int device_count() noexcept;

// "NVIDIA H200 (sm_90, 139.8 GiB, driver 13.0)" for messages and result provenance.
std::string device_description(int device);

}  // namespace slidedp::kernels::cuda
