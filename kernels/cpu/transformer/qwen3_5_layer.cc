// Qwen3.6 / Qwen3.5 decoder layer forward / recompute / backward on the CPU; see qwen3_5_layer.h.
// Like llama_layer.cc the carve functions are the single source of the buffer sizes: the size
// queries replay the take sequence of forward_impl and qwen3_5_backward through them.
#include "kernels/cpu/transformer/qwen3_5_layer.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/linear.h"
#include "kernels/cpu/transformer/rmsnorm.h"
#include "kernels/cpu/transformer/rope.h"
#include "kernels/cpu/transformer/swiglu.h"

namespace slidedp::kernels {
namespace {

// Views of the saved state (N = B*T tokens).
template <typename Real>
struct Saved {
  Real* rstd_in;  // (N) input_layernorm 1/rms
  Real* h;        // (N, C) its output
  Workspace gdn;  // linear layers: gated_deltanet.h's saved state
  // full-attention layers
  Real *q_lin, *gate;  // (N, H, hd) q_proj's query and gate halves
  Real *k_lin, *v;     // (N, KV, hd) k_proj and v_proj outputs
  Real *rstd_q, *rstd_k;
  Real *q, *k;  // after the norms and partial RoPE
  Real* att;    // (N, H, hd) attention output (before the gate)
  Real* lse;    // (B, H, T)
  Real* h1;       // (N, C) residual after the mixer
  Real* rstd_pa;  // (N) post_attention_layernorm 1/rms
  Real* u;        // (N, C) its output, the feed-forward input
  Real *g, *up;   // (N, I) dense: gate_proj, up_proj outputs
  // MoE layers
  Real* probs;       // (N, E)
  int32_t* idx;      // (N, K)
  Real* w;           // (N, K) renormalised top-k probabilities
  Workspace experts;  // moe_experts.h's saved rows
  Real *sg, *su;     // (N, Is) shared expert gate_proj, up_proj outputs
  Real* slogit;      // (N) shared expert gate logit
  Real* shared;      // (N, C) shared expert output (before its gate)
};

template <typename Real>
Saved<Real> carve_saved(Arena& a, const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T, Q = s.q_dim(), K = s.kv_dim();
  Saved<Real> v{};
  v.rstd_in = a.take<Real>(N, "rstd_in");
  v.h = a.take<Real>(N * s.C, "h");
  if (s.linear) {
    v.gdn = a.take_workspace(deltanet_saved_bytes<Real>(s.gdn, N));
  } else {
    v.q_lin = a.take<Real>(N * Q, "q_lin");
    v.gate = a.take<Real>(N * Q, "gate");
    v.k_lin = a.take<Real>(N * K, "k_lin");
    v.v = a.take<Real>(N * K, "v");
    v.rstd_q = a.take<Real>(N * s.H, "rstd_q");
    v.rstd_k = a.take<Real>(N * s.KV, "rstd_k");
    v.q = a.take<Real>(N * Q, "q");
    v.k = a.take<Real>(N * K, "k");
    v.att = a.take<Real>(N * Q, "att");
    v.lse = a.take<Real>(B * s.H * T, "lse");
  }
  v.h1 = a.take<Real>(N * s.C, "h1");
  v.rstd_pa = a.take<Real>(N, "rstd_pa");
  v.u = a.take<Real>(N * s.C, "u");
  if (s.has_moe()) {
    v.probs = a.take<Real>(N * s.moe.E, "probs");
    v.idx = a.take<int32_t>(N * s.moe.K, "idx");
    v.w = a.take<Real>(N * s.moe.K, "w");
    v.experts = a.take_workspace(experts_saved_bytes<Real>(s.moe, N));
    v.sg = a.take<Real>(N * s.Is, "shared g");
    v.su = a.take<Real>(N * s.Is, "shared u");
    v.slogit = a.take<Real>(N, "shared gate logit");
    v.shared = a.take<Real>(N * s.C, "shared expert output");
  } else {
    v.g = a.take<Real>(N * s.I, "g");
    v.up = a.take<Real>(N * s.I, "up");
  }
  return v;
}

// Scratch of forward and backward alike: the zero-centred norms' effective weights (1 + w) and the
// DeltaNet's segments (one per document: per sequence, or per packed document with positions).
template <typename Real>
struct Common {
  Real *in1, *pa1, *qn1, *kn1;
  int64_t* seg;                // (segments + 1), room for B * T + 1
  int64_t segments = 0;
  const int32_t* positions;    // (B, T) document positions, or null (attention.h)
};
template <typename Real>
Common<Real> carve_common(Arena& a, const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  Common<Real> c{};
  c.in1 = a.take<Real>(s.C, "1 + input_layernorm.weight");
  c.pa1 = a.take<Real>(s.C, "1 + post_attention_layernorm.weight");
  if (!s.linear) {
    c.qn1 = a.take<Real>(s.hd, "1 + q_norm.weight");
    c.kn1 = a.take<Real>(s.hd, "1 + k_norm.weight");
  }
  c.seg = a.take<int64_t>(B * T + 1, "segments");
  return c;
}
template <typename Real>
void fill_common(const Qwen35LayerSpec& s, const Real* p, Common<Real>& c, int64_t B, int64_t T,
                 const int32_t* positions) {
  auto plus_one = [](Real* out, const Real* w, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = Real(1) + w[i];
  };
  plus_one(c.in1, p + s.input_norm, s.C);
  plus_one(c.pa1, p + s.post_attn_norm, s.C);
  if (!s.linear) {
    plus_one(c.qn1, p + s.q_norm, s.hd);
    plus_one(c.kn1, p + s.k_norm, s.hd);
  }
  if (positions != nullptr) check_document_positions(positions, B, T);
  c.positions = positions;
  c.segments = 0;
  for (int64_t r = 0; r < B * T; ++r)  // a segment starts at every sequence start and document start
    if (r % T == 0 || (positions != nullptr && positions[r] == 0)) c.seg[c.segments++] = r;
  c.seg[c.segments] = B * T;
}

template <typename Real>
DeltaRuleSegments segments(const Common<Real>& c) { return {c.seg, c.segments}; }

template <typename T>
DeltaNetWeights<T> gdn_weights(const Qwen35LayerSpec& s, T* p) {
  return {p + s.qkv_w, p + s.z_w, p + s.b_w, p + s.a_w, p + s.conv_w,
          p + s.dt_bias, p + s.A_log, p + s.gdn_norm, p + s.out_w};
}

AttentionShape attention_shape(const Qwen35LayerSpec& s, int64_t B, int64_t T, const int32_t* positions = nullptr) {
  AttentionShape a{B, T, s.H, s.KV, s.hd, s.attn_tile, s.threads};
  a.positions = positions;
  return a;
}

MoeSpec moe_spec(const Qwen35LayerSpec& s) {
  MoeSpec m = s.moe;
  m.threads = s.threads;
  return m;
}

template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

// The gated attention's scratch (forward and backward carve it whole).
template <typename Real>
struct AttentionScratch {
  Real *cos, *sin;  // (T, rotary_dim / 2)
  Real* rot;        // (N, max(H, KV), rotary_dim): the rotated channels, gathered
  Real* og;         // (N, H, hd) attention output times sigmoid(gate)
  Real* qp;         // (N, 2 q_dim): q_proj output (forward), its gradient (backward)
  // backward only
  Real *dog, *dq, *dk, *dv, *dk_lin;
  Workspace attn;
};
template <typename Real>
AttentionScratch<Real> carve_attention(Arena& a, const Qwen35LayerSpec& s, int64_t B, int64_t T, bool backward) {
  const int64_t N = B * T, Q = s.q_dim(), K = s.kv_dim(), half = s.rotary_dim / 2;
  AttentionScratch<Real> x{};
  x.cos = a.take<Real>(T * half, "rope cos");
  x.sin = a.take<Real>(T * half, "rope sin");
  x.rot = a.take<Real>(N * std::max(s.H, s.KV) * s.rotary_dim, "rotated channels");
  x.og = a.take<Real>(N * Q, "gated attention output");
  x.qp = a.take<Real>(N * 2 * Q, "q_proj output");
  const AttentionShape as = attention_shape(s, B, T);
  if (backward) {
    x.dog = a.take<Real>(N * Q, "d gated attention output");
    x.dq = a.take<Real>(N * Q, "dq");
    x.dk = a.take<Real>(N * K, "dk");
    x.dv = a.take<Real>(N * K, "dv");
    x.dk_lin = a.take<Real>(N * K, "dk_lin");
    x.attn = a.take_workspace(attention_backward_workspace_bytes<Real>(as));
  } else {
    x.attn = a.take_workspace(attention_forward_workspace_bytes<Real>(as));
  }
  return x;
}

// RoPE on the first rotary_dim channels of each of nh heads of x (N, nh, hd): gathered into rot,
// rotated (or rotated back), scattered.
template <typename Real>
void rope_partial(const Qwen35LayerSpec& s, const AttentionScratch<Real>& x, Real* data, int64_t nh, int64_t B,
                  int64_t T, const int32_t* positions, bool backward) {
  const int64_t rows = B * T * nh, rd = s.rotary_dim;
  for (int64_t r = 0; r < rows; ++r) std::copy(data + r * s.hd, data + r * s.hd + rd, x.rot + r * rd);
  if (backward)
    rope_backward(x.rot, x.cos, x.sin, B, T, nh, rd, positions);
  else
    rope_forward(x.rot, x.cos, x.sin, B, T, nh, rd, positions);
  for (int64_t r = 0; r < rows; ++r) std::copy(x.rot + r * rd, x.rot + (r + 1) * rd, data + r * s.hd);
}

// h1 = x + (attention * sigmoid(gate)) Wo^T; the saved attention state written.
template <typename Real>
void attention_forward_block(const Qwen35LayerSpec& s, const Real* p, const Real* x, const Saved<Real>& S,
                             const Common<Real>& c, int64_t B, int64_t T, Arena& arena) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), hd = s.hd;
  const Real* const no_bias = nullptr;
  const int64_t mark = arena.mark();
  const AttentionScratch<Real> a = carve_attention<Real>(arena, s, B, T, false);
  linear_forward(a.qp, S.h, p + s.q_w, no_bias, N, C, 2 * Q, false);
  for (int64_t r = 0; r < N * s.H; ++r) {  // per head: hd query rows, then hd gate rows
    std::copy(a.qp + 2 * r * hd, a.qp + (2 * r + 1) * hd, S.q_lin + r * hd);
    std::copy(a.qp + (2 * r + 1) * hd, a.qp + (2 * r + 2) * hd, S.gate + r * hd);
  }
  linear_forward(S.k_lin, S.h, p + s.k_w, no_bias, N, C, K, false);
  linear_forward(S.v, S.h, p + s.v_w, no_bias, N, C, K, false);
  rmsnorm_forward(S.q, S.rstd_q, S.q_lin, c.qn1, N * s.H, hd, s.eps);
  rmsnorm_forward(S.k, S.rstd_k, S.k_lin, c.kn1, N * s.KV, hd, s.eps);
  rope_tables(a.cos, a.sin, s.inv_freq, T);
  rope_partial(s, a, S.q, s.H, B, T, c.positions, false);
  rope_partial(s, a, S.k, s.KV, B, T, c.positions, false);
  attention_forward(S.att, S.lse, S.q, S.k, S.v, attention_shape(s, B, T, c.positions), a.attn);
  for (int64_t i = 0; i < N * Q; ++i) a.og[i] = S.att[i] * sigmoid(S.gate[i]);
  std::copy(x, x + N * C, S.h1);
  linear_forward(S.h1, a.og, p + s.o_w, no_bias, N, Q, C, true);
  arena.release(mark);
}

