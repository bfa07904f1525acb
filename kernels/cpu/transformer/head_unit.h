// Unit L+1: final RMSNorm + lm_head + fused chunked cross-entropy, forward and backward in one call
// (the head is where the backward pass starts, so nothing of it needs saving).
//
// lm_head weight and its gradient are separate pointers so the executor can aim them:
//  * untied: lm_head_w = head params + spec.lm_head_w, lm_head_grad = head grads + spec.lm_head_w;
//  * tied (spec.tied): lm_head_w = unit-0 params + embedding spec.weight (model.embed_tokens.weight)
//    and lm_head_grad = unit-0 grads + that offset. Unit 0's params must then be resident during the
//    head, and unit 0's gradient is complete only after BOTH the head and the embedding backward
//    have accumulated into it.
// Targets are per position, already shifted by the caller (target[t] is the id that follows
// position t); kIgnoreIndex (-100) masks a position. The result is (loss sum, unmasked count);
// gradients are those of grad_scale * loss_sum (see cross_entropy.h for the data-parallel contract).
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/cross_entropy.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

template <typename Real>
int64_t head_workspace_bytes(const HeadSpec& spec, int64_t B, int64_t T, bool with_grad);

// x (B, T, C), targets (B, T). With dx != nullptr: dx (B, T, C) overwritten; grads (the head's flat
// buffer: model.norm.weight) and lm_head_grad (V, C) accumulated. dx == nullptr: loss only.
template <typename Real>
LossResult head_forward_backward(const HeadSpec& spec, const Real* params, const Real* lm_head_w,
                                 const Real* x, const int32_t* targets, int64_t B, int64_t T,
                                 double grad_scale, Real* dx, Real* grads, Real* lm_head_grad, Workspace ws);

}  // namespace slidedp::kernels
