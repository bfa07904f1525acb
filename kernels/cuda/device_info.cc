// GPU discovery; see device_info.h.
#include "kernels/cuda/device_info.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>

#include "kernels/cuda/cuda_check.h"

namespace slidedp::kernels::cuda {

void prepare_cuda_environment() {
  // setenv with overwrite = 0 keeps a value the user chose.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
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
