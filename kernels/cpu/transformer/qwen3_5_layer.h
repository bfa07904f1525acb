// One Qwen3.6 / Qwen3.5 decoder layer (Qwen3_5DecoderLayer, text path) as a unit the executor streams:
//
//   h   = norm_in(x)                  zero-centred RMSNorm: x * rsqrt(mean x^2 + eps) * (1 + w)
//   mix = GatedDeltaNet(h)            on linear-attention layers (gated_deltanet.h), or
//   mix = (attention(q, k, v) * sigmoid(gate)) Wo^T      on full-attention layers, where
//         [q | gate] per head = h Wq^T,  q = RoPE_partial(q_norm(q)),  k = RoPE_partial(k_norm(h Wk^T)),
//         v = h Wv^T; q/k norms zero-centred, RoPE on the first rotary_dim channels of each head
//         (pairs (j, j + rotary_dim / 2)), causal GQA attention scaled by head_dim^-1/2
//   h1  = x + mix
//   u   = norm_post(h1)               zero-centred
//   ffn = down(silu(u Wg^T) * (u Wu^T))                                            dense layers, or
//   ffn = sum_k w_k expert_k(u) + sigmoid(u w_sg) shared(u)                        MoE layers:
//         softmax router (no bias), top-k renormalised, SwiGLU experts (moe_experts.h) and a SwiGLU
//         shared expert scaled per token by its sigmoid gate
//   y   = h1 + ffn
//
// shared/reference/model-families.md section 3.4 is the source of every step. Each sequence of the
// batch is one segment of the DeltaNet (its conv window and state start at zero); with document
// positions (attention.h), so is each packed document, and attention and RoPE restart there too,
// so a packed sequence computes what its documents would alone (the reference's pure-PyTorch path
// does not reset). The unit follows
// the Llama unit's contract (llama_layer.h): forward writes y and the saved state, recompute
// refills the saved state bitwise, backward overwrites dx and ACCUMULATES every parameter gradient
// into the flat gradient buffer. The optional router auxiliary loss is not built (off by default in
// the reference's fine-tuning recipes).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/gated_deltanet.h"
#include "kernels/cpu/transformer/moe_experts.h"
#include "kernels/cpu/transformer/router_aux_loss.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

struct Qwen35LayerSpec {
  int64_t C = 0;
  double eps = 1e-6;
  bool linear = false;  // Gated DeltaNet (true) or gated full attention
  DeltaNetSpec gdn;     // linear layers
  // Full-attention layers: heads, head dim, the rotated leading channels and their frequencies.
  int64_t H = 0, KV = 0, hd = 0, rotary_dim = 0;
  std::vector<double> inv_freq;  // (rotary_dim / 2)
  int64_t I = 0;                 // dense MLP (0 on MoE layers)
  MoeSpec moe;                   // MoE layers (moe.E == 0: dense)
  int64_t Is = 0;                // the shared expert's intermediate size
  int64_t flat_numel = 0;
  // Element offsets in the unit's flat buffer (kAbsent when absent).
  int64_t input_norm = 0, post_attn_norm = 0;
  int64_t qkv_w = kAbsent, z_w = kAbsent, b_w = kAbsent, a_w = kAbsent, conv_w = kAbsent, dt_bias = kAbsent,
          A_log = kAbsent, gdn_norm = kAbsent, out_w = kAbsent;
  int64_t q_w = kAbsent, k_w = kAbsent, v_w = kAbsent, o_w = kAbsent, q_norm = kAbsent, k_norm = kAbsent;
  int64_t gate_w = kAbsent, up_w = kAbsent, down_w = kAbsent;
  int64_t router_w = kAbsent, experts_gate_up = kAbsent, experts_down = kAbsent, shared_gate_w = kAbsent,
          shared_up_w = kAbsent, shared_down_w = kAbsent, shared_gate_logit_w = kAbsent;
  int64_t attn_tile = 64;  // as DecoderSpec::attn_tile
  int64_t threads = 1;     // as DecoderSpec::threads

  int64_t q_dim() const { return H * hd; }
  int64_t kv_dim() const { return KV * hd; }
  bool has_moe() const { return moe.E > 0; }
};

// The spec of decoder unit `unit` (its layer's shape from card.layer()).
Qwen35LayerSpec make_qwen3_5_layer_spec(const ModelCard& card, const UnitLayout& unit);
// Throws (a bug) when the spec or B, T cannot be one Qwen3.5 layer's; both backends' units call it.
void check_qwen3_5_layer_spec(const Qwen35LayerSpec& spec, int64_t B, int64_t T);

template <typename Real>
int64_t qwen3_5_saved_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t qwen3_5_forward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t qwen3_5_backward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);

// x, y (B, T, C); saved: qwen3_5_saved_bytes() bytes. `router`: as gemma4_forward's. `positions`
// (B, T): document positions of packed sequences (attention.h), or null. The workspace sizes fit
// any documents.
template <typename Real>
void qwen3_5_forward(const Qwen35LayerSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                     int64_t B, int64_t T, Workspace ws, const RouterStats* router = nullptr,
                     const int32_t* positions = nullptr);
template <typename Real>
void qwen3_5_recompute(const Qwen35LayerSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                       int64_t T, Workspace ws, const int32_t* positions = nullptr);
// dx (B, T, C) overwritten; grads (flat) += dL/dparams.
template <typename Real>
void qwen3_5_backward(const Qwen35LayerSpec& spec, const Real* params, const Real* x, Workspace saved,
                      const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                      const RouterStats* router = nullptr, const int32_t* positions = nullptr);

// The family's operations under the names every family provides: layer_spec.h's LayerSpec holds one
// alternative per family and layer_dispatch.cc visits it once per operation.
inline int64_t layer_flat_numel(const Qwen35LayerSpec& s) { return s.flat_numel; }
inline Qwen35LayerSpec make_layer_spec(const Qwen35Family& /*family*/, const ModelCard& card,
                                       const UnitLayout& unit) {
  return make_qwen3_5_layer_spec(card, unit);
}
inline int64_t layer_moe_experts(const Qwen35LayerSpec& s) { return s.has_moe() ? s.moe.E : 0; }
inline void layer_set_threads(Qwen35LayerSpec& s, int64_t threads) {
  s.threads = threads;
  s.gdn.threads = threads;
}
// False when the family cannot tile its MLP (rows > 0); the caller names the plan key.
inline bool layer_set_mlp_token_tile(Qwen35LayerSpec&, int64_t rows) { return rows == 0; }
template <typename Real>
int64_t layer_saved_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_saved_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_forward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_forward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_backward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_backward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
void layer_forward(const Qwen35LayerSpec& s, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  qwen3_5_forward(s, params, x, y, saved, B, T, ws, router, positions);
}
template <typename Real>
void layer_recompute(const Qwen35LayerSpec& s, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions) {
  qwen3_5_recompute(s, params, x, saved, B, T, ws, positions);
}
template <typename Real>
void layer_backward(const Qwen35LayerSpec& s, const Real* params, const Real* x, Workspace saved,
                    const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* router, const int32_t* positions) {
  qwen3_5_backward(s, params, x, saved, dy, dx, grads, B, T, ws, router, positions);
}

}  // namespace slidedp::kernels