// From dmix (the mixer output's gradient): the attention parameters' gradients and dh (overwritten).
template <typename Real>
void attention_backward_block(const Qwen35LayerSpec& s, const Real* p, const Saved<Real>& S, const Common<Real>& c,
                              const Real* dmix, Real* dh, Real* dp, int64_t B, int64_t T, Arena& arena) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), hd = s.hd;
  Real* const no_bias = nullptr;
  const int64_t mark = arena.mark();
  const AttentionScratch<Real> a = carve_attention<Real>(arena, s, B, T, true);
  for (int64_t i = 0; i < N * Q; ++i) a.og[i] = S.att[i] * sigmoid(S.gate[i]);
  linear_backward(a.dog, dp + s.o_w, no_bias, dmix, a.og, p + s.o_w, N, Q, C, false);
  // og = att * sigmoid(gate): datt into og's buffer, dgate straight into q_proj's gradient layout
  for (int64_t r = 0; r < N * s.H; ++r)
    for (int64_t i = 0; i < hd; ++i) {
      const int64_t e = r * hd + i;
      const Real sg = sigmoid(S.gate[e]);
      a.og[e] = a.dog[e] * sg;
      a.qp[(2 * r + 1) * hd + i] = a.dog[e] * S.att[e] * sg * (Real(1) - sg);
    }
  attention_backward(a.dq, a.dk, a.dv, a.og, S.q, S.k, S.v, S.att, S.lse, attention_shape(s, B, T, c.positions),
                     a.attn);
  rope_tables(a.cos, a.sin, s.inv_freq, T);
  rope_partial(s, a, a.dq, s.H, B, T, c.positions, true);
  rope_partial(s, a, a.dk, s.KV, B, T, c.positions, true);
  // through the zero-centred q/k norms (dog is dead: it takes dq_lin)
  rmsnorm_backward(a.dog, dp + s.q_norm, a.dq, S.q_lin, S.rstd_q, c.qn1, N * s.H, hd, false);
  rmsnorm_backward(a.dk_lin, dp + s.k_norm, a.dk, S.k_lin, S.rstd_k, c.kn1, N * s.KV, hd, false);
  for (int64_t r = 0; r < N * s.H; ++r) std::copy(a.dog + r * hd, a.dog + (r + 1) * hd, a.qp + 2 * r * hd);
  linear_backward(dh, dp + s.q_w, no_bias, a.qp, S.h, p + s.q_w, N, C, 2 * Q, false);
  linear_backward(dh, dp + s.k_w, no_bias, a.dk_lin, S.h, p + s.k_w, N, C, K, true);
  linear_backward(dh, dp + s.v_w, no_bias, a.dv, S.h, p + s.v_w, N, C, K, true);
  arena.release(mark);
}

