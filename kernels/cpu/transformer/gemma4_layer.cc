// Gemma 4 decoder layer forward / recompute / backward on the CPU; see gemma4_layer.h. Like
// llama_layer.cc the carve functions are the single source of the buffer sizes.
#include "kernels/cpu/transformer/gemma4_layer.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/geglu.h"
#include "kernels/cpu/transformer/linear.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/rope.h"

namespace slidedp::kernels {
namespace {

// Views of the saved state (N = B*T tokens).
template <typename Real>
struct Saved {
  Real* rstd_in;    // (N) input_layernorm 1/rms
  Real* h;          // (N, C) input_layernorm output
  Real* q_lin;      // (N, H, hd) q_proj output
  Real* k_lin;      // (N, KV, hd) k_proj output (also the values' input on K=V layers)
  Real* v_lin;      // (N, KV, hd) v_proj output                   [not on K=V layers]
  Real* rstd_q;     // (N, H) q_norm 1/rms
  Real* rstd_k;     // (N, KV) k_norm 1/rms
  Real* rstd_v;     // (N, KV) v_norm 1/rms
  Real* q;          // (N, H, hd) after q_norm and RoPE
  Real* k;          // (N, KV, hd) after k_norm and RoPE
  Real* v;          // (N, KV, hd) after v_norm
  Real* att;        // (N, H, hd) attention output
  Real* lse;        // (B, H, T)
  Real* a;          // (N, C) o_proj output (post_attention_layernorm's input)
  Real* rstd_pa;    // (N)
  Real* h1;         // (N, C) residual after attention
  Real* rstd_pf;    // (N) pre_feedforward_layernorm 1/rms
  Real* z;          // (N, C) its output
  Real* g;          // (N, I) gate_proj output
  Real* u;          // (N, I) up_proj output
  Real* d;          // (N, C) down_proj output (post_feedforward_layernorm's input on dense layers)
  Real* rstd_post;  // (N)
  // MoE layers only
  Real* rstd_p1;      // (N) post_feedforward_layernorm_1 1/rms (its input is d)
  Real* rstd_r;       // (N) the router's norm 1/rms
  Real* r;            // (N, C) the router's input: rmsnorm(h1) * router.scale * C^-1/2
  Real* probs;        // (N, E) router softmax
  int32_t* idx;       // (N, K) chosen experts
  Real* w_renorm;     // (N, K) their renormalised probabilities
  Real* w;            // (N, K) times per_expert_scale: the experts' weights
  Real* rstd_z2;      // (N) pre_feedforward_layernorm_2 1/rms
  Real* z2;           // (N, C) its output, the experts' input
  Workspace experts;  // moe_experts.h's saved rows
  Real* eo;           // (N, C) experts' output (post_feedforward_layernorm_2's input)
  Real* rstd_p2;      // (N)
  Real* dsum;         // (N, C) dense + routed branch (post_feedforward_layernorm's input)
};

template <typename Real>
Saved<Real> carve_saved(Arena& a, const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T, Q = s.q_dim(), K = s.kv_dim();
  Saved<Real> v;
  v.rstd_in = a.take<Real>(N, "rstd_in");
  v.h = a.take<Real>(N * s.C, "h");
  v.q_lin = a.take<Real>(N * Q, "q_lin");
  v.k_lin = a.take<Real>(N * K, "k_lin");
  v.v_lin = s.k_eq_v ? nullptr : a.take<Real>(N * K, "v_lin");
  v.rstd_q = a.take<Real>(N * s.H, "rstd_q");
  v.rstd_k = a.take<Real>(N * s.KV, "rstd_k");
  v.rstd_v = a.take<Real>(N * s.KV, "rstd_v");
  v.q = a.take<Real>(N * Q, "q");
  v.k = a.take<Real>(N * K, "k");
  v.v = a.take<Real>(N * K, "v");
  v.att = a.take<Real>(N * Q, "att");
  v.lse = a.take<Real>(B * s.H * T, "lse");
  v.a = a.take<Real>(N * s.C, "a");
  v.rstd_pa = a.take<Real>(N, "rstd_pa");
  v.h1 = a.take<Real>(N * s.C, "h1");
  v.rstd_pf = a.take<Real>(N, "rstd_pf");
  v.z = a.take<Real>(N * s.C, "z");
  v.g = a.take<Real>(N * s.I, "g");
  v.u = a.take<Real>(N * s.I, "u");
  v.d = a.take<Real>(N * s.C, "d");
  v.rstd_post = a.take<Real>(N, "rstd_post");
  if (s.has_moe()) {
    const int64_t E = s.moe.E, top_k = s.moe.K;
    v.rstd_p1 = a.take<Real>(N, "rstd_p1");
    v.rstd_r = a.take<Real>(N, "rstd_r");
    v.r = a.take<Real>(N * s.C, "r");
    v.probs = a.take<Real>(N * E, "probs");
    v.idx = a.take<int32_t>(N * top_k, "idx");
    v.w_renorm = a.take<Real>(N * top_k, "w_renorm");
    v.w = a.take<Real>(N * top_k, "w");
    v.rstd_z2 = a.take<Real>(N, "rstd_z2");
    v.z2 = a.take<Real>(N * s.C, "z2");
    v.experts = a.take_workspace(experts_saved_bytes<Real>(s.moe, N));
    v.eo = a.take<Real>(N * s.C, "eo");
    v.rstd_p2 = a.take<Real>(N, "rstd_p2");
    v.dsum = a.take<Real>(N * s.C, "dsum");
  }
  return v;
}

MoeSpec moe_spec(const Gemma4LayerSpec& s) {
  MoeSpec m = s.moe;
  m.threads = s.threads;
  return m;
}

// The router's input is rmsnorm(h1) * scale, times this.
template <typename Real>
Real router_input_scale(const Gemma4LayerSpec& s) {
  return static_cast<Real>(1.0 / std::sqrt(static_cast<double>(s.C)));
}

AttentionShape attention_shape(const Gemma4LayerSpec& s, int64_t B, int64_t T, const int32_t* positions = nullptr) {
  AttentionShape a{B, T, s.H, s.KV, s.hd, s.attn_tile, s.threads};
  a.positions = positions;
  a.scale = 1.0;  // Gemma 4: q.k unscaled (q and k are RMS-normed per head instead)
  a.window = s.window;
  return a;
}

// Forward scratch: the RoPE tables, then attention's scratch, then the GeGLU product m (N, I).
template <typename Real>
struct ForwardScratch {
  Real* cos;
  Real* sin;
};
template <typename Real>
ForwardScratch<Real> carve_forward_common(Arena& a, const Gemma4LayerSpec& s, int64_t T) {
  return {a.take<Real>(T * s.hd / 2), a.take<Real>(T * s.hd / 2)};
}

// Backward scratch: the tables and two (N, C) buffers live throughout; the MLP part and the
// attention part take turns in the same bytes.
template <typename Real>
struct BackwardCommon {
  Real* cos;
  Real* sin;
  Real* dh1;  // (N, C) gradient of h1 (the residual stream between the blocks)
  Real* dc;   // (N, C) dd, then dz, then da, then dh
};
template <typename Real>
BackwardCommon<Real> carve_backward_common(Arena& a, const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  return {a.take<Real>(T * s.hd / 2), a.take<Real>(T * s.hd / 2), a.take<Real>(N * s.C), a.take<Real>(N * s.C)};
}
template <typename Real>
struct BackwardMlp {
  Real* m_du;      // (N, I) recomputed gelu(g) * u, then du
  Real* dm_dg;     // (N, I) dm, then dg
  Real* dd;        // (N, C) gradient of post_feedforward_layernorm's input
  Real* dd_dense;  // (N, C) gradient of the dense MLP's output (MoE layers; dd on dense ones)
};
template <typename Real>
BackwardMlp<Real> carve_backward_mlp(Arena& a, const Gemma4LayerSpec& s, int64_t N) {
  BackwardMlp<Real> m{a.take<Real>(N * s.I), a.take<Real>(N * s.I), a.take<Real>(N * s.C), nullptr};
  m.dd_dense = s.has_moe() ? a.take<Real>(N * s.C) : m.dd;
  return m;
}
// The routed branch's backward, between the post-norm and the dense MLP.
template <typename Real>
struct BackwardMoe {
  Real* deo_dr;   // (N, C) gradient of the experts' output, then of the router's input
  Real* dz2;      // (N, C) gradient of the experts' input
  Real* dw;       // (N, K) of the experts' weights, then of the renormalised ones
  Real* dlogits;  // (N, E)
  Workspace experts;
};
template <typename Real>
BackwardMoe<Real> carve_backward_moe(Arena& a, const Gemma4LayerSpec& s, int64_t N) {
  BackwardMoe<Real> m;
  m.deo_dr = a.take<Real>(N * s.C);
  m.dz2 = a.take<Real>(N * s.C);
  m.dw = a.take<Real>(N * s.moe.K);
  m.dlogits = a.take<Real>(N * s.moe.E);
  m.experts = a.take_workspace(experts_backward_workspace_bytes<Real>(s.moe, N));
  return m;
}
// The routed branch's forward scratch: the router logits and the experts' scratch; once they are
// released, the post-norm's output (carve_forward_routed).
template <typename Real>
struct ForwardMoe {
  Real* logits;  // (N, E)
  Workspace experts;
};
template <typename Real>
ForwardMoe<Real> carve_forward_moe(Arena& a, const Gemma4LayerSpec& s, int64_t N) {
  return {a.take<Real>(N * s.moe.E, "router logits"), a.take_workspace(experts_forward_workspace_bytes<Real>(s.moe, N))};
}
template <typename Real>
Real* carve_forward_routed(Arena& a, const Gemma4LayerSpec& s, int64_t N) {
  return a.take<Real>(N * s.C, "routed branch after its norm");
}
template <typename Real>
struct BackwardAttention {
  Real* datt;    // (N, H, hd)
  Real* dq;      // (N, H, hd) of the roped q, then (in datt) of q_lin
  Real* dk;      // (N, KV, hd)
  Real* dv;      // (N, KV, hd)
  Real* dk_lin;  // (N, KV, hd) k_proj's output gradient (plus v's on K=V layers)
  Real* dv_lin;  // (N, KV, hd)
  Workspace attn;
};
template <typename Real>
BackwardAttention<Real> carve_backward_attention(Arena& a, const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  BackwardAttention<Real> v;
  v.datt = a.take<Real>(N * s.q_dim());
  v.dq = a.take<Real>(N * s.q_dim());
  v.dk = a.take<Real>(N * s.kv_dim());
  v.dv = a.take<Real>(N * s.kv_dim());
  v.dk_lin = a.take<Real>(N * s.kv_dim());
  v.dv_lin = a.take<Real>(N * s.kv_dim());
  v.attn = a.take_workspace(attention_backward_workspace_bytes<Real>(attention_shape(s, B, T)));
  return v;
}


// The routed branch: d_sum = norm_post_ff_1(d) + norm_post_ff_2(experts(norm_pre_ff_2(h1))), with
// the router on h1 (saved state complete on return).
template <typename Real>
void moe_forward(const Gemma4LayerSpec& s, const Real* p, const Saved<Real>& S, int64_t N, Arena& arena) {
  const int64_t C = s.C, E = s.moe.E, K = s.moe.K;
  const Real* const no_bias = nullptr;
  rmsnorm_forward(S.dsum, S.rstd_p1, S.d, p + s.post_ff_norm_1, N, C, s.eps);
  rmsnorm_forward(S.r, S.rstd_r, S.h1, p + s.router_scale, N, C, s.eps);
  const Real c = router_input_scale<Real>(s);
  for (int64_t i = 0; i < N * C; ++i) S.r[i] *= c;
  rmsnorm_forward(S.z2, S.rstd_z2, S.h1, p + s.pre_ff_norm_2, N, C, s.eps);
  const int64_t mark = arena.mark();
  const ForwardMoe<Real> f = carve_forward_moe<Real>(arena, s, N);
  linear_forward(f.logits, S.r, p + s.router_w, no_bias, N, C, E, false);
  router_topk_forward(S.probs, S.idx, S.w_renorm, f.logits, N, E, K);
  for (int64_t i = 0; i < N * K; ++i) S.w[i] = S.w_renorm[i] * p[s.per_expert_scale + S.idx[i]];
  experts_forward(moe_spec(s), p + s.experts_gate_up, p + s.experts_down, S.z2, S.idx, S.w, S.eo, S.experts, N,
                  f.experts);
  arena.release(mark);
  Real* routed = carve_forward_routed<Real>(arena, s, N);
  rmsnorm_forward(routed, S.rstd_p2, S.eo, p + s.post_ff_norm_2, N, C, s.eps);
  for (int64_t i = 0; i < N * C; ++i) S.dsum[i] += routed[i];
  arena.release(mark);
}

// From dd (the gradient of d_sum): the routed branch's parameter gradients, its input gradients
// added to dh1 (the experts' norm and the router's norm both read h1), and dd_dense (the dense MLP
// output's gradient through norm_post_ff_1).
template <typename Real>
void moe_backward(const Gemma4LayerSpec& s, const Real* p, const Saved<Real>& S, const Real* dd, Real* dd_dense,
                  Real* dh1, Real* dp, int64_t B, int64_t T, const RouterStats* router, Arena& arena) {
  const int64_t N = B * T;
  const int64_t C = s.C, E = s.moe.E, K = s.moe.K;
  Real* const no_bias = nullptr;
  const int64_t mark = arena.mark();
  const BackwardMoe<Real> b = carve_backward_moe<Real>(arena, s, N);
  rmsnorm_backward(b.deo_dr, dp + s.post_ff_norm_2, dd, S.eo, S.rstd_p2, p + s.post_ff_norm_2, N, C, false);
  experts_backward(moe_spec(s), p + s.experts_gate_up, p + s.experts_down, S.z2, S.idx, S.w, S.experts, b.deo_dr,
                   b.dz2, b.dw, dp + s.experts_gate_up, dp + s.experts_down, N, b.experts);
  rmsnorm_backward(dh1, dp + s.pre_ff_norm_2, b.dz2, S.h1, S.rstd_z2, p + s.pre_ff_norm_2, N, C, true);
  // w = w_renorm * per_expert_scale[idx], summed over tokens in order (deterministic)
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t e = S.idx[i];
    dp[s.per_expert_scale + e] += b.dw[i] * S.w_renorm[i];
    b.dw[i] *= p[s.per_expert_scale + e];
  }
  router_topk_backward(b.dlogits, b.dw, S.probs, S.idx, N, E, K);
  if (router != nullptr) router_aux_backward(b.dlogits, S.probs, *router, B, T, E);
  linear_backward(b.deo_dr, dp + s.router_w, no_bias, b.dlogits, S.r, p + s.router_w, N, C, E, false);
  const Real c = router_input_scale<Real>(s);
  for (int64_t i = 0; i < N * C; ++i) b.deo_dr[i] *= c;
  rmsnorm_backward(dh1, dp + s.router_scale, b.deo_dr, S.h1, S.rstd_r, p + s.router_scale, N, C, true);
  arena.release(mark);
  rmsnorm_backward(dd_dense, dp + s.post_ff_norm_1, dd, S.d, S.rstd_p1, p + s.post_ff_norm_1, N, C, false);
}

template <typename Real>
const Real* post_ff_norm_input(const Gemma4LayerSpec& s, const Saved<Real>& S) {
  return s.has_moe() ? S.dsum : S.d;
}

// Everything up to the saved state; y != nullptr also runs the rest (forward), y == nullptr stops
// where the saved state is complete (recompute). The same calls in the same order on the same
// values, so recompute is bitwise what forward saved.
template <typename Real>
void forward_impl(const Gemma4LayerSpec& s, const Real* p, const Real* x, Real* y, Workspace saved, int64_t B,
                  int64_t T, Workspace ws, const int32_t* positions) {
  check_gemma4_layer_spec(s, B, T);
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  const Real* const no_bias = nullptr;
  const Real* const no_weight = nullptr;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  const ForwardScratch<Real> f = carve_forward_common<Real>(arena, s, T);

  // attention block
  rmsnorm_forward(S.h, S.rstd_in, x, p + s.input_norm, N, C, s.eps);
  linear_forward(S.q_lin, S.h, p + s.q_w, no_bias, N, C, Q, false);
  linear_forward(S.k_lin, S.h, p + s.k_w, no_bias, N, C, K, false);
  if (!s.k_eq_v) linear_forward(S.v_lin, S.h, p + s.v_w, no_bias, N, C, K, false);
  rmsnorm_forward(S.q, S.rstd_q, S.q_lin, p + s.q_norm, N * s.H, s.hd, s.eps);
  rmsnorm_forward(S.k, S.rstd_k, S.k_lin, p + s.k_norm, N * s.KV, s.hd, s.eps);
  // K=V: the values are the raw k projection, normed without a weight, not roped
  rmsnorm_forward(S.v, S.rstd_v, s.k_eq_v ? S.k_lin : S.v_lin, no_weight, N * s.KV, s.hd, s.eps);
  rope_tables(f.cos, f.sin, s.inv_freq, T);
  rope_forward(S.q, f.cos, f.sin, B, T, s.H, s.hd, positions);
  rope_forward(S.k, f.cos, f.sin, B, T, s.KV, s.hd, positions);
  {
    const int64_t mark = arena.mark();
    const AttentionShape as = attention_shape(s, B, T, positions);
    attention_forward(S.att, S.lse, S.q, S.k, S.v, as, arena.take_workspace(attention_forward_workspace_bytes<Real>(as)));
    arena.release(mark);
  }
  linear_forward(S.a, S.att, p + s.o_w, no_bias, N, Q, C, false);
  // h1 = x + norm_post_attn(a): the norm writes into h1, then the residual is added
  rmsnorm_forward(S.h1, S.rstd_pa, S.a, p + s.post_attn_norm, N, C, s.eps);
  for (int64_t i = 0; i < N * C; ++i) S.h1[i] += x[i];

  // MLP block
  rmsnorm_forward(S.z, S.rstd_pf, S.h1, p + s.pre_ff_norm, N, C, s.eps);
  linear_forward(S.g, S.z, p + s.gate_w, no_bias, N, C, I, false);
  linear_forward(S.u, S.z, p + s.up_w, no_bias, N, C, I, false);
  {
    const int64_t mark = arena.mark();
    Real* m = arena.take<Real>(N * I, "m");
    geglu_forward(m, S.g, S.u, N * I, s.threads);
    linear_forward(S.d, m, p + s.down_w, no_bias, N, I, C, false);
    arena.release(mark);
  }
  if (s.has_moe()) moe_forward(s, p, S, N, arena);
  const Real* post_in = post_ff_norm_input(s, S);
  if (y == nullptr) {  // recompute: the saved state needs only the post-norm's 1/rms
    Real* scratch = arena.take<Real>(N * C, "post-norm output");
    rmsnorm_forward(scratch, S.rstd_post, post_in, p + s.post_ff_norm, N, C, s.eps);
    return;
  }
  // y = (h1 + norm_post_ff(d)) * layer_scalar
  rmsnorm_forward(y, S.rstd_post, post_in, p + s.post_ff_norm, N, C, s.eps);
  const Real scalar = p[s.layer_scalar];
  for (int64_t i = 0; i < N * C; ++i) y[i] = (S.h1[i] + y[i]) * scalar;
}

}  // namespace

