// The mixture-of-experts router on the GPU, as kernels/cpu/transformer/moe_experts.h's
// router_topk_forward / router_topk_backward (shared by Gemma 4 and Qwen3.6): a softmax over the E
// experts per token, the K most probable (ties to the lower index), their probabilities renormalised;
// backward through the renormalised weights only (top-k is not differentiable). One warp per token,
// fp32 storage, sums in double as the CPU's. The device math is kernels/cuda/device_math.h's. Also
// Gemma 4's per-expert scale and the optional load-balancing loss (router_aux_loss.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/transformer/router_aux_loss.h"  // RouterStats

namespace slidedp::kernels::cuda {

inline constexpr int64_t kRouterMaxExperts = 32 * 32;  // one bit per expert a lane owns

// probs (N, E) = softmax(logits (N, E)); idx (N, K) the chosen experts, most probable first; w (N, K).
void router_topk_forward(float* probs, int32_t* idx, float* w, const float* logits, int64_t N, int64_t E, int64_t K,
                         cudaStream_t stream);
// dlogits (N, E) overwritten from dw (N, K): zero for the unchosen experts.
void router_topk_backward(float* dlogits, const float* dw, const float* probs, const int32_t* idx, int64_t N,
                          int64_t E, int64_t K, cudaStream_t stream);

// Gemma 4's router.per_expert_scale (E, a bf16 parameter): w (N*K) = w_renorm * scale[idx].
void expert_scale_forward(float* w, const float* w_renorm, const __nv_bfloat16* scale, const int32_t* idx,
                          int64_t slots, cudaStream_t stream);
// Its backward: dscale[e] += sum over the slots routed to e of dw * w_renorm (slot order within each
// of a fixed set of strided partial sums), then dw *= scale[idx] in place (the renormalised weights'
// gradient).
void expert_scale_backward(float* dscale, float* dw, const float* w_renorm, const __nv_bfloat16* scale,
                           const int32_t* idx, int64_t slots, int64_t E, cudaStream_t stream);

// The load-balancing loss (router_aux_loss.h), with the statistics in device memory. Adds one MoE
// layer's rows (probs (B*T, E), idx (B*T, K)) to them, in the CPU's order (bitwise its sums).
void router_stats_add(const RouterStats& st, const float* probs, const int32_t* idx, int64_t B, int64_t T, int64_t E,
                      int64_t K, cudaStream_t stream);
// dlogits (B*T, E) += the loss's gradient through one layer's softmax (nothing when st.weight == 0).
void router_aux_backward(float* dlogits, const float* probs, const RouterStats& st, int64_t B, int64_t T, int64_t E,
                         cudaStream_t stream);
// loss[0] += st.weight * sum over the B sequences of aux * loss_units (the head's loss sum, in its
// units: 1 / grad_scale); nothing when st.weight == 0.
void router_aux_loss_add(double* loss, const RouterStats& st, int64_t B, int64_t E, double loss_units,
                         cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
