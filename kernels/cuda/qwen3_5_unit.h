// One Qwen3.6 / Qwen3.5 decoder layer on the GPU: the contract of kernels/cpu/transformer/
// qwen3_5_layer.h (forward writes y and the saved state, recompute refills the saved state bitwise,
// backward overwrites dx and ACCUMULATES every parameter gradient) with the dtypes of units.h. Gated
// DeltaNet layers run the delta rule of gated_delta_rule.h in fp32; gated full-attention layers the
// attention of attention.h (head_dim 256: the reference path) with partial RoPE and the output gate;
// MoE layers the router and grouped experts of router.h / moe_experts.h beside the gated shared
// expert. Documents of packed sequences (ctx.positions) restart the conv window, the recurrence,
// attention and RoPE, as on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/qwen3_5_layer.h"
#include "kernels/cuda/qwen3_5_scratch.h"
#include "kernels/cuda/unit_context.h"

namespace slidedp::kernels::cuda {

// x, y (B, T, C) bf16; params: the unit's flat bf16 buffer; saved: qwen3_5_saved_bytes(). `router`:
// the load-balancing loss's statistics on the device (MoE layers), as gemma4_forward's.
void qwen3_5_forward(const UnitContext& ctx, const Qwen35LayerSpec& spec, const bf16* params, const bf16* x,
                     bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                     const RouterStats* router = nullptr);
void qwen3_5_recompute(const UnitContext& ctx, const Qwen35LayerSpec& spec, const bf16* params, const bf16* x,
                       DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws);
// dx (B, T, C) bf16 overwritten; grads (flat fp32, spec.flat_numel) += dL/dparams.
void qwen3_5_backward(const UnitContext& ctx, const Qwen35LayerSpec& spec, const bf16* params, const bf16* x,
                      DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                      DeviceWorkspace ws, const RouterStats* router = nullptr);

// The family's GPU operations under the names every family provides (the CUDA backend visits the
// layer's kernels::LayerSpec once per operation).
inline void layer_forward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* params, const bf16* x,
                          bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                          const RouterStats* router) {
  qwen3_5_forward(ctx, s, params, x, y, saved, B, T, ws, router);
}
inline void layer_recompute(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* params,
                            const bf16* x, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  qwen3_5_recompute(ctx, s, params, x, saved, B, T, ws);
}
inline void layer_backward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* params,
                           const bf16* x, DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads,
                           int64_t B, int64_t T, DeviceWorkspace ws, const RouterStats* router) {
  qwen3_5_backward(ctx, s, params, x, saved, dy, dx, grads, B, T, ws, router);
}

}  // namespace slidedp::kernels::cuda
