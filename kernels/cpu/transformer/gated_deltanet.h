// The Gated DeltaNet token mixer of Qwen3.6 / Qwen3.5 (Qwen3_5GatedDeltaNet; the math in
// shared/reference/model-families.md section 3.4 item 5), on an already normalised input h (N, C):
//
//   mixed = h W_qkv^T                       (N, 2 nk dk + nv dv), rows q | k | v
//   a     = silu(causal depthwise conv1d(mixed)),  kernel K, per segment (zero before its start)
//   q = l2norm(a_q) dk^-1/2,  k = l2norm(a_k),  v = a_v         l2norm: x / sqrt(sum x^2 + 1e-6), per head
//   z = h W_z^T,  beta = sigmoid(h W_b^T),  g = -exp(A_log) softplus(h W_a^T + dt_bias)
//   o = gated delta rule(q, k, v, g, beta)  (gated_delta_rule.h; value head h reads key head h / (nv/nk))
//   y = (w_norm * rmsnorm(o) * silu(z)) W_out^T      rmsnorm per value head over dv, plain weight w
//
// Segments (documents of a packed sequence) restart both the conv window and the recurrent state.
// Saved by the forward: mixed, z, the b and a projections, o and the norm's rstd; the conv output,
// q, k, beta, g and the gated norm are recomputed by the backward (a few elementwise passes).
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/gated_delta_rule.h"

namespace slidedp::kernels {

struct DeltaNetSpec {
  int64_t C = 0;                   // hidden size
  int64_t nk = 0, nv = 0;          // key and value heads (nv a multiple of nk)
  int64_t dk = 0, dv = 0;          // head dims
  int64_t conv_kernel = 4;         // depthwise conv taps
  double norm_eps = 1e-6;          // the gated RMSNorm's epsilon (the config's rms_norm_eps)
  int64_t chunk = 64;              // delta rule chunk
  int64_t threads = 1;             // workers of the delta rule and the elementwise passes

  int64_t key_dim() const { return nk * dk; }
  int64_t value_dim() const { return nv * dv; }
  int64_t qkv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The mixer's weights as the checkpoint stores them ([out, in] row-major).
template <typename T>
struct DeltaNetWeights {
  T* in_proj_qkv = nullptr;  // (qkv_dim, C)
  T* in_proj_z = nullptr;    // (value_dim, C)
  T* in_proj_b = nullptr;    // (nv, C)
  T* in_proj_a = nullptr;    // (nv, C)
  T* conv = nullptr;         // (qkv_dim, 1, conv_kernel)
  T* dt_bias = nullptr;      // (nv)
  T* A_log = nullptr;        // (nv)
  T* norm = nullptr;         // (dv)
  T* out_proj = nullptr;     // (C, value_dim)
};

template <typename Real>
int64_t deltanet_saved_bytes(const DeltaNetSpec& s, int64_t N);
// Sized for an extent (gated_delta_rule.h): fits every segmentation within it.
template <typename Real>
int64_t deltanet_forward_workspace_bytes(const DeltaNetSpec& s, DeltaRuleExtent e);
template <typename Real>
int64_t deltanet_backward_workspace_bytes(const DeltaNetSpec& s, DeltaRuleExtent e);

// y (N, C) overwritten, or added to when accumulate_y (the residual add). N = seg.offsets[seg.count].
template <typename Real>
void deltanet_forward(const DeltaNetSpec& s, DeltaRuleSegments seg, const DeltaNetWeights<const Real>& w,
                      const Real* h, Real* y, bool accumulate_y, Workspace saved, Workspace ws);

// From dy (N, C): dh (N, C) overwritten (or added to when accumulate_dh); every weight gradient in
// dw accumulated.
template <typename Real>
void deltanet_backward(const DeltaNetSpec& s, DeltaRuleSegments seg, const DeltaNetWeights<const Real>& w,
                       const Real* h, Workspace saved, const Real* dy, Real* dh, bool accumulate_dh,
                       const DeltaNetWeights<Real>& dw, Workspace ws);

}  // namespace slidedp::kernels
