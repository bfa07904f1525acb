// One dense Gemma 4 decoder layer on the GPU: the contract of kernels/cpu/transformer/gemma4_layer.h
// (forward writes y and the saved state, recompute refills the saved state bitwise, backward
// overwrites dx and ACCUMULATES every parameter gradient; layer_scalar's stays untouched) with the
// dtypes of units.h: bf16 parameters and activations, fp32 statistics, parameter gradients and sums of
// GEMMs. Attention has scale 1, the layer's window (sliding layers) and head_dim 256 or 512, which
// run on the reference attention path. Mixture-of-experts layers (26B-A4B) add the routed branch:
// the router (router.h), the experts as grouped GEMMs (moe_experts.h), their norms; `router` (device
// statistics, as the CPU unit's) takes the load-balancing loss's statistics in forward and its
// gradient in backward.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/gemma4_layer.h"
#include "kernels/cuda/gemma4_scratch.h"
#include "kernels/cuda/unit_context.h"

namespace slidedp::kernels::cuda {

// x, y (B, T, C) bf16; params: the unit's flat bf16 buffer; saved: gemma4_saved_bytes().
void gemma4_forward(const UnitContext& ctx, const Gemma4LayerSpec& spec, const bf16* params, const bf16* x, bf16* y,
                    DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                    const RouterStats* router = nullptr);
void gemma4_recompute(const UnitContext& ctx, const Gemma4LayerSpec& spec, const bf16* params, const bf16* x,
                      DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws);
// dx (B, T, C) bf16 overwritten; grads (flat fp32, spec.flat_numel) += dL/dparams.
void gemma4_backward(const UnitContext& ctx, const Gemma4LayerSpec& spec, const bf16* params, const bf16* x,
                     DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                     DeviceWorkspace ws, const RouterStats* router = nullptr);

// The family's GPU operations under the names every family provides (the CUDA backend visits the
// layer's kernels::LayerSpec once per operation).
inline void layer_forward(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* params, const bf16* x,
                          bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                          const RouterStats* router) {
  gemma4_forward(ctx, s, params, x, y, saved, B, T, ws, router);
}
inline void layer_recompute(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* params,
                            const bf16* x, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  gemma4_recompute(ctx, s, params, x, saved, B, T, ws);
}
inline void layer_backward(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* params,
                           const bf16* x, DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads,
                           int64_t B, int64_t T, DeviceWorkspace ws, const RouterStats* router) {
  gemma4_backward(ctx, s, params, x, saved, dy, dx, grads, B, T, ws, router);
}

}  // namespace slidedp::kernels::cuda