// The feed-forward branch's forward scratch.
template <typename Real>
struct FfnScratch {
  Real* m;           // dense: (N, I) silu(g) * up
  Real* logits;      // MoE: (N, E)
  Workspace experts;
  Real* eo;          // (N, C) routed output
  Real* sm;          // (N, Is) silu(sg) * su
};
template <typename Real>
FfnScratch<Real> carve_ffn_forward(Arena& a, const Qwen35LayerSpec& s, int64_t N) {
  FfnScratch<Real> f{};
  if (!s.has_moe()) {
    f.m = a.take<Real>(N * s.I, "m");
    return f;
  }
  f.logits = a.take<Real>(N * s.moe.E, "router logits");
  f.experts = a.take_workspace(experts_forward_workspace_bytes<Real>(s.moe, N));
  f.eo = a.take<Real>(N * s.C, "routed output");
  f.sm = a.take<Real>(N * s.Is, "shared m");
  return f;
}

// Writes the feed-forward saved state; y != nullptr: y = h1 + ffn(u).
template <typename Real>
void ffn_forward(const Qwen35LayerSpec& s, const Real* p, const Saved<Real>& S, Real* y, int64_t N, Arena& arena) {
  const int64_t C = s.C;
  const Real* const no_bias = nullptr;
  const int64_t mark = arena.mark();
  const FfnScratch<Real> f = carve_ffn_forward<Real>(arena, s, N);
  if (!s.has_moe()) {
    linear_forward(S.g, S.u, p + s.gate_w, no_bias, N, C, s.I, false);
    linear_forward(S.up, S.u, p + s.up_w, no_bias, N, C, s.I, false);
    if (y != nullptr) {
      swiglu_forward(f.m, S.g, S.up, N * s.I, s.threads);
      std::copy(S.h1, S.h1 + N * C, y);
      linear_forward(y, f.m, p + s.down_w, no_bias, N, s.I, C, true);
    }
    arena.release(mark);
    return;
  }
  const int64_t E = s.moe.E, K = s.moe.K;
  linear_forward(f.logits, S.u, p + s.router_w, no_bias, N, C, E, false);
  router_topk_forward(S.probs, S.idx, S.w, f.logits, N, E, K);
  experts_forward(moe_spec(s), p + s.experts_gate_up, p + s.experts_down, S.u, S.idx, S.w, f.eo, S.experts, N,
                  f.experts);
  linear_forward(S.sg, S.u, p + s.shared_gate_w, no_bias, N, C, s.Is, false);
  linear_forward(S.su, S.u, p + s.shared_up_w, no_bias, N, C, s.Is, false);
  swiglu_forward(f.sm, S.sg, S.su, N * s.Is, s.threads);
  linear_forward(S.shared, f.sm, p + s.shared_down_w, no_bias, N, s.Is, C, false);
  linear_forward(S.slogit, S.u, p + s.shared_gate_logit_w, no_bias, N, C, int64_t{1}, false);
  if (y != nullptr)
    for (int64_t t = 0; t < N; ++t) {
      const Real gate = sigmoid(S.slogit[t]);
      for (int64_t i = t * C; i < (t + 1) * C; ++i) y[i] = S.h1[i] + f.eo[i] + gate * S.shared[i];
    }
  arena.release(mark);
}

