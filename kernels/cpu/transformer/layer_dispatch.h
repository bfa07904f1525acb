// The decoder layer l of a model, whatever its family, behind one set of calls: each visits the
// layer's spec (layer_spec.h) and calls its family's overload. The executor, the unstreamed model
// step and the memory queries call these.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/model_step.h"

namespace slidedp::kernels {

int64_t layer_flat_numel(const ModelSpecs& s, int layer);

template <typename Real>
int64_t layer_saved_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T);
template <typename Real>
int64_t layer_forward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T);
template <typename Real>
int64_t layer_backward_workspace_bytes(const ModelSpecs& s, int layer, int64_t B, int64_t T);

// `router`: the micro-batch's router statistics (router_aux_loss.h), read by MoE layers only:
// forward adds to them, backward adds the load-balancing loss's gradient. `positions` (B, T): the
// document positions of packed sequences (attention.h), or null (one document per sequence).
template <typename Real>
void layer_forward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* router = nullptr,
                   const int32_t* positions = nullptr);
template <typename Real>
void layer_recompute(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions = nullptr);
template <typename Real>
void layer_backward(const ModelSpecs& s, int layer, const Real* params, const Real* x, Workspace saved,
                    const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* router = nullptr, const int32_t* positions = nullptr);

}  // namespace slidedp::kernels