void check_gemma4_layer_spec(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative batch or sequence length");
  SLIDEDP_CHECK(s.C > 0 && s.H > 0 && s.KV > 0 && s.hd > 0 && s.hd % 2 == 0 && s.I > 0 && s.H % s.KV == 0,
                "bad Gemma 4 layer spec");
  SLIDEDP_CHECK(static_cast<int64_t>(s.inv_freq.size()) == s.hd / 2, "inv_freq must have hd/2 entries");
  SLIDEDP_CHECK(s.k_eq_v == (s.v_w == kAbsent), "K=V layers have no v_proj, the others have one");
  SLIDEDP_CHECK(!s.has_moe() || (s.moe.C == s.C && s.moe.K <= s.moe.E && s.experts_down != kAbsent),
                "bad Gemma 4 MoE spec");
}

Gemma4LayerSpec make_gemma4_layer_spec(const ModelCard& card, const UnitLayout& unit) {
  SLIDEDP_CHECK(unit.kind == UnitKind::kDecoder && card.is_family<Gemma4Family>(),
                "make_gemma4_layer_spec needs a Gemma 4 decoder");
  const LayerShape l = card.layer(unit.layer);
  Gemma4LayerSpec s;
  s.C = card.hidden_size;
  s.H = l.num_heads;
  s.KV = l.num_kv_heads;
  s.hd = l.head_dim;
  s.I = l.intermediate_size;
  s.eps = card.rms_norm_eps;
  s.window = l.window;
  s.k_eq_v = l.k_eq_v;
  s.inv_freq = proportional_rope_inv_freq(card.layer(unit.layer));
  s.attn_tile = attention_tile_for(s.hd);
  s.flat_numel = unit.flat_numel;
  const int64_t C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  s.input_norm = tensor_offset(unit, "input_layernorm.weight", {C});
  s.q_w = tensor_offset(unit, "self_attn.q_proj.weight", {Q, C});
  s.k_w = tensor_offset(unit, "self_attn.k_proj.weight", {K, C});
  s.v_w = s.k_eq_v ? kAbsent : tensor_offset(unit, "self_attn.v_proj.weight", {K, C});
  s.o_w = tensor_offset(unit, "self_attn.o_proj.weight", {C, Q});
  s.q_norm = tensor_offset(unit, "self_attn.q_norm.weight", {s.hd});
  s.k_norm = tensor_offset(unit, "self_attn.k_norm.weight", {s.hd});
  s.post_attn_norm = tensor_offset(unit, "post_attention_layernorm.weight", {C});
  s.pre_ff_norm = tensor_offset(unit, "pre_feedforward_layernorm.weight", {C});
  s.gate_w = tensor_offset(unit, "mlp.gate_proj.weight", {I, C});
  s.up_w = tensor_offset(unit, "mlp.up_proj.weight", {I, C});
  s.down_w = tensor_offset(unit, "mlp.down_proj.weight", {C, I});
  s.post_ff_norm = tensor_offset(unit, "post_feedforward_layernorm.weight", {C});
  s.layer_scalar = tensor_offset(unit, "layer_scalar", {1});
  if (l.moe()) {
    const int64_t E = l.num_experts, Ie = l.expert_intermediate_size;
    s.moe = MoeSpec{C, E, l.experts_per_token, Ie, ExpertActivation::kGeluTanh, 1};
    s.post_ff_norm_1 = tensor_offset(unit, "post_feedforward_layernorm_1.weight", {C});
    s.router_w = tensor_offset(unit, "router.proj.weight", {E, C});
    s.router_scale = tensor_offset(unit, "router.scale", {C});
    s.per_expert_scale = tensor_offset(unit, "router.per_expert_scale", {E});
    s.pre_ff_norm_2 = tensor_offset(unit, "pre_feedforward_layernorm_2.weight", {C});
    s.experts_gate_up = tensor_offset(unit, "experts.gate_up_proj", {E, 2 * Ie, C});
    s.experts_down = tensor_offset(unit, "experts.down_proj", {E, C, Ie});
    s.post_ff_norm_2 = tensor_offset(unit, "post_feedforward_layernorm_2.weight", {C});
  }
  return s;
}