template <typename Real>
struct FfnBackward {
  Real *a, *b;      // dense: (N, I) m then dup, dm then dg; MoE: (N, Is) the shared expert's
  Real* dw;         // MoE: (N, K)
  Real* dlogits;    // MoE: (N, E)
  Real* dslogit;    // MoE: (N)
  Real* dso;        // MoE: (N, C) the shared expert output's gradient
  Workspace experts;
};
template <typename Real>
FfnBackward<Real> carve_ffn_backward(Arena& a, const Qwen35LayerSpec& s, int64_t N) {
  FfnBackward<Real> f{};
  const int64_t width = s.has_moe() ? s.Is : s.I;
  f.a = a.take<Real>(N * width);
  f.b = a.take<Real>(N * width);
  if (s.has_moe()) {
    f.dw = a.take<Real>(N * s.moe.K);
    f.dlogits = a.take<Real>(N * s.moe.E);
    f.dslogit = a.take<Real>(N);
    f.dso = a.take<Real>(N * s.C);
    f.experts = a.take_workspace(experts_backward_workspace_bytes<Real>(s.moe, N));
  }
  return f;
}

// From dffn: du (N, C) overwritten, the branch's parameter gradients accumulated.
template <typename Real>
void ffn_backward(const Qwen35LayerSpec& s, const Real* p, const Saved<Real>& S, const Real* dffn, Real* du,
                  Real* dp, int64_t B, int64_t T, const RouterStats* router, Arena& arena) {
  const int64_t N = B * T, C = s.C;
  Real* const no_bias = nullptr;
  const int64_t mark = arena.mark();
  const FfnBackward<Real> f = carve_ffn_backward<Real>(arena, s, N);
  auto swiglu_mlp = [&](const Real* dout, const Real* g, const Real* up, int64_t width, int64_t gate_w,
                        int64_t up_w, int64_t down_w, bool accumulate) {
    swiglu_forward(f.a, g, up, N * width, s.threads);  // m, recomputed (an elementwise pass)
    linear_backward(f.b, dp + down_w, no_bias, dout, f.a, p + down_w, N, width, C, false);
    swiglu_backward(f.b, f.a, f.b, g, up, N * width, s.threads);
    linear_backward(du, dp + gate_w, no_bias, f.b, S.u, p + gate_w, N, C, width, accumulate);
    linear_backward(du, dp + up_w, no_bias, f.a, S.u, p + up_w, N, C, width, true);
  };
  if (!s.has_moe()) {
    swiglu_mlp(dffn, S.g, S.up, s.I, s.gate_w, s.up_w, s.down_w, false);
    arena.release(mark);
    return;
  }
  const int64_t E = s.moe.E, K = s.moe.K;
  experts_backward(moe_spec(s), p + s.experts_gate_up, p + s.experts_down, S.u, S.idx, S.w, S.experts, dffn, du,
                   f.dw, dp + s.experts_gate_up, dp + s.experts_down, N, f.experts);
  router_topk_backward(f.dlogits, f.dw, S.probs, S.idx, N, E, K);
  if (router != nullptr) router_aux_backward(f.dlogits, S.probs, *router, B, T, E);
  linear_backward(du, dp + s.router_w, no_bias, f.dlogits, S.u, p + s.router_w, N, C, E, true);
  // ffn += sigmoid(slogit) * shared
  for (int64_t t = 0; t < N; ++t) {
    const Real gate = sigmoid(S.slogit[t]);
    Real dgate = 0;
    for (int64_t i = t * C; i < (t + 1) * C; ++i) {
      dgate += dffn[i] * S.shared[i];
      f.dso[i] = gate * dffn[i];
    }
    f.dslogit[t] = dgate * gate * (Real(1) - gate);
  }
  linear_backward(du, dp + s.shared_gate_logit_w, no_bias, f.dslogit, S.u, p + s.shared_gate_logit_w, N, C,
                  int64_t{1}, true);
  swiglu_mlp(f.dso, S.sg, S.su, s.Is, s.shared_gate_w, s.shared_up_w, s.shared_down_w, true);
  arena.release(mark);
}

}  // namespace

