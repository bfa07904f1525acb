// Fused chunked linear cross-entropy: loss and gradients of CE(h W^T, targets) without ever holding
// the (tokens x V) logits. Unmasked tokens are gathered `chunk_tokens` at a time; each chunk
// computes its logits (one GEMM), row log-sum-exp, loss, dlogits = grad_scale * (softmax - onehot)
// in place, then dh rows (one GEMM) and dW += dlogits^T h (one GEMM). Masked tokens (target ==
// kIgnoreIndex) cost nothing and get a zero dh row.
//
// Data-parallel contract: the result is the SUM of per-token losses and the COUNT of unmasked
// tokens; gradients are those of grad_scale * loss_sum. The executor passes grad_scale =
// 1 / (unmasked tokens of the whole global batch), so N ranks x micro-batch b reproduce 1 rank x
// N*b up to summation order. The loss sum is accumulated in double in token order, so it does not
// depend on chunk_tokens beyond the GEMM's rounding of each logit.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"

namespace slidedp::kernels {

inline constexpr int32_t kIgnoreIndex = -100;  // PyTorch's CrossEntropyLoss default

struct LossResult {
  double loss_sum = 0.0;   // sum over unmasked tokens of -log softmax(logits)[target]
  int64_t num_tokens = 0;  // unmasked tokens
  double router_aux_sum = 0;  // model_forward_backward: the MoE load-balancing loss summed over sequences
};

// Unmasked targets in (N); throws InputError for a target outside [0, V) that is not kIgnoreIndex.
int64_t count_unmasked_targets(const int32_t* targets, int64_t N, int64_t V);

// Scratch of one call: the chunk is min(chunk_tokens, N) rows, so the (chunk x V) logits dominate.
template <typename Real>
int64_t fused_cross_entropy_workspace_bytes(int64_t N, int64_t C, int64_t V, int64_t chunk_tokens,
                                            bool with_grad);

// h (N, C), w (V, C), targets (N). With dh != nullptr also: dh (N, C) = d(grad_scale * loss_sum)/dh
// (overwritten) and dw (V, C) += d(grad_scale * loss_sum)/dw (accumulated). dh == nullptr: loss only
// (dw is then ignored). softcap > 0 (Gemma 4's final_logit_softcapping): the logits are
// softcap * tanh(h W^T / softcap), and the gradient passes through the tanh.
template <typename Real>
LossResult fused_linear_cross_entropy(const Real* h, const Real* w, const int32_t* targets, int64_t N,
                                      int64_t C, int64_t V, int64_t chunk_tokens, double grad_scale, Real* dh,
                                      Real* dw, Workspace ws, double softcap = 0);

}  // namespace slidedp::kernels
