// One error check for every GPU library call: CUDA runtime, CUDA driver, cuBLAS(Lt), NCCL and
// CUPTI. SLIDEDP_CUDA_CHECK(call) prints nothing on success; on failure it throws RuntimeError
// naming the call as written, the library's own error name and message, and file:line. It is never
// compiled out (STYLE habit 5). Throwing, not aborting, is the choice: a failed call on a rank's
// driver thread then reaches RunControl::fail like any other error and every rank stops cleanly.
// SLIDEDP_CUDA_SYNC=1 in the environment makes every SLIDEDP_CUDA_CHECK_LAUNCH synchronize its
// stream, so an asynchronous kernel fault is reported at the launch that caused it.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_result.h>
#include <nccl.h>

#include <string>

namespace slidedp::kernels::cuda {

// Throws RuntimeError("<library> error: <call> failed with <name> (<code>): <message> at file:line").
[[noreturn]] void raise_gpu_error(const char* library, const char* call, int code, const std::string& name,
                                  const std::string& message, const char* file, int line);

[[noreturn]] void fail_result(cudaError_t r, const char* call, const char* file, int line);
[[noreturn]] void fail_result(CUresult r, const char* call, const char* file, int line);
[[noreturn]] void fail_result(cublasStatus_t r, const char* call, const char* file, int line);
[[noreturn]] void fail_result(ncclResult_t r, const char* call, const char* file, int line);
[[noreturn]] void fail_result(CUptiResult r, const char* call, const char* file, int line);

// The success test per library, inline so a passing check costs one compare.
inline void check_result(cudaError_t r, const char* call, const char* file, int line) {
  if (r != cudaSuccess) [[unlikely]] fail_result(r, call, file, line);
}
inline void check_result(CUresult r, const char* call, const char* file, int line) {
  if (r != CUDA_SUCCESS) [[unlikely]] fail_result(r, call, file, line);
}
inline void check_result(cublasStatus_t r, const char* call, const char* file, int line) {
  if (r != CUBLAS_STATUS_SUCCESS) [[unlikely]] fail_result(r, call, file, line);
}
inline void check_result(ncclResult_t r, const char* call, const char* file, int line) {
  if (r != ncclSuccess) [[unlikely]] fail_result(r, call, file, line);
}
inline void check_result(CUptiResult r, const char* call, const char* file, int line) {
  if (r != CUPTI_SUCCESS) [[unlikely]] fail_result(r, call, file, line);
}

// True when SLIDEDP_CUDA_SYNC=1 (read once per process).
bool sync_after_launch();

// After a kernel launch: picks up launch errors (bad configuration, too much shared memory) and, in
// the SLIDEDP_CUDA_SYNC=1 debug mode, synchronizes `stream` and reports any fault of the kernel.
void check_launch(cudaStream_t stream, const char* what, const char* file, int line);

}  // namespace slidedp::kernels::cuda

#define SLIDEDP_CUDA_CHECK(call) ::slidedp::kernels::cuda::check_result((call), #call, __FILE__, __LINE__)
#define SLIDEDP_CUDA_CHECK_LAUNCH(stream, what) ::slidedp::kernels::cuda::check_launch((stream), (what), __FILE__, __LINE__)
