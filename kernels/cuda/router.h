// The mixture-of-experts router's top-k on the GPU, as kernels/cpu/transformer/moe_experts.h's
// router_topk_forward / router_topk_backward (shared by Gemma 4 and Qwen3.6): a softmax over the E
// experts per token, the K most probable (ties to the lower index), their probabilities renormalised;
// backward through the renormalised weights only (top-k is not differentiable). One warp per token,
// fp32 storage, sums in double as the CPU's. The device math is kernels/cuda/device_math.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace slidedp::kernels::cuda {

inline constexpr int64_t kRouterMaxExperts = 32 * 32;  // one bit per expert a lane owns

// probs (N, E) = softmax(logits (N, E)); idx (N, K) the chosen experts, most probable first; w (N, K).
void router_topk_forward(float* probs, int32_t* idx, float* w, const float* logits, int64_t N, int64_t E, int64_t K,
                         cudaStream_t stream);
// dlogits (N, E) overwritten from dw (N, K): zero for the unchosen experts.
void router_topk_backward(float* dlogits, const float* dw, const float* probs, const int32_t* idx, int64_t N,
                          int64_t E, int64_t K, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
