// What every family's GPU unit operation takes besides its tensors: the stream and cuBLASLt context it
// runs on, the attention implementation, packed sequences' positions, and the caller's blocks of
// device memory (units never allocate). Shared by the Llama family's units (units.h), Gemma 4's, Qwen3.6's
// and the experts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"

namespace slidedp::kernels::cuda {

using bf16 = __nv_bfloat16;

struct UnitContext {
  GemmContext* gemm = nullptr;  // the device's cuBLASLt context
  cudaStream_t stream = nullptr;
  AttentionImpl attention = AttentionImpl::kAuto;
  // Decoder operations of packed sequences: (B, T) int32 positions inside each token's document
  // (RoPE's positions; attention stays inside each document). Null: one document per sequence.
  const int32_t* positions = nullptr;
};

// A caller-provided block of device memory.
struct DeviceWorkspace {
  void* data = nullptr;
  int64_t bytes = 0;
};

}  // namespace slidedp::kernels::cuda