template <typename Real>
int64_t gemma4_saved_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  Arena a;
  carve_saved<Real>(a, spec, B, T);
  return a.high_water_bytes();
}

template <typename Real>
int64_t gemma4_forward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  Arena a;  // the take sequence of forward_impl
  carve_forward_common<Real>(a, spec, T);
  const int64_t mark = a.mark();
  a.take_workspace(attention_forward_workspace_bytes<Real>(attention_shape(spec, B, T)));
  a.release(mark);
  const int64_t mlp = a.mark();
  a.take<Real>(B * T * spec.I);  // m
  a.release(mlp);
  if (spec.has_moe()) {  // moe_forward's sequence
    const int64_t moe = a.mark();
    carve_forward_moe<Real>(a, spec, B * T);
    a.release(moe);
    carve_forward_routed<Real>(a, spec, B * T);
    a.release(moe);
  }
  a.take<Real>(B * T * spec.C);  // recompute's post-norm output
  return a.high_water_bytes();
}

template <typename Real>
int64_t gemma4_backward_workspace_bytes(const Gemma4LayerSpec& spec, int64_t B, int64_t T) {
  Arena a;  // the take sequence of gemma4_backward
  carve_backward_common<Real>(a, spec, B, T);
  const int64_t mark = a.mark();
  carve_backward_mlp<Real>(a, spec, B * T);
  if (spec.has_moe()) {
    const int64_t moe = a.mark();
    carve_backward_moe<Real>(a, spec, B * T);
    a.release(moe);
  }
  a.release(mark);
  carve_backward_attention<Real>(a, spec, B, T);
  return a.high_water_bytes();
}

