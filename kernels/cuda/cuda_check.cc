// Error messages of the GPU libraries; see cuda_check.h. Driver-API and CUPTI strings are looked up
// at failure time without linking those libraries: the driver's through the runtime's entry-point
// query, CUPTI's through the symbol table (a CUptiResult can only exist if CUPTI is loaded).
#include "kernels/cuda/cuda_check.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace slidedp::kernels::cuda {

void raise_gpu_error(const char* library, const char* call, int code, const std::string& name,
                     const std::string& message, const char* file, int line) {
  throw RuntimeError(fmt::format("{} error: {} failed with {} ({}): {} at {}:{}", library, call, name, code, message,
                                 file, line));
}

void fail_result(cudaError_t r, const char* call, const char* file, int line) {
  raise_gpu_error("CUDA", call, static_cast<int>(r), cudaGetErrorName(r), cudaGetErrorString(r), file, line);
}

void fail_result(CUresult r, const char* call, const char* file, int line) {
  using GetString = CUresult (*)(CUresult, const char**);
  const char* name = nullptr;
  const char* message = nullptr;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess && fn)
    reinterpret_cast<GetString>(fn)(r, &name);
  fn = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuGetErrorString", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess && fn)
    reinterpret_cast<GetString>(fn)(r, &message);
  raise_gpu_error("CUDA driver", call, static_cast<int>(r), name ? name : "CUresult",
                  message ? message : "(no message: the driver's error strings are unavailable)", file, line);
}

void fail_result(cublasStatus_t r, const char* call, const char* file, int line) {
  raise_gpu_error("cuBLAS", call, static_cast<int>(r), cublasLtGetStatusName(r), cublasLtGetStatusString(r), file,
                  line);
}

void fail_result(ncclResult_t r, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  std::string message = ncclGetErrorString(r);
  if (last != nullptr && last[0] != '\0') message += fmt::format(" (last NCCL message: {})", last);
  raise_gpu_error("NCCL", call, static_cast<int>(r), "ncclResult_t", message, file, line);
}

void fail_result(CUptiResult r, const char* call, const char* file, int line) {
  using GetString = CUptiResult (*)(CUptiResult, const char**);
  const char* message = nullptr;
  if (auto fn = reinterpret_cast<GetString>(dlsym(RTLD_DEFAULT, "cuptiGetResultString"))) fn(r, &message);
  raise_gpu_error("CUPTI", call, static_cast<int>(r), "CUptiResult",
                  message ? message : "(CUPTI is not loaded: no message)", file, line);
}

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("SLIDEDP_CUDA_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void check_launch(cudaStream_t stream, const char* what, const char* file, int line) {
  check_result(cudaGetLastError(), what, file, line);
  if (sync_after_launch()) check_result(cudaStreamSynchronize(stream), what, file, line);
}

}  // namespace slidedp::kernels::cuda