void check_qwen3_5_layer_spec(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative batch or sequence length");
  SLIDEDP_CHECK(s.C > 0, "bad Qwen3.5 layer spec");
  if (s.linear) SLIDEDP_CHECK(s.gdn.C == s.C && s.out_w != kAbsent, "bad Qwen3.5 DeltaNet spec");
  if (!s.linear)
    SLIDEDP_CHECK(s.H > 0 && s.KV > 0 && s.H % s.KV == 0 && s.hd > 0 && s.rotary_dim > 0 && s.rotary_dim % 2 == 0 &&
                      s.rotary_dim <= s.hd && static_cast<int64_t>(s.inv_freq.size()) == s.rotary_dim / 2,
                  "bad Qwen3.5 attention spec");
  SLIDEDP_CHECK(s.has_moe() ? (s.moe.C == s.C && s.Is > 0 && s.shared_gate_logit_w != kAbsent) : s.I > 0,
                "bad Qwen3.5 feed-forward spec");
}

namespace {

// Everything up to the saved state; y != nullptr also runs the rest (forward), y == nullptr stops
// where the saved state is complete (recompute). The same calls in the same order on the same
// values, so recompute is bitwise what forward saved.
template <typename Real>
void forward_impl(const Qwen35LayerSpec& s, const Real* p, const Real* x, Real* y, Workspace saved, int64_t B,
                  int64_t T, Workspace ws, const int32_t* positions) {
  check_qwen3_5_layer_spec(s, B, T);
  const int64_t N = B * T, C = s.C;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  Common<Real> c = carve_common<Real>(arena, s, B, T);
  fill_common(s, p, c, B, T, positions);
  rmsnorm_forward(S.h, S.rstd_in, x, c.in1, N, C, s.eps);
  if (s.linear) {
    std::copy(x, x + N * C, S.h1);
    const int64_t mark = arena.mark();
    const DeltaRuleSegments seg = segments(c);
    deltanet_forward(s.gdn, seg, gdn_weights<const Real>(s, p), S.h, S.h1, true, S.gdn,
                     arena.take_workspace(deltanet_forward_workspace_bytes<Real>(s.gdn, extent_of(seg))));
    arena.release(mark);
  } else {
    attention_forward_block(s, p, x, S, c, B, T, arena);
  }
  rmsnorm_forward(S.u, S.rstd_pa, S.h1, c.pa1, N, C, s.eps);
  ffn_forward(s, p, S, y, N, arena);
}

}  // namespace

