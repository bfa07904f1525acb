// The routed experts of a mixture-of-experts block on the GPU, as kernels/cpu/transformer/
// moe_experts.h's experts_forward / experts_backward (Gemma 4 GeGLU, Qwen3.6 SwiGLU experts): the
// (token, slot) pairs sorted by expert on the device (a stable counting sort, so token order within
// an expert, as the CPU's), the rows gathered, grouped GEMMs (grouped_gemm.h) over the packed expert
// weights gate_up (E, 2 Ie, C) and down (E, C, Ie), and each token's K outputs summed in slot order.
// Nothing waits for the host: the counts stay on the device. bf16 storage, fp32 accumulation and
// routing weights, deterministic (fixed orders throughout). Scratch and saved state: moe_scratch.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cuda/moe_scratch.h"
#include "kernels/cuda/unit_context.h"

namespace slidedp::kernels::cuda {

// saved, ws: moe_scratch.h's experts_*_bytes. y (N, C) bf16 overwritten with sum_k w[t,k]
// expert_idx[t,k](z[t]); idx (N, K), w (N, K) fp32.
void experts_forward(const MoeSpec& s, const bf16* gate_up, const bf16* down, const bf16* z,
                     const int32_t* idx, const float* w, bf16* y, DeviceWorkspace saved, int64_t N,
                     DeviceWorkspace ws, cudaStream_t stream);

// From dy (N, C) bf16: dz (N, C) fp32 and dw (N, K) fp32 overwritten; dgate_up, ddown (fp32)
// accumulated.
void experts_backward(const MoeSpec& s, const bf16* gate_up, const bf16* down, const bf16* z,
                      const int32_t* idx, const float* w, DeviceWorkspace saved, const bf16* dy, float* dz,
                      float* dw, float* dgate_up, float* ddown, int64_t N, DeviceWorkspace ws,
                      cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
