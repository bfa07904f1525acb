// The device buffers of the Gemma 4 decoder unit on the GPU (kernels/cuda/gemma4_unit.cc): its carve
// sequences, which the unit runs over device memory and the size queries over nothing, as
// unit_scratch.h does for the Llama family. No CUDA type here: the memory account sizes these units on
// a machine without CUDA. Mixture-of-experts layers add the routed branch's parts (the experts' own in
// moe_scratch.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/gemma4_layer.h"
#include "kernels/cuda/moe_scratch.h"
#include "kernels/cuda/unit_scratch.h"

namespace slidedp::kernels::cuda {

// The routed branch's saved state (MoE layers).
template <typename Bf16>
struct Gemma4SavedMoe {
  float* rstd_p1;      // (N) post_feedforward_layernorm_1 1/rms
  Bf16* dsum;          // (N, C) norm_post_ff_1(d) + norm_post_ff_2(eo), post_feedforward_layernorm's input
  float* rstd_r;       // (N) the router norm's 1/rms
  Bf16* r;             // (N, C) rmsnorm(h1) * router.scale (its C^-1/2 is the router GEMM's alpha)
  float* rstd_z2;      // (N) pre_feedforward_layernorm_2 1/rms
  Bf16* z2;            // (N, C) its output, the experts' input
  float* probs;        // (N, E) router softmax
  int32_t* idx;        // (N, K) chosen experts
  float* w_renorm;     // (N, K) their renormalised probabilities
  float* w;            // (N, K) times per_expert_scale: the experts' weights
  std::byte* experts;  // moe_scratch.h's experts saved state
  Bf16* eo;            // (N, C) the experts' output
  float* rstd_p2;      // (N) post_feedforward_layernorm_2 1/rms
};
template <typename Bf16>
Gemma4SavedMoe<Bf16> carve_gemma4_saved_moe(Carver& a, const Gemma4LayerSpec& s, int64_t N) {
  const int64_t E = s.moe.E, K = s.moe.K;
  Gemma4SavedMoe<Bf16> v{};
  v.rstd_p1 = a.take<float>(N, "rstd_p1");
  v.dsum = a.take<Bf16>(N * s.C, "dsum");
  v.rstd_r = a.take<float>(N, "rstd_router");
  v.r = a.take<Bf16>(N * s.C, "router input");
  v.rstd_z2 = a.take<float>(N, "rstd_z2");
  v.z2 = a.take<Bf16>(N * s.C, "z2");
  v.probs = a.take<float>(N * E, "router probabilities");
  v.idx = a.take<int32_t>(N * K, "chosen experts");
  v.w_renorm = a.take<float>(N * K, "renormalised weights");
  v.w = a.take<float>(N * K, "expert weights");
  v.experts = a.take<std::byte>(experts_saved_bytes(s.moe, N), "experts' saved rows");
  v.eo = a.take<Bf16>(N * s.C, "experts' output");
  v.rstd_p2 = a.take<float>(N, "rstd_p2");
  return v;
}

// Views of the saved state (N = B*T tokens): what backward reads besides x.
template <typename Bf16>
struct Gemma4Saved {
  float* rstd_in;    // (N) input_layernorm 1/rms
  Bf16* h;           // (N, C) its output
  Bf16* q_lin;       // (N, H, hd) q_proj output
  Bf16* k_lin;       // (N, KV, hd) k_proj output (the values' input too on K=V layers)
  Bf16* v_lin;       // (N, KV, hd) v_proj output                     [not on K=V layers]
  float* rstd_q;     // (N, H)
  float* rstd_k;     // (N, KV)
  float* rstd_v;     // (N, KV) the weightless v_norm's
  Bf16* q;           // (N, H, hd) after q_norm and RoPE
  Bf16* k;           // (N, KV, hd) after k_norm and RoPE
  Bf16* v;           // (N, KV, hd) after v_norm
  Bf16* att;         // (N, H, hd)
  float* lse;        // (B, H, T)
  Bf16* a;           // (N, C) o_proj output
  float* rstd_pa;    // (N) post_attention_layernorm 1/rms
  Bf16* h1;          // (N, C) residual stream after attention
  float* rstd_pf;    // (N) pre_feedforward_layernorm 1/rms
  Bf16* z;           // (N, C) its output
  Bf16* g;           // (N, I)
  Bf16* u;           // (N, I)
  Bf16* d;           // (N, C) down_proj output
  float* rstd_post;  // (N) post_feedforward_layernorm 1/rms
  Gemma4SavedMoe<Bf16> moe;  // MoE layers only
};
template <typename Bf16>
Gemma4Saved<Bf16> carve_gemma4_saved(Carver& a, const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T, Q = s.q_dim(), K = s.kv_dim();
  Gemma4Saved<Bf16> v{};
  v.rstd_in = a.take<float>(N, "rstd_in");
  v.h = a.take<Bf16>(N * s.C, "h");
  v.q_lin = a.take<Bf16>(N * Q, "q_lin");
  v.k_lin = a.take<Bf16>(N * K, "k_lin");
  v.v_lin = s.k_eq_v ? nullptr : a.take<Bf16>(N * K, "v_lin");
  v.rstd_q = a.take<float>(N * s.H, "rstd_q");
  v.rstd_k = a.take<float>(N * s.KV, "rstd_k");
  v.rstd_v = a.take<float>(N * s.KV, "rstd_v");
  v.q = a.take<Bf16>(N * Q, "q");
  v.k = a.take<Bf16>(N * K, "k");
  v.v = a.take<Bf16>(N * K, "v");
  v.att = a.take<Bf16>(N * Q, "att");
  v.lse = a.take<float>(B * s.H * T, "lse");
  v.a = a.take<Bf16>(N * s.C, "a");
  v.rstd_pa = a.take<float>(N, "rstd_pa");
  v.h1 = a.take<Bf16>(N * s.C, "h1");
  v.rstd_pf = a.take<float>(N, "rstd_pf");
  v.z = a.take<Bf16>(N * s.C, "z");
  v.g = a.take<Bf16>(N * s.I, "g");
  v.u = a.take<Bf16>(N * s.I, "u");
  v.d = a.take<Bf16>(N * s.C, "d");
  v.rstd_post = a.take<float>(N, "rstd_post");
  if (s.has_moe()) v.moe = carve_gemma4_saved_moe<Bf16>(a, s, N);
  return v;
}

// Forward scratch: the cuBLASLt workspace, the GeGLU product m (N, I), and a norm output: the routed
// branch's normed experts (MoE layers), then the post-feed-forward norm's (recompute, which has no y
// to write it into). MoE layers add the router logits and the experts' scratch.
template <typename Bf16>
struct Gemma4Forward {
  void* gemm_ws;
  Bf16* m;             // (N, I)
  Bf16* post;          // (N, C)
  float* logits;       // (N, E)                      [MoE layers]
  std::byte* experts;  // moe_scratch.h's experts forward scratch  [MoE layers]
};
template <typename Bf16>
Gemma4Forward<Bf16> carve_gemma4_forward(Carver& a, const Gemma4LayerSpec& s, int64_t N) {
  Gemma4Forward<Bf16> f{};
  f.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  f.m = a.take<Bf16>(N * s.I, "m");
  f.post = a.take<Bf16>(N * s.C, "post-norm output");
  if (s.has_moe()) {
    f.logits = a.take<float>(N * s.moe.E, "router logits");
    f.experts = a.take<std::byte>(experts_forward_workspace_bytes(s.moe, N), "experts' forward scratch");
  }
  return f;
}

// Backward scratch: what lives throughout, then the MLP part and the attention part in the same bytes.
template <typename Bf16>
struct Gemma4BackwardCommon {
  void* gemm_ws;
  float* dh1;    // (N, C) fp32 gradient of h1, the residual stream between the blocks
  float* dc;     // (N, C) fp32 sums of GEMMs: dz, then dh (the input norm's output)
  void* reduce;  // norm-weight gradient partials
};
template <typename Bf16>
struct Gemma4BackwardMlp {
  Bf16* dd;     // (N, C) gradient of d (the post-feed-forward norm's input)
  Bf16* m_du;   // (N, I) recomputed gelu(g) * u, then du
  Bf16* dm_dg;  // (N, I) dm, then dg
};
// The routed branch's backward scratch (MoE layers), inside the MLP part's bytes.
template <typename Bf16>
struct Gemma4BackwardMoe {
  Bf16* dd_dense;        // (N, C) gradient of the dense MLP's output d (through post_ff_norm_1)
  Bf16* deo;             // (N, C) gradient of the experts' output
  float* dz2;            // (N, C) gradient of the experts' input, then of the router's input
  float* dw;             // (N, K) of the experts' weights, then of the renormalised ones
  float* dlogits;        // (N, E)
  Bf16* dlogits_bf16;    // (N, E) the router GEMMs' operand
  std::byte* experts;    // moe_scratch.h's experts backward scratch
};
template <typename Bf16>
Gemma4BackwardMoe<Bf16> carve_gemma4_backward_moe(Carver& a, const Gemma4LayerSpec& s, int64_t N) {
  Gemma4BackwardMoe<Bf16> m{};
  m.dd_dense = a.take<Bf16>(N * s.C, "dd_dense");
  m.deo = a.take<Bf16>(N * s.C, "deo");
  m.dz2 = a.take<float>(N * s.C, "dz2 / dr");
  m.dw = a.take<float>(N * s.moe.K, "dw");
  m.dlogits = a.take<float>(N * s.moe.E, "dlogits");
  m.dlogits_bf16 = a.take<Bf16>(N * s.moe.E, "dlogits bf16");
  m.experts = a.take<std::byte>(experts_backward_workspace_bytes(s.moe, N), "experts' backward scratch");
  return m;
}

template <typename Bf16>
struct Gemma4BackwardAttention {
  Bf16* da;       // (N, C) gradient of a (post_attention_layernorm's input)
  Bf16* datt;     // (N, H, hd) gradient of the attention output, then of q_lin
  Bf16* dq;       // (N, H, hd)
  Bf16* dk;       // (N, KV, hd)
  Bf16* dv;       // (N, KV, hd)
  Bf16* dk_lin;   // (N, KV, hd) k_proj's output gradient (plus the values' on K=V layers)
  Bf16* dv_lin;   // (N, KV, hd)                                  [not on K=V layers]
  float* dk_sum;  // (N, KV, hd) fp32 sum of k_norm's and v_norm's gradients  [K=V layers]
  float* attn;    // attention backward scratch (B, H, T)
};

inline int64_t gemma4_reduce_bytes(const Gemma4LayerSpec& s, int64_t N) {
  return std::max({rmsnorm_backward_workspace_bytes(N, s.C), rmsnorm_backward_workspace_bytes(N * s.H, s.hd),
                   rmsnorm_backward_workspace_bytes(N * s.KV, s.hd)});
}
template <typename Bf16>
Gemma4BackwardCommon<Bf16> carve_gemma4_backward_common(Carver& a, const Gemma4LayerSpec& s, int64_t N) {
  Gemma4BackwardCommon<Bf16> c{};
  c.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  c.dh1 = a.take<float>(N * s.C, "dh1");
  c.dc = a.take<float>(N * s.C, "dz / dh");
  c.reduce = a.take<std::byte>(gemma4_reduce_bytes(s, N), "gradient reduction partials");
  return c;
}
template <typename Bf16>
Gemma4BackwardMlp<Bf16> carve_gemma4_backward_mlp(Carver& a, const Gemma4LayerSpec& s, int64_t N) {
  Gemma4BackwardMlp<Bf16> m{};
  m.dd = a.take<Bf16>(N * s.C, "dd");
  m.m_du = a.take<Bf16>(N * s.I, "m / du");
  m.dm_dg = a.take<Bf16>(N * s.I, "dm / dg");
  return m;
}
template <typename Bf16>
Gemma4BackwardAttention<Bf16> carve_gemma4_backward_attention(Carver& a, const Gemma4LayerSpec& s, int64_t B,
                                                              int64_t T) {
  const int64_t N = B * T, Q = s.q_dim(), K = s.kv_dim();
  Gemma4BackwardAttention<Bf16> v{};
  v.da = a.take<Bf16>(N * s.C, "da");
  v.datt = a.take<Bf16>(N * Q, "datt");
  v.dq = a.take<Bf16>(N * Q, "dq");
  v.dk = a.take<Bf16>(N * K, "dk");
  v.dv = a.take<Bf16>(N * K, "dv");
  v.dk_lin = a.take<Bf16>(N * K, "dk_lin");
  if (s.k_eq_v)
    v.dk_sum = a.take<float>(N * K, "dk_lin fp32 sum");
  else
    v.dv_lin = a.take<Bf16>(N * K, "dv_lin");
  v.attn = reinterpret_cast<float*>(
      a.take<std::byte>(attention_backward_workspace_bytes(B, s.H, T), "attention D"));
  return v;
}

// ---- sizes (bytes), from the sequences above ----
int64_t gemma4_saved_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);
int64_t gemma4_forward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);  // also recompute
int64_t gemma4_backward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T);
// The same under the names every family's GPU layer provides (visited per layer by the memory account).
inline int64_t layer_saved_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_saved_bytes(s, B, T);
}
inline int64_t layer_forward_workspace_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_forward_workspace_bytes(s, B, T);
}
inline int64_t layer_backward_workspace_bytes(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  return gemma4_backward_workspace_bytes(s, B, T);
}

}  // namespace slidedp::kernels::cuda
