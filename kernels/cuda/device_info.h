// What the process can see of its GPUs, asked without ever throwing (CI has no GPU and no driver),
// and the two pieces of process environment the CUDA backend depends on.
#pragma once

#include <string>

namespace slidedp::kernels::cuda {

// Streams the backend creates per rank (compute, h2d, d2h, comm), and the most hardware work queues
// CUDA gives a process per GPU (CUDA_DEVICE_MAX_CONNECTIONS' cap).
inline constexpr int kStreamsPerRank = 4;
inline constexpr int kMaxConnections = 32;

// Hardware queues `streams` streams on one GPU need: one each and the libraries' own 4, at most
// kMaxConnections (a need above it cannot be met: the backend refuses such ranks per GPU).
inline constexpr int connections_needed(int streams) { return streams + 4; }
inline constexpr int kMaxRanksPerGpu = (kMaxConnections - 4) / kStreamsPerRank;

// The CUDA_DEVICE_MAX_CONNECTIONS a process needs for `streams` streams on one GPU, given the
// inherited value `current` (nullptr: unset): "" keeps it (it is at least streams + 4, the libraries'
// own, and a number CUDA accepts), else the value to set ("32") with the reason in `why`. Why it
// matters: the backend's streams wait on host counters (cuStreamWaitValue64), which the hardware
// scheduler cannot see; with fewer queues than streams two streams share one, and a compute stream
// queued behind a copy stream's counter wait stalls until the updater (which may need that compute)
// runs: a deadlock (Megatron-style environments export 1).
std::string max_connections_setting(const char* current, int streams, std::string* why = nullptr);

// The CUDA_MODULE_LOADING a process needs, given the inherited value `current` (nullptr: unset): ""
// keeps it (EAGER), else "EAGER" with the reason in `why`. Why it matters: with lazy loading (CUDA's
// default since 12.2) the first launch of a kernel, ours or cuBLASLt's, loads it and may synchronize
// the whole context (CUDA programming guide, Lazy Loading: potential hazards). Our streams wait on
// host counters and the profiler holds a stream at a host-function gate, so such a synchronization
// can wait for work that only the launching thread (or another rank's thread on the same GPU) would
// release: a deadlock (NVIDIA/nvbench issue 136, the same hazard, the same fix).
std::string module_loading_setting(const char* current, std::string* why = nullptr);

// Applies max_connections_setting for `ranks_per_gpu` ranks sharing a GPU and module_loading_setting
// to the environment (a warning on stderr when it replaces an inherited value). Must run before the
// first CUDA call of the process to take effect, so device_count(), the profiler's GPU probe and the
// backend call it first.
void prepare_cuda_environment(int ranks_per_gpu = 1);

// GPUs visible to this process; 0 when there is no driver, no GPU or CUDA fails to initialize.
int device_count() noexcept;

// Bytes of memory GPU `device` has in all (cudaDeviceProp::totalGlobalMem); throws on a CUDA error.
long long device_total_bytes(int device);

// "NVIDIA H200 (sm_90, 139.8 GiB, driver 13.0)" for messages and result provenance.
std::string device_description(int device);

}  // namespace slidedp::kernels::cuda