Qwen35LayerSpec make_qwen3_5_layer_spec(const ModelCard& card, const UnitLayout& unit) {
  SLIDEDP_CHECK(unit.kind == UnitKind::kDecoder && card.is_family<Qwen35Family>(),
                "make_qwen3_5_layer_spec needs a Qwen3.5 decoder");
  const LayerShape l = card.layer(unit.layer);
  Qwen35LayerSpec s;
  s.C = card.hidden_size;
  s.eps = card.rms_norm_eps;
  s.linear = l.linear();
  s.flat_numel = unit.flat_numel;
  const int64_t C = s.C;
  s.input_norm = tensor_offset(unit, "input_layernorm.weight", {C});
  s.post_attn_norm = tensor_offset(unit, "post_attention_layernorm.weight", {C});
  if (s.linear) {
    DeltaNetSpec& g = s.gdn;
    g.C = C;
    g.nk = l.linear_k_heads;
    g.nv = l.linear_v_heads;
    g.dk = l.linear_k_dim;
    g.dv = l.linear_v_dim;
    g.conv_kernel = l.conv_kernel;
    g.norm_eps = card.rms_norm_eps;
    const int64_t D = g.qkv_dim(), Vd = g.value_dim();
    s.qkv_w = tensor_offset(unit, "linear_attn.in_proj_qkv.weight", {D, C});
    s.z_w = tensor_offset(unit, "linear_attn.in_proj_z.weight", {Vd, C});
    s.b_w = tensor_offset(unit, "linear_attn.in_proj_b.weight", {g.nv, C});
    s.a_w = tensor_offset(unit, "linear_attn.in_proj_a.weight", {g.nv, C});
    s.conv_w = tensor_offset(unit, "linear_attn.conv1d.weight", {D, 1, g.conv_kernel});
    s.dt_bias = tensor_offset(unit, "linear_attn.dt_bias", {g.nv});
    s.A_log = tensor_offset(unit, "linear_attn.A_log", {g.nv});
    s.gdn_norm = tensor_offset(unit, "linear_attn.norm.weight", {g.dv});
    s.out_w = tensor_offset(unit, "linear_attn.out_proj.weight", {C, Vd});
  } else {
    s.H = l.num_heads;
    s.KV = l.num_kv_heads;
    s.hd = l.head_dim;
    s.rotary_dim = l.rotary_dim;
    s.inv_freq = rope_inv_freq(s.rotary_dim, l.rope_theta, card.rope_scaling);
    s.attn_tile = attention_tile_for(s.hd);
    const int64_t Q = s.q_dim(), K = s.kv_dim();
    s.q_w = tensor_offset(unit, "self_attn.q_proj.weight", {2 * Q, C});
    s.k_w = tensor_offset(unit, "self_attn.k_proj.weight", {K, C});
    s.v_w = tensor_offset(unit, "self_attn.v_proj.weight", {K, C});
    s.o_w = tensor_offset(unit, "self_attn.o_proj.weight", {C, Q});
    s.q_norm = tensor_offset(unit, "self_attn.q_norm.weight", {s.hd});
    s.k_norm = tensor_offset(unit, "self_attn.k_norm.weight", {s.hd});
  }
  if (l.moe()) {
    const int64_t E = l.num_experts, Ie = l.expert_intermediate_size;
    s.moe = MoeSpec{C, E, l.experts_per_token, Ie, ExpertActivation::kSilu, 1};
    s.Is = l.shared_expert_intermediate_size;
    s.router_w = tensor_offset(unit, "mlp.gate.weight", {E, C});
    s.experts_gate_up = tensor_offset(unit, "mlp.experts.gate_up_proj", {E, 2 * Ie, C});
    s.experts_down = tensor_offset(unit, "mlp.experts.down_proj", {E, C, Ie});
    s.shared_gate_w = tensor_offset(unit, "mlp.shared_expert.gate_proj.weight", {s.Is, C});
    s.shared_up_w = tensor_offset(unit, "mlp.shared_expert.up_proj.weight", {s.Is, C});
    s.shared_down_w = tensor_offset(unit, "mlp.shared_expert.down_proj.weight", {C, s.Is});
    s.shared_gate_logit_w = tensor_offset(unit, "mlp.shared_expert_gate.weight", {1, C});
  } else {
    s.I = l.intermediate_size;
    s.gate_w = tensor_offset(unit, "mlp.gate_proj.weight", {s.I, C});
    s.up_w = tensor_offset(unit, "mlp.up_proj.weight", {s.I, C});
    s.down_w = tensor_offset(unit, "mlp.down_proj.weight", {C, s.I});
  }
  return s;
}

