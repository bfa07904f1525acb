// One Gemma 4 decoder layer (Gemma4TextDecoderLayer, text path) as a unit the executor streams:
//
//   h  = norm_in(x)                                   RMSNorm x * w (w near 1, no +1)
//   q  = RoPE(q_norm(h Wq^T)), k = RoPE(k_norm(h Wk^T))        per head, over head_dim
//   v  = v_norm(h Wv^T), or v_norm(h Wk^T) on K=V layers      weightless norm; the raw k projection
//   att = attention(q, k, v), scale 1, sliding window on sliding layers, GQA
//   h1 = x + norm_post_attn(att Wo^T)
//   d  = down(gelu_tanh(z Wg^T) * (z Wu^T)),  z = norm_pre_ff(h1)
//   h2 = h1 + norm_post_ff(d)
//   y  = h2 * layer_scalar
//
// On mixture-of-experts layers (26B-A4B) the feed-forward branch is the dense MLP plus the experts:
//   r  = rmsnorm_noscale(h1) * router_scale * C^-1/2;  p = softmax(r Wr^T);  top-k, renormalised
//   w  = w_topk * per_expert_scale[idx]
//   d  = norm_post_ff_1(d_dense) + norm_post_ff_2(experts(norm_pre_ff_2(h1), idx, w))
// The router sees the un-normalised h1 (moe_experts.h holds the routed part).
//
// shared/reference/model-families.md section 2.4 is the source of every step. The unit follows the
// Llama unit's contract (llama_layer.h): forward writes y and the saved state (everything backward
// needs but x), recompute refills the saved state bitwise, backward overwrites dx and ACCUMULATES
// every parameter gradient into the flat gradient buffer. layer_scalar is a buffer in transformers
// (loaded from the checkpoint, never trained): its gradient stays zero, so AdamW leaves it as it is.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cpu/transformer/router_aux_loss.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

struct Gemma4LayerSpec {
  int64_t C = 0, H = 0, KV = 0, hd = 0, I = 0;
  double eps = 1e-6;
  int64_t window = 0;            // sliding window (0: full attention)
  bool k_eq_v = false;           // values from k_proj (global layers of 31B / 26B-A4B)
  std::vector<double> inv_freq;  // (hd/2), zeros for the unrotated pairs of proportional RoPE
  int64_t flat_numel = 0;
  // Element offsets in the unit's flat buffer (kAbsent when absent).
  int64_t input_norm = 0, q_w = 0, k_w = 0, v_w = kAbsent, o_w = 0, q_norm = 0, k_norm = 0,
          post_attn_norm = 0, pre_ff_norm = 0, gate_w = 0, up_w = 0, down_w = 0, post_ff_norm = 0,
          layer_scalar = 0;
  // The MoE block (moe.E == 0: a dense layer) and its tensors' offsets.
  MoeSpec moe;
  int64_t post_ff_norm_1 = kAbsent, router_w = kAbsent, router_scale = kAbsent, per_expert_scale = kAbsent,
          pre_ff_norm_2 = kAbsent, experts_gate_up = kAbsent, experts_down = kAbsent, post_ff_norm_2 = kAbsent;
  int64_t attn_tile = 64;  // as DecoderSpec::attn_tile
  int64_t threads = 1;     // as DecoderSpec::threads

  int64_t q_dim() const { return H * hd; }
  int64_t kv_dim() const { return KV * hd; }
  bool has_moe() const { return moe.E > 0; }
};

// The spec of decoder unit `unit` (its layer's shape from card.layer()).
Gemma4LayerSpec make_gemma4_layer_spec(const ModelCard& card, const UnitLayout& unit);
// Throws (a bug) when the spec or B, T cannot be one Gemma 4 layer's; both backends' units call it.
void check_gemma4_layer_spec(const Gemma4LayerSpec& spec, int64_t B, int64_t T);

template <typename Real>
int64_t gemma4_saved_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t gemma4_forward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t gemma4_backward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);

// x, y (B, T, C); saved: gemma4_saved_bytes() bytes. On MoE layers `router` (if given) receives
// this layer's router statistics (router_aux_loss.h); recompute never adds them a second time.
// `positions` (B, T): document positions of packed sequences (attention.h), or null.
template <typename Real>
void gemma4_forward(const Gemma4LayerSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                    int64_t B, int64_t T, Workspace ws, const RouterStats* router = nullptr,
                    const int32_t* positions = nullptr);
template <typename Real>
void gemma4_recompute(const Gemma4LayerSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                      int64_t T, Workspace ws, const int32_t* positions = nullptr);
// dx (B, T, C) overwritten; grads (flat) += dL/dparams (layer_scalar's stays untouched). `router`
// (complete statistics of every layer's forward) adds the load-balancing loss's gradient.
template <typename Real>
void gemma4_backward(const Gemma4LayerSpec& spec, const Real* params, const Real* x, Workspace saved,
                     const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                     const RouterStats* router = nullptr, const int32_t* positions = nullptr);

// The family's operations under the names every family provides: layer_spec.h's LayerSpec holds one
// alternative per family and layer_dispatch.cc visits it once per operation.
inline int64_t layer_flat_numel(const Gemma4LayerSpec& s) { return s.flat_numel; }
inline Gemma4LayerSpec make_layer_spec(const Gemma4Family& /*family*/, const ModelCard& card,
                                       const UnitLayout& unit) {
  return make_gemma4_layer_spec(card, unit);
}
inline int64_t layer_moe_experts(const Gemma4LayerSpec& s) { return s.has_moe() ? s.moe.E : 0; }
inline void layer_set_threads(Gemma4LayerSpec& s, int64_t threads) { s.threads = threads; }
// False when the family cannot tile its MLP (rows > 0); the caller names the plan key.
inline bool layer_set_mlp_token_tile(Gemma4LayerSpec&, int64_t rows) { return rows == 0; }
template <typename Real>
int64_t layer_saved_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_saved_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_forward_workspace_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_forward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_backward_workspace_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_backward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
void layer_forward(const Gemma4LayerSpec& s, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  gemma4_forward(s, params, x, y, saved, B, T, ws, router, positions);
}
template <typename Real>
void layer_recompute(const Gemma4LayerSpec& s, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions) {
  gemma4_recompute(s, params, x, saved, B, T, ws, positions);
}
template <typename Real>
void layer_backward(const Gemma4LayerSpec& s, const Real* params, const Real* x, Workspace saved,
                    const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* router, const int32_t* positions) {
  gemma4_backward(s, params, x, saved, dy, dx, grads, B, T, ws, router, positions);
}

}  // namespace slidedp::kernels
