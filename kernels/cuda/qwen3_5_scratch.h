// The device buffers of the Qwen3.6 decoder unit on the GPU (kernels/cuda/qwen3_5_unit.cc): its carve
// sequences, which the unit runs over device memory and the size queries over nothing, as
// gemma4_scratch.h does for Gemma 4. No CUDA type here: the memory account sizes these units on a
// machine without CUDA. The Gated DeltaNet keeps fp32 where its recurrence reads and writes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/transformer/qwen3_5_layer.h"
#include "kernels/cuda/moe_scratch.h"
#include "kernels/cuda/scratch_sizes.h"
#include "kernels/cuda/unit_scratch.h"

namespace slidedp::kernels::cuda {

// Views of the saved state (N = B*T tokens): what backward reads besides x.
template <typename Bf16>
struct Qwen35Saved {
  float* rstd_in;  // (N) input_layernorm 1/rms
  Bf16* h;         // (N, C) its output
  // Gated DeltaNet layers
  Bf16* mixed;    // (N, qkv_dim) in_proj_qkv output
  Bf16* z;        // (N, nv dv) in_proj_z output
  float* braw;    // (N, nv) in_proj_b output
  float* araw;    // (N, nv) in_proj_a output
  float* o;       // (N, nv dv) delta rule output
  float* rstd_g;  // (N nv) the gated norm's 1/rms
  // gated full-attention layers
  Bf16 *q_lin, *gate;  // (N, H, hd) q_proj's query and gate halves
  Bf16 *k_lin, *v;     // (N, KV, hd)
  float *rstd_q, *rstd_k;
  Bf16 *q, *k;     // after the zero-centred norms and partial RoPE
  Bf16* att;       // (N, H, hd) attention output before the gate
  float* lse;      // (B, H, T)
  Bf16* h1;        // (N, C) residual after the mixer
  float* rstd_pa;  // (N) post_attention_layernorm 1/rms
  Bf16* u;         // (N, C) its output
  Bf16 *g, *up;    // (N, I) dense layers
  // MoE layers
  float* probs;        // (N, E)
  int32_t* idx;        // (N, K)
  float* w;            // (N, K) renormalised
  std::byte* experts;  // moe_scratch.h's experts saved state
  Bf16 *sg, *su;       // (N, Is) the shared expert's gate and up projections
  float* slogit;       // (N) its gate logit
  Bf16* shared;        // (N, C) its output before the gate
};
template <typename Bf16>
Qwen35Saved<Bf16> carve_qwen3_5_saved(Carver& a, const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T, C = s.C;
  Qwen35Saved<Bf16> v{};
  v.rstd_in = a.take<float>(N, "rstd_in");
  v.h = a.take<Bf16>(N * C, "h");
  if (s.linear) {
    const DeltaNetSpec& g = s.gdn;
    v.mixed = a.take<Bf16>(N * g.qkv_dim(), "qkv projection");
    v.z = a.take<Bf16>(N * g.value_dim(), "z projection");
    v.braw = a.take<float>(N * g.nv, "b projection");
    v.araw = a.take<float>(N * g.nv, "a projection");
    v.o = a.take<float>(N * g.value_dim(), "delta rule output");
    v.rstd_g = a.take<float>(N * g.nv, "gated norm rstd");
  } else {
    const int64_t Q = s.q_dim(), K = s.kv_dim();
    v.q_lin = a.take<Bf16>(N * Q, "q_lin");
    v.gate = a.take<Bf16>(N * Q, "gate");
    v.k_lin = a.take<Bf16>(N * K, "k_lin");
    v.v = a.take<Bf16>(N * K, "v");
    v.rstd_q = a.take<float>(N * s.H, "rstd_q");
    v.rstd_k = a.take<float>(N * s.KV, "rstd_k");
    v.q = a.take<Bf16>(N * Q, "q");
    v.k = a.take<Bf16>(N * K, "k");
    v.att = a.take<Bf16>(N * Q, "att");
    v.lse = a.take<float>(B * s.H * T, "lse");
  }
  v.h1 = a.take<Bf16>(N * C, "h1");
  v.rstd_pa = a.take<float>(N, "rstd_pa");
  v.u = a.take<Bf16>(N * C, "u");
  if (s.has_moe()) {
    v.probs = a.take<float>(N * s.moe.E, "router probabilities");
    v.idx = a.take<int32_t>(N * s.moe.K, "chosen experts");
    v.w = a.take<float>(N * s.moe.K, "expert weights");
    v.experts = a.take<std::byte>(experts_saved_bytes(s.moe, N), "experts' saved rows");
    v.sg = a.take<Bf16>(N * s.Is, "shared gate");
    v.su = a.take<Bf16>(N * s.Is, "shared up");
    v.slogit = a.take<float>(N, "shared gate logit");
    v.shared = a.take<Bf16>(N * C, "shared expert output");
  } else {
    v.g = a.take<Bf16>(N * s.I, "g");
    v.up = a.take<Bf16>(N * s.I, "up");
  }
  return v;
}

// What the delta rule reads, rebuilt from the saved projections (forward and backward); the conv
// and its SiLU are computed where they are read (deltanet_ops.h), never stored.
struct DeltaNetPrepared {
  float *q, *k;     // (N, nk, dk)
  float* v;         // (N, nv, dv)
  float *g, *beta;  // (N, nv)
};
inline DeltaNetPrepared carve_deltanet_prepared(Carver& a, const DeltaNetSpec& s, int64_t N) {
  DeltaNetPrepared p{};
  p.q = a.take<float>(N * s.key_dim(), "q");
  p.k = a.take<float>(N * s.key_dim(), "k");
  p.v = a.take<float>(N * s.value_dim(), "v");
  p.g = a.take<float>(N * s.nv, "log decay");
  p.beta = a.take<float>(N * s.nv, "beta");
  return p;
}

// Forward scratch: the cuBLASLt workspace, then the mixer's part, then (in the same bytes) the
// feed-forward's.
template <typename Bf16>
struct Qwen35ForwardMixer {
  DeltaNetPrepared p;  // DeltaNet
  Bf16* gated;         // (N, nv dv) DeltaNet
  Bf16* qp;            // (N, 2 H hd) attention: q_proj output
  Bf16* og;            // (N, H hd) attention output times its gate
};
template <typename Bf16>
Qwen35ForwardMixer<Bf16> carve_qwen3_5_forward_mixer(Carver& a, const Qwen35LayerSpec& s, int64_t N) {
  Qwen35ForwardMixer<Bf16> m{};
  if (s.linear) {
    m.p = carve_deltanet_prepared(a, s.gdn, N);
    m.gated = a.take<Bf16>(N * s.gdn.value_dim(), "gated o");
  } else {
    m.qp = a.take<Bf16>(N * 2 * s.q_dim(), "q_proj output");
    m.og = a.take<Bf16>(N * s.q_dim(), "gated attention output");
  }
  return m;
}
template <typename Bf16>
struct Qwen35ForwardFfn {
  Bf16* m;             // (N, I) dense
  float* logits;       // (N, E) MoE
  std::byte* experts;  // moe_scratch.h's experts forward scratch
  Bf16* eo;            // (N, C) routed output
  Bf16* sm;            // (N, Is) the shared expert's silu(sg) * su
};
template <typename Bf16>
Qwen35ForwardFfn<Bf16> carve_qwen3_5_forward_ffn(Carver& a, const Qwen35LayerSpec& s, int64_t N) {
  Qwen35ForwardFfn<Bf16> f{};
  if (!s.has_moe()) {
    f.m = a.take<Bf16>(N * s.I, "m");
    return f;
  }
  f.logits = a.take<float>(N * s.moe.E, "router logits");
  f.experts = a.take<std::byte>(experts_forward_workspace_bytes(s.moe, N), "experts' forward scratch");
  f.eo = a.take<Bf16>(N * s.C, "routed output");
  f.sm = a.take<Bf16>(N * s.Is, "shared m");
  return f;
}

// Backward scratch: what lives throughout, then the feed-forward part, then (in the same bytes) the
// mixer's.
template <typename Bf16>
struct Qwen35BackwardCommon {
  void* gemm_ws;
  float* dh1;    // (N, C) fp32 gradient of h1
  float* dc;     // (N, C) fp32 sums of GEMMs: du, then dh (the input norm's output)
  Bf16* dmix;    // (N, C) the mixer output's gradient, bf16 for its GEMMs
  void* reduce;  // norm-weight gradient partials
};
inline int64_t qwen3_5_reduce_bytes(const Qwen35LayerSpec& s, int64_t N) {
  int64_t r = rmsnorm_backward_workspace_bytes(N, s.C);
  if (!s.linear)
    r = std::max({r, rmsnorm_backward_workspace_bytes(N * s.H, s.hd),
                  rmsnorm_backward_workspace_bytes(N * s.KV, s.hd)});
  return r;
}
template <typename Bf16>
Qwen35BackwardCommon<Bf16> carve_qwen3_5_backward_common(Carver& a, const Qwen35LayerSpec& s, int64_t N) {
  Qwen35BackwardCommon<Bf16> c{};
  c.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  c.dh1 = a.take<float>(N * s.C, "dh1");
  c.dc = a.take<float>(N * s.C, "du / dh");
  c.dmix = a.take<Bf16>(N * s.C, "dmix");
  c.reduce = a.take<std::byte>(qwen3_5_reduce_bytes(s, N), "gradient reduction partials");
  return c;
}
template <typename Bf16>
struct Qwen35BackwardFfn {
  Bf16 *m_du, *dm_dg;  // (N, I or Is) the (shared) gated MLP's
  float* dw;           // (N, K) MoE
  float* dlogits;      // (N, E)
  Bf16* dlogits_bf16;  // (N, E)
  Bf16* dshared;       // (N, C) the shared expert output's gradient
  float* dslogit;      // (N) its gate logit's
  float* dshared_in;   // (N, C) fp32 input gradient of the shared expert
  std::byte* experts;  // moe_scratch.h's experts backward scratch
};
template <typename Bf16>
Qwen35BackwardFfn<Bf16> carve_qwen3_5_backward_ffn(Carver& a, const Qwen35LayerSpec& s, int64_t N) {
  Qwen35BackwardFfn<Bf16> f{};
  const int64_t width = s.has_moe() ? s.Is : s.I;
  f.m_du = a.take<Bf16>(N * width, "m / du");
  f.dm_dg = a.take<Bf16>(N * width, "dm / dg");
  if (s.has_moe()) {
    f.dw = a.take<float>(N * s.moe.K, "dw");
    f.dlogits = a.take<float>(N * s.moe.E, "dlogits");
    f.dlogits_bf16 = a.take<Bf16>(N * s.moe.E, "dlogits bf16");
    f.dshared = a.take<Bf16>(N * s.C, "dshared");
    f.dslogit = a.take<float>(N, "dslogit");
    f.dshared_in = a.take<float>(N * s.C, "shared expert input gradient");
    f.experts = a.take<std::byte>(experts_backward_workspace_bytes(s.moe, N), "experts' backward scratch");
  }
  return f;
}
// The mixer's backward scratch. The DeltaNet's comes in three parts so its widest buffers never
// coexist: what lives to the end (the delta rule's inputs and the gradients that feed the input
// GEMMs), then the part dead once the delta rule's backward is done (the gated norm's and the rule's
// own), then, in the same bytes, the conv's gradient and the qkv projection's.
template <typename Bf16>
struct DeltaNetBackwardKeep {
  DeltaNetPrepared p;
  Bf16* dz;             // (N, Vd)
  float *dq, *dk, *dv;  // delta rule input gradients
  float *dg, *dbeta;    // (N, nv)
  Bf16 *dbraw, *daraw;  // (N, nv)
};
template <typename Bf16>
DeltaNetBackwardKeep<Bf16> carve_deltanet_backward_keep(Carver& a, const DeltaNetSpec& g, int64_t N) {
  DeltaNetBackwardKeep<Bf16> m{};
  const int64_t Vd = N * g.value_dim(), Kd = N * g.key_dim(), H = N * g.nv;
  m.p = carve_deltanet_prepared(a, g, N);
  m.dz = a.take<Bf16>(Vd, "dz");
  m.dq = a.take<float>(Kd, "dq");
  m.dk = a.take<float>(Kd, "dk");
  m.dv = a.take<float>(Vd, "dv");
  m.dg = a.take<float>(H, "d log decay");
  m.dbeta = a.take<float>(H, "d beta");
  m.dbraw = a.take<Bf16>(H, "d b projection");
  m.daraw = a.take<Bf16>(H, "d a projection");
  return m;
}
template <typename Bf16>
struct DeltaNetBackwardRule {
  Bf16* gated;    // (N, Vd) recomputed
  float* dgated;  // (N, Vd)
  float* do_;     // (N, Vd) the delta rule output's gradient
  void* norm;     // deltanet_gated_norm_workspace_bytes
  void* rule;     // delta_rule_backward_workspace_bytes
};
template <typename Bf16>
DeltaNetBackwardRule<Bf16> carve_deltanet_backward_rule(Carver& a, const DeltaNetSpec& g, int64_t B,
                                                        int64_t T) {
  DeltaNetBackwardRule<Bf16> m{};
  const int64_t N = B * T, Vd = N * g.value_dim();
  m.gated = a.take<Bf16>(Vd, "gated o");
  m.dgated = a.take<float>(Vd, "d gated o");
  m.do_ = a.take<float>(Vd, "d delta rule output");
  m.norm = a.take<std::byte>(deltanet_gated_norm_workspace_bytes(N, g.nv, g.dv), "gated norm backward");
  m.rule =
      a.take<std::byte>(delta_rule_backward_workspace_bytes(B, T, g.nv, g.dk, g.dv), "delta rule backward");
  return m;
}
template <typename Bf16>
struct DeltaNetBackwardConv {
  float* dconv;  // (N, D)
  Bf16* dmixed;  // (N, D)
};
template <typename Bf16>
DeltaNetBackwardConv<Bf16> carve_deltanet_backward_conv(Carver& a, const DeltaNetSpec& g, int64_t N) {
  return {a.take<float>(N * g.qkv_dim(), "d conv"), a.take<Bf16>(N * g.qkv_dim(), "d qkv projection")};
}

// The gated attention's backward scratch.
template <typename Bf16>
struct AttentionBackward {
  Bf16 *og, *dog, *datt, *dgate, *dqa, *dka, *dva, *dq_lin, *dk_lin, *dqp;
  float* attn;  // attention backward scratch (B, H, T)
};
template <typename Bf16>
AttentionBackward<Bf16> carve_qwen3_5_backward_attention(Carver& a, const Qwen35LayerSpec& s, int64_t B,
                                                         int64_t T) {
  const int64_t N = B * T, Q = N * s.q_dim(), K = N * s.kv_dim();
  AttentionBackward<Bf16> m{};
  m.og = a.take<Bf16>(Q, "gated attention output");
  m.dog = a.take<Bf16>(Q, "d gated attention output");
  m.datt = a.take<Bf16>(Q, "datt");
  m.dgate = a.take<Bf16>(Q, "dgate");
  m.dqa = a.take<Bf16>(Q, "dq");
  m.dka = a.take<Bf16>(K, "dk");
  m.dva = a.take<Bf16>(K, "dv");
  m.dq_lin = a.take<Bf16>(Q, "dq_lin");
  m.dk_lin = a.take<Bf16>(K, "dk_lin");
  m.dqp = a.take<Bf16>(2 * Q, "d q_proj output");
  m.attn = reinterpret_cast<float*>(
      a.take<std::byte>(attention_backward_workspace_bytes(B, s.H, T), "attention D"));
  return m;
}

// ---- sizes (bytes), from the sequences above (unit_scratch.cc) ----
int64_t qwen3_5_saved_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);
int64_t qwen3_5_forward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);  // also recompute
int64_t qwen3_5_backward_workspace_bytes(const Qwen35LayerSpec& spec, int64_t B, int64_t T);
// The same under the names every family's GPU layer provides (visited per layer by the memory account).
inline int64_t layer_saved_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_saved_bytes(s, B, T);
}
inline int64_t layer_forward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_forward_workspace_bytes(s, B, T);
}
inline int64_t layer_backward_workspace_bytes(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return qwen3_5_backward_workspace_bytes(s, B, T);
}

}  // namespace slidedp::kernels::cuda