template <typename Real>
int64_t qwen3_5_saved_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T) {
  return measured_bytes([&](Arena& a) { carve_saved<Real>(a, spec, B, T); });
}

template <typename Real>
int64_t qwen3_5_forward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return measured_bytes([&](Arena& a) {  // the take sequence of forward_impl
    const Common<Real> c = carve_common<Real>(a, s, B, T);
    const int64_t mark = a.mark();
    if (s.linear) {
      a.take_workspace(deltanet_forward_workspace_bytes<Real>(s.gdn, packed_documents_extent(B, T)));
    } else {
      carve_attention<Real>(a, s, B, T, false);
    }
    a.release(mark);
    carve_ffn_forward<Real>(a, s, B * T);
    (void)c;
  });
}

template <typename Real>
int64_t qwen3_5_backward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return measured_bytes([&](Arena& a) {  // the take sequence of qwen3_5_backward
    carve_common<Real>(a, s, B, T);
    a.take<Real>(B * T * s.C);  // dh1
    a.take<Real>(B * T * s.C);  // dc
    const int64_t mark = a.mark();
    carve_ffn_backward<Real>(a, s, B * T);
    a.release(mark);
    if (s.linear) {
      a.take_workspace(deltanet_backward_workspace_bytes<Real>(s.gdn, packed_documents_extent(B, T)));
    } else {
      carve_attention<Real>(a, s, B, T, true);
    }
  });
}

