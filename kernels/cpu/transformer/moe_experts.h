// The routed half of a mixture-of-experts block, shared by Gemma 4 (26B-A4B) and Qwen3.6 (35B-A3B):
//
//   p = softmax(logits)                  over all E experts, per token
//   (w, idx) = topk(p, K);  w /= sum(w)  renormalised (both families always renormalise)
//   y[t] = sum_k w[t,k] * down_e(act(gate_e(z[t])) * up_e(z[t])),  e = idx[t,k]
//
// with the experts packed as the checkpoints store them: gate_up [E, 2*Ie, C] (gate rows first) and
// down [E, C, Ie]. The experts run as a grouped GEMM: the (token, slot) pairs are sorted by expert
// (stable, so token order within an expert), each expert's rows are gathered into one contiguous
// block and multiplied by that expert's weights. What the router feeds in (Gemma's norm, scale and
// per-expert scale; Qwen's plain projection) and the shared parts stay with each family's layer.
//
// Deterministic: the per-expert GEMMs write disjoint rows and disjoint weight gradients, and every
// token sums its K slots in slot order, so results are bitwise independent of the thread count.
// Ties in top-k go to the lower expert index; top-k is not differentiable, so backward follows the
// chosen experts only (the gradient flows into the router through the weights w, as in the reference).
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"

namespace slidedp::kernels {

enum class ExpertActivation { kGeluTanh, kSilu };  // Gemma 4 GeGLU, Qwen SwiGLU

struct MoeSpec {
  int64_t C = 0;   // hidden size
  int64_t E = 0;   // experts
  int64_t K = 0;   // experts per token
  int64_t Ie = 0;  // expert intermediate size
  ExpertActivation activation = ExpertActivation::kGeluTanh;
  int64_t threads = 1;  // workers over experts (forward and backward) and over tokens (combine)
};

// probs (N, E) = softmax(logits (N, E)); idx (N, K) the top-K experts in descending probability
// (ties: lower index first); w (N, K) their probabilities renormalised to sum 1.
template <typename Real>
void router_topk_forward(Real* probs, int32_t* idx, Real* w, const Real* logits, int64_t N, int64_t E,
                         int64_t K);

// dlogits (N, E), overwritten, from dw (N, K). The renormalised weights are a softmax over the
// chosen logits alone (the full softmax's normaliser cancels), so the unchosen experts get zero.
template <typename Real>
void router_topk_backward(Real* dlogits, const Real* dw, const Real* probs, const int32_t* idx, int64_t N,
                          int64_t E, int64_t K);

// Saved state of the experts: the gate and up projections of every routed row, in the sorted
// (expert-major) row order, 2 * N * K * Ie values.
template <typename Real>
int64_t experts_saved_bytes(const MoeSpec& s, int64_t N);
template <typename Real>
int64_t experts_forward_workspace_bytes(const MoeSpec& s, int64_t N);
template <typename Real>
int64_t experts_backward_workspace_bytes(const MoeSpec& s, int64_t N);

// y (N, C) overwritten with the weighted sum of each token's K experts applied to z (N, C).
template <typename Real>
void experts_forward(const MoeSpec& s, const Real* gate_up, const Real* down, const Real* z,
                     const int32_t* idx, const Real* w, Real* y, Workspace saved, int64_t N, Workspace ws);

// From dy (N, C): dz (N, C) and dw (N, K) overwritten; dgate_up, ddown accumulated.
template <typename Real>
void experts_backward(const MoeSpec& s, const Real* gate_up, const Real* down, const Real* z,
                      const int32_t* idx, const Real* w, Workspace saved, const Real* dy, Real* dz, Real* dw,
                      Real* dgate_up, Real* ddown, int64_t N, Workspace ws);

}  // namespace slidedp::kernels
