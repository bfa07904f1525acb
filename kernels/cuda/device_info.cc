// GPU discovery; see device_info.h.
#include "kernels/cuda/device_info.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_check.h"

namespace slidedp::kernels::cuda {

std::string max_connections_setting(const char* current, int streams, std::string* why) {
  const int need = std::min(kMaxConnections, connections_needed(streams));
  const std::string want = std::to_string(kMaxConnections);
  if (current == nullptr) return want;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(current, &end, 10);
  const bool number = end != current && *end == '\0' && errno == 0;
  if (number && v >= need && v <= kMaxConnections) return "";
  if (why)
    *why = !number ? fmt::format("'{}' is not a number", current)
           : v > kMaxConnections
               ? fmt::format("{} is above CUDA's maximum of {}", v, kMaxConnections)
               : fmt::format("{} hardware queues are fewer than the {} this process needs ({} streams per GPU and the "
                             "libraries' own): streams waiting on host counters would share queues and deadlock",
                             v, need, streams);
  return want;
}

void prepare_cuda_environment(int ranks_per_gpu) {
  const char* current = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::string why;
  const std::string set = max_connections_setting(current, kStreamsPerRank * std::max(1, ranks_per_gpu), &why);
  if (set.empty()) return;
  if (current != nullptr)
    std::fprintf(stderr, "slidedp: CUDA_DEVICE_MAX_CONNECTIONS=%s replaced by %s: %s\n", current, set.c_str(), why.c_str());
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", set.c_str(), 1);
}

int device_count() noexcept {
  prepare_cuda_environment();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return n;
}

long long device_total_bytes(int device) {
  cudaDeviceProp p{};
  SLIDEDP_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return static_cast<long long>(p.totalGlobalMem);
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  SLIDEDP_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  int driver = 0;
  SLIDEDP_CUDA_CHECK(cudaDriverGetVersion(&driver));
  return fmt::format("{} (sm_{}{}, {:.1f} GiB, {} SMs, driver {}.{})", p.name, p.major, p.minor,
                     static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.multiProcessorCount,
                     driver / 1000, (driver % 1000) / 10);
}

}  // namespace slidedp::kernels::cuda