template <typename Real>
void gemma4_forward(const Gemma4LayerSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                    int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  SLIDEDP_CHECK(y != nullptr && y != x, "gemma4_forward needs an output buffer distinct from x");
  forward_impl(spec, params, x, y, saved, B, T, ws, positions);
  if (router != nullptr && spec.has_moe()) {
    Arena saved_arena(saved);
    const Saved<Real> S = carve_saved<Real>(saved_arena, spec, B, T);
    router_stats_add(*router, S.probs, S.idx, B, T, spec.moe.E, spec.moe.K);
  }
}

template <typename Real>
void gemma4_recompute(const Gemma4LayerSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                      int64_t T, Workspace ws, const int32_t* positions) {
  forward_impl(spec, params, x, static_cast<Real*>(nullptr), saved, B, T, ws, positions);
}

template <typename Real>
void gemma4_backward(const Gemma4LayerSpec& s, const Real* p, const Real* x, Workspace saved, const Real* dy,
                     Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws, const RouterStats* router,
                     const int32_t* positions) {
  check_gemma4_layer_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  Real* const no_bias = nullptr;
  Real* const no_dw = nullptr;
  const Real* const no_weight = nullptr;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  const BackwardCommon<Real> w = carve_backward_common<Real>(arena, s, B, T);
  Real* dp = grads;  // same layout as p

  // y = h2 * layer_scalar, h2 = h1 + norm_post_ff(d): dh2 = dy * scalar flows into h1 and the norm
  const Real scalar = p[s.layer_scalar];
  for (int64_t i = 0; i < N * C; ++i) w.dh1[i] = dy[i] * scalar;
  {
    const int64_t mark = arena.mark();
    const BackwardMlp<Real> m = carve_backward_mlp<Real>(arena, s, N);
    rmsnorm_backward(m.dd, dp + s.post_ff_norm, w.dh1, post_ff_norm_input(s, S), S.rstd_post, p + s.post_ff_norm,
                     N, C, false);
    if (s.has_moe()) moe_backward(s, p, S, m.dd, m.dd_dense, w.dh1, dp, B, T, router, arena);
    // d = m Wd^T, m = gelu(g) * u recomputed (not saved: an elementwise pass costs less than N*I memory)
    geglu_forward(m.m_du, S.g, S.u, N * I, s.threads);
    linear_backward(m.dm_dg, dp + s.down_w, no_bias, m.dd_dense, m.m_du, p + s.down_w, N, I, C, false);
    geglu_backward(m.dm_dg, m.m_du, m.dm_dg, S.g, S.u, N * I, s.threads);
    // dz = dg Wg + du Wu; dWg += dg^T z; dWu += du^T z
    linear_backward(w.dc, dp + s.gate_w, no_bias, m.dm_dg, S.z, p + s.gate_w, N, C, I, false);
    linear_backward(w.dc, dp + s.up_w, no_bias, m.m_du, S.z, p + s.up_w, N, C, I, true);
    // h1 feeds the residual and pre_feedforward_layernorm
    rmsnorm_backward(w.dh1, dp + s.pre_ff_norm, w.dc, S.h1, S.rstd_pf, p + s.pre_ff_norm, N, C, true);
    arena.release(mark);
  }

  // h1 = x + norm_post_attn(a): dx = dh1 (residual), da through the norm
  std::copy(w.dh1, w.dh1 + N * C, dx);
  rmsnorm_backward(w.dc, dp + s.post_attn_norm, w.dh1, S.a, S.rstd_pa, p + s.post_attn_norm, N, C, false);
  const BackwardAttention<Real> a = carve_backward_attention<Real>(arena, s, B, T);
  // datt = da Wo; dWo += da^T att
  linear_backward(a.datt, dp + s.o_w, no_bias, w.dc, S.att, p + s.o_w, N, Q, C, false);
  attention_backward(a.dq, a.dk, a.dv, a.datt, S.q, S.k, S.v, S.att, S.lse, attention_shape(s, B, T, positions),
                     a.attn);
  rope_tables(w.cos, w.sin, s.inv_freq, T);
  rope_backward(a.dq, w.cos, w.sin, B, T, s.H, s.hd, positions);
  rope_backward(a.dk, w.cos, w.sin, B, T, s.KV, s.hd, positions);
  // through q_norm, k_norm and the weightless v_norm; datt is dead now and takes dq_lin
  rmsnorm_backward(a.datt, dp + s.q_norm, a.dq, S.q_lin, S.rstd_q, p + s.q_norm, N * s.H, s.hd, false);
  rmsnorm_backward(a.dk_lin, dp + s.k_norm, a.dk, S.k_lin, S.rstd_k, p + s.k_norm, N * s.KV, s.hd, false);
  if (s.k_eq_v) {  // the values are the raw k projection: both gradients flow into k_proj
    rmsnorm_backward(a.dk_lin, no_dw, a.dv, S.k_lin, S.rstd_v, no_weight, N * s.KV, s.hd, true);
  } else {
    rmsnorm_backward(a.dv_lin, no_dw, a.dv, S.v_lin, S.rstd_v, no_weight, N * s.KV, s.hd, false);
  }
  // dh = dq Wq + dk Wk (+ dv Wv); dW += d^T h
  linear_backward(w.dc, dp + s.q_w, no_bias, a.datt, S.h, p + s.q_w, N, C, Q, false);
  linear_backward(w.dc, dp + s.k_w, no_bias, a.dk_lin, S.h, p + s.k_w, N, C, K, true);
  if (!s.k_eq_v) linear_backward(w.dc, dp + s.v_w, no_bias, a.dv_lin, S.h, p + s.v_w, N, C, K, true);
  // dx = dh1 (residual) + input norm backward of dh
  rmsnorm_backward(dx, dp + s.input_norm, w.dc, x, S.rstd_in, p + s.input_norm, N, C, true);
}

#define SLIDEDP_INSTANTIATE(Real)                                                                             \
  template int64_t gemma4_saved_bytes<Real>(const Gemma4LayerSpec&, int64_t, int64_t);                        \
  template int64_t gemma4_forward_workspace_bytes<Real>(const Gemma4LayerSpec&, int64_t, int64_t);            \
  template int64_t gemma4_backward_workspace_bytes<Real>(const Gemma4LayerSpec&, int64_t, int64_t);           \
  template void gemma4_forward<Real>(const Gemma4LayerSpec&, const Real*, const Real*, Real*, Workspace,      \
                                     int64_t, int64_t, Workspace, const RouterStats*, const int32_t*);        \
  template void gemma4_recompute<Real>(const Gemma4LayerSpec&, const Real*, const Real*, Workspace, int64_t,  \
                                       int64_t, Workspace, const int32_t*);                                   \
  template void gemma4_backward<Real>(const Gemma4LayerSpec&, const Real*, const Real*, Workspace,            \
                                      const Real*, Real*, Real*, int64_t, int64_t, Workspace,                 \
                                      const RouterStats*, const int32_t*);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