template <typename Real>
void qwen3_5_forward(const Qwen35LayerSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                     int64_t B, int64_t T, Workspace ws, const RouterStats* router, const int32_t* positions) {
  SLIDEDP_CHECK(y != nullptr && y != x, "qwen3_5_forward needs an output buffer distinct from x");
  forward_impl(spec, params, x, y, saved, B, T, ws, positions);
  if (router != nullptr && spec.has_moe()) {
    Arena saved_arena(saved);
    const Saved<Real> S = carve_saved<Real>(saved_arena, spec, B, T);
    router_stats_add(*router, S.probs, S.idx, B, T, spec.moe.E, spec.moe.K);
  }
}

template <typename Real>
void qwen3_5_recompute(const Qwen35LayerSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                       int64_t T, Workspace ws, const int32_t* positions) {
  forward_impl(spec, params, x, static_cast<Real*>(nullptr), saved, B, T, ws, positions);
}

template <typename Real>
void qwen3_5_backward(const Qwen35LayerSpec& s, const Real* p, const Real* x, Workspace saved, const Real* dy,
                      Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws, const RouterStats* router,
                      const int32_t* positions) {
  check_qwen3_5_layer_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  Common<Real> c = carve_common<Real>(arena, s, B, T);
  fill_common(s, p, c, B, T, positions);
  Real* dh1 = arena.take<Real>(N * C);
  Real* dc = arena.take<Real>(N * C);
  Real* dp = grads;  // same layout as p

  // y = h1 + ffn(norm_post(h1))
  ffn_backward(s, p, S, dy, dc, dp, B, T, router, arena);
  std::copy(dy, dy + N * C, dh1);
  rmsnorm_backward(dh1, dp + s.post_attn_norm, dc, S.h1, S.rstd_pa, c.pa1, N, C, true);
  // h1 = x + mixer(norm_in(x))
  if (s.linear) {
    const DeltaRuleSegments seg = segments(c);
    DeltaNetWeights<Real> dw = gdn_weights<Real>(s, dp);
    deltanet_backward(s.gdn, seg, gdn_weights<const Real>(s, p), S.h, S.gdn, dh1, dc, false, dw,
                      arena.take_workspace(deltanet_backward_workspace_bytes<Real>(s.gdn, extent_of(seg))));
  } else {
    attention_backward_block(s, p, S, c, dh1, dc, dp, B, T, arena);
  }
  std::copy(dh1, dh1 + N * C, dx);
  rmsnorm_backward(dx, dp + s.input_norm, dc, x, S.rstd_in, c.in1, N, C, true);
}

#define SLIDEDP_INSTANTIATE(Real)                                                                               \
  template int64_t qwen3_5_saved_bytes<Real>(const Qwen35LayerSpec&, int64_t, int64_t);                         \
  template int64_t qwen3_5_forward_workspace_bytes<Real>(const Qwen35LayerSpec&, int64_t, int64_t);             \
  template int64_t qwen3_5_backward_workspace_bytes<Real>(const Qwen35LayerSpec&, int64_t, int64_t);            \
  template void qwen3_5_forward<Real>(const Qwen35LayerSpec&, const Real*, const Real*, Real*, Workspace,       \
                                      int64_t, int64_t, Workspace, const RouterStats*, const int32_t*);         \
  template void qwen3_5_recompute<Real>(const Qwen35LayerSpec&, const Real*, const Real*, Workspace, int64_t,   \
                                        int64_t, Workspace, const int32_t*);                                    \
  template void qwen3_5_backward<Real>(const Qwen35LayerSpec&, const Real*, const Real*, Workspace,             \
                                       const Real*, Real*, Real*, int64_t, int64_t, Workspace,                  \
                                       const RouterStats*, const int32_t*);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
