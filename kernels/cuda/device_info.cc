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

std::string module_loading_setting(const char* current, std::string* why) {
  if (current != nullptr && std::string(current) == "EAGER") return "";
  if (why)
    *why =
        "lazy loading may synchronize the context at a kernel's first launch, while streams wait on host "
        "counters that only this process' threads advance: a deadlock";
  return "EAGER";
}

namespace {

// Sets `name` to `set` unless `set` is empty (keep), warning when an inherited value is replaced.
void apply_setting(const char* name, const char* current, const std::string& set, const std::string& why) {
  if (set.empty()) return;
  if (current != nullptr)
    std::fprintf(stderr, "slidedp: %s=%s replaced by %s: %s\n", name, current, set.c_str(), why.c_str());
  setenv(name, set.c_str(), 1);
}

}  // namespace

void prepare_cuda_environment(int ranks_per_gpu) {
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::string why;
  const std::string set =
      max_connections_setting(connections, kStreamsPerRank * std::max(1, ranks_per_gpu), &why);
  apply_setting("CUDA_DEVICE_MAX_CONNECTIONS", connections, set, why);
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  const std::string mode = module_loading_setting(loading, &why);
  apply_setting("CUDA_MODULE_LOADING", loading, mode, why);
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
