// The Qwen3.6 decoder layer on the GPU; see qwen3_5_unit.h. The file reads like
// kernels/cpu/transformer/qwen3_5_layer.cc and gated_deltanet.cc step by step: carve the saved state
// and the scratch (qwen3_5_scratch.h, which the size queries run too), then the operations in order.
#include "kernels/cuda/qwen3_5_unit.h"

#include <cmath>

#include "common/error.h"
#include "kernels/cuda/adamw.h"  // add_f32
#include "kernels/cuda/deltanet_ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gated_delta_rule.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/qwen3_5_ops.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"

namespace slidedp::kernels::cuda {
namespace {

constexpr float kZeroCentred = 1.0f;  // Qwen3.6's norms: x * (1 + w)

// The CPU unit's check, plus what the GPU kernels take (the backend refuses the rest by key first).
void check_spec(const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  check_qwen3_5_layer_spec(s, B, T);
  SLIDEDP_CHECK(!s.linear || (s.gdn.dk <= 256 && s.gdn.dv <= 256),
                "the CUDA Gated DeltaNet takes head dims up to 256");
  SLIDEDP_CHECK(!s.has_moe() || (s.moe.E <= kRouterMaxExperts && s.moe.activation == ExpertActivation::kSilu),
                "the CUDA Qwen3.5 unit routes at most 1024 experts with SwiGLU experts");
}

ConvShape conv_shape(const UnitContext& ctx, const DeltaNetSpec& g, int64_t B, int64_t T) {
  return {B, T, g.qkv_dim(), g.conv_kernel, ctx.positions};
}
HeadsShape heads_shape(const DeltaNetSpec& g, int64_t N) {
  return {N, g.nk, g.dk, g.nv, g.dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.dk)))};
}
DeltaRuleShape rule_shape(const UnitContext& ctx, const DeltaNetSpec& g, int64_t B, int64_t T) {
  return {B, T, g.nk, g.nv, g.dk, g.dv, ctx.positions};
}
AttentionShape attention_shape(const UnitContext& ctx, const Qwen35LayerSpec& s, int64_t B, int64_t T) {
  return AttentionShape{B, T, s.H, s.KV, s.hd, ctx.positions};  // scale hd^-1/2
}

// The split into normalised q, k and v (the conv and SiLU computed on the way), beta and g, from the
// saved projections.
void prepare(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const Qwen35Saved<bf16>& S,
             const DeltaNetPrepared& d, int64_t B, int64_t T) {
  const DeltaNetSpec& g = s.gdn;
  const int64_t N = B * T;
  deltanet_prepare_forward(d.q, d.k, d.v, S.mixed, p + s.conv_w, conv_shape(ctx, g, B, T), heads_shape(g, N),
                           ctx.stream);
  deltanet_gates_forward(d.beta, d.g, S.braw, S.araw, p + s.A_log, p + s.dt_bias, N, g.nv, ctx.stream);
}

// h1 = x + GatedDeltaNet(h).
void deltanet_forward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const bf16* x,
                      const Qwen35Saved<bf16>& S, const Qwen35ForwardMixer<bf16>& m, void* gemm_ws, int64_t B,
                      int64_t T) {
  const DeltaNetSpec& g = s.gdn;
  const int64_t N = B * T, C = s.C, Vd = g.value_dim();
  linear_forward(ctx, gemm_ws, S.mixed, S.h, p + s.qkv_w, N, C, g.qkv_dim());
  linear_forward(ctx, gemm_ws, S.z, S.h, p + s.z_w, N, C, Vd);
  linear_forward_f32(ctx, gemm_ws, S.braw, S.h, p + s.b_w, N, C, g.nv);
  linear_forward_f32(ctx, gemm_ws, S.araw, S.h, p + s.a_w, N, C, g.nv);
  prepare(ctx, s, p, S, m.p, B, T);
  delta_rule_forward(rule_shape(ctx, g, B, T), m.p.q, m.p.k, m.p.v, m.p.g, m.p.beta, S.o, ctx.stream);
  deltanet_gated_norm_forward(m.gated, S.rstd_g, S.o, S.z, p + s.gdn_norm, N, g.nv, g.dv, g.norm_eps, false,
                              ctx.stream);
  linear_forward(ctx, gemm_ws, S.h1, m.gated, p + s.out_w, N, Vd, C, x);
}

// h1 = x + (attention(q, k, v) * sigmoid(gate)) Wo^T.
void attention_forward_block(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const bf16* x,
                             const Qwen35Saved<bf16>& S, const Qwen35ForwardMixer<bf16>& m, void* gemm_ws,
                             int64_t B, int64_t T) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim();
  cudaStream_t st = ctx.stream;
  linear_forward(ctx, gemm_ws, m.qp, S.h, p + s.q_w, N, C, 2 * Q);
  split_query_gate(S.q_lin, S.gate, m.qp, N * s.H, s.hd, st);
  linear_forward(ctx, gemm_ws, S.k_lin, S.h, p + s.k_w, N, C, K);
  linear_forward(ctx, gemm_ws, S.v, S.h, p + s.v_w, N, C, K);
  rmsnorm_forward(S.q, S.rstd_q, S.q_lin, p + s.q_norm, N * s.H, s.hd, s.eps, st, kZeroCentred);
  rmsnorm_forward(S.k, S.rstd_k, S.k_lin, p + s.k_norm, N * s.KV, s.hd, s.eps, st, kZeroCentred);
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);  // the first rotary_dim channels of each head
  rope(S.q, freqs, B, T, s.H, s.hd, false, st, ctx.positions);
  rope(S.k, freqs, B, T, s.KV, s.hd, false, st, ctx.positions);
  attention_forward(S.att, S.lse, S.q, S.k, S.v, attention_shape(ctx, s, B, T), ctx.attention, st);
  output_gate_forward(m.og, S.att, S.gate, N * Q, st);
  linear_forward(ctx, gemm_ws, S.h1, m.og, p + s.o_w, N, Q, C, x);
}

// The feed-forward saved state; with y also y = h1 + ffn(u).
void ffn_forward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const Qwen35Saved<bf16>& S,
                 const Qwen35ForwardFfn<bf16>& f, void* gemm_ws, bf16* y, int64_t B, int64_t T,
                 const RouterStats* router) {
  const int64_t N = B * T, C = s.C;
  cudaStream_t st = ctx.stream;
  if (!s.has_moe()) {
    linear_forward(ctx, gemm_ws, S.g, S.u, p + s.gate_w, N, C, s.I);
    linear_forward(ctx, gemm_ws, S.up, S.u, p + s.up_w, N, C, s.I);
    if (y != nullptr) {
      swiglu_forward(f.m, S.g, S.up, N * s.I, st);
      linear_forward(ctx, gemm_ws, y, f.m, p + s.down_w, N, s.I, C, S.h1);
    }
    return;
  }
  const int64_t E = s.moe.E, K = s.moe.K;
  linear_forward_f32(ctx, gemm_ws, f.logits, S.u, p + s.router_w, N, C, E);
  router_topk_forward(S.probs, S.idx, S.w, f.logits, N, E, K, st);
  if (router != nullptr) router_stats_add(*router, S.probs, S.idx, B, T, E, K, st);
  experts_forward(s.moe, p + s.experts_gate_up, p + s.experts_down, S.u, S.idx, S.w, f.eo,
                  {S.experts, experts_saved_bytes(s.moe, N)}, N,
                  {f.experts, experts_forward_workspace_bytes(s.moe, N)}, st);
  linear_forward(ctx, gemm_ws, S.sg, S.u, p + s.shared_gate_w, N, C, s.Is);
  linear_forward(ctx, gemm_ws, S.su, S.u, p + s.shared_up_w, N, C, s.Is);
  swiglu_forward(f.sm, S.sg, S.su, N * s.Is, st);
  linear_forward(ctx, gemm_ws, S.shared, f.sm, p + s.shared_down_w, N, s.Is, C);
  shared_gate_logit(S.slogit, S.u, p + s.shared_gate_logit_w, N, C, st);
  if (y != nullptr) shared_gate_forward(y, S.h1, f.eo, S.shared, S.slogit, N, C, st);
}

// Everything up to the saved state; with y also the layer's output (forward). Recompute and forward
// run the same calls on the same values: bitwise equal saved states.
void forward_impl(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const bf16* x, bf16* y,
                  DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                  const RouterStats* router) {
  check_spec(s, B, T);
  const int64_t N = B * T, C = s.C;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Qwen35Saved<bf16> S = carve_qwen3_5_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  void* gemm_ws = carver.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  rmsnorm_forward(S.h, S.rstd_in, x, p + s.input_norm, N, C, s.eps, ctx.stream, kZeroCentred);
  const int64_t mark = carver.mark();
  const Qwen35ForwardMixer<bf16> m = carve_qwen3_5_forward_mixer<bf16>(carver, s, N);
  if (s.linear)
    deltanet_forward(ctx, s, p, x, S, m, gemm_ws, B, T);
  else
    attention_forward_block(ctx, s, p, x, S, m, gemm_ws, B, T);
  carver.release(mark);
  rmsnorm_forward(S.u, S.rstd_pa, S.h1, p + s.post_attn_norm, N, C, s.eps, ctx.stream, kZeroCentred);
  ffn_forward(ctx, s, p, S, carve_qwen3_5_forward_ffn<bf16>(carver, s, N), gemm_ws, y, B, T, router);
}

// From dy (the feed-forward output's gradient, the layer's dy): du (fp32) into c.dc, overwritten.
void ffn_backward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const Qwen35Saved<bf16>& S,
                  const Qwen35BackwardCommon<bf16>& c, const Qwen35BackwardFfn<bf16>& f, const bf16* dy,
                  float* dp, int64_t B, int64_t T, const RouterStats* router) {
  const int64_t N = B * T, C = s.C;
  cudaStream_t st = ctx.stream;
  if (!s.has_moe()) {
    const GatedMlp mlp{p + s.gate_w, p + s.up_w,    p + s.down_w,   dp + s.gate_w,
                       dp + s.up_w,  dp + s.down_w, swiglu_forward, swiglu_backward};
    gated_mlp_backward(ctx, c.gemm_ws, mlp, dy, S.u, S.g, S.up, f.m_du, f.dm_dg, c.dc, N, C, s.I);
    return;
  }
  const int64_t E = s.moe.E, K = s.moe.K;
  experts_backward(s.moe, p + s.experts_gate_up, p + s.experts_down, S.u, S.idx, S.w,
                   {S.experts, experts_saved_bytes(s.moe, N)}, dy, c.dc, f.dw, dp + s.experts_gate_up,
                   dp + s.experts_down, N, {f.experts, experts_backward_workspace_bytes(s.moe, N)}, st);
  router_topk_backward(f.dlogits, f.dw, S.probs, S.idx, N, E, K, st);
  if (router != nullptr) router_aux_backward(f.dlogits, S.probs, *router, B, T, E, st);
  f32_to_bf16(f.dlogits, f.dlogits_bf16, N * E, st);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, f.dlogits_bf16, p + s.router_w, N, C, E, true);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.router_w, f.dlogits_bf16, S.u, N, C, E);
  // ffn += sigmoid(slogit) * shared
  shared_gate_backward(f.dshared, f.dslogit, dy, S.shared, S.slogit, N, C, st);
  shared_gate_logit_backward(c.dc, dp + s.shared_gate_logit_w, f.dslogit, S.u, p + s.shared_gate_logit_w, N,
                             C, st);
  const GatedMlp shared{p + s.shared_gate_w, p + s.shared_up_w,    p + s.shared_down_w, dp + s.shared_gate_w,
                        dp + s.shared_up_w,  dp + s.shared_down_w, swiglu_forward,      swiglu_backward};
  gated_mlp_backward(ctx, c.gemm_ws, shared, f.dshared, S.u, S.sg, S.su, f.m_du, f.dm_dg, f.dshared_in, N, C,
                     s.Is);
  add_f32(c.dc, f.dshared_in, N * C, st);
}

// From c.dmix (bf16): the DeltaNet's parameter gradients; dh (fp32) into c.dc, overwritten.
void deltanet_backward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p,
                       const Qwen35Saved<bf16>& S, const Qwen35BackwardCommon<bf16>& c, Carver& carver,
                       float* dp, int64_t B, int64_t T) {
  const DeltaNetSpec& g = s.gdn;
  const int64_t N = B * T, C = s.C, D = g.qkv_dim(), Vd = g.value_dim();
  cudaStream_t st = ctx.stream;
  const DeltaNetBackwardKeep<bf16> m = carve_deltanet_backward_keep<bf16>(carver, g, N);
  prepare(ctx, s, p, S, m.p, B, T);
  {
    const int64_t mark = carver.mark();
    const DeltaNetBackwardRule<bf16> r = carve_deltanet_backward_rule<bf16>(carver, g, B, T);
    deltanet_gated_norm_forward(r.gated, S.rstd_g, S.o, S.z, p + s.gdn_norm, N, g.nv, g.dv, g.norm_eps, true,
                                st);
    // y = gated W_out^T; gated = silu(z) * (w * rmsnorm(o))
    linear_backward_input_f32(ctx, c.gemm_ws, r.dgated, c.dmix, p + s.out_w, N, Vd, C, false);
    linear_backward_weight(ctx, c.gemm_ws, dp + s.out_w, c.dmix, r.gated, N, Vd, C);
    deltanet_gated_norm_backward(m.dz, r.do_, dp + s.gdn_norm, r.dgated, S.o, S.rstd_g, S.z, p + s.gdn_norm,
                                 N, g.nv, g.dv, r.norm, st);
    delta_rule_backward(rule_shape(ctx, g, B, T), m.p.q, m.p.k, m.p.v, m.p.g, m.p.beta, r.do_, m.dq, m.dk,
                        m.dv, m.dg, m.dbeta, r.rule, st);
    carver.release(mark);
  }
  deltanet_gates_backward(m.dbraw, m.daraw, dp + s.A_log, dp + s.dt_bias, m.dbeta, m.dg, m.p.beta, m.p.g,
                          S.araw, p + s.A_log, p + s.dt_bias, N, g.nv, st);
  const DeltaNetBackwardConv<bf16> v = carve_deltanet_backward_conv<bf16>(carver, g, N);
  deltanet_prepare_backward(v.dconv, m.dq, m.dk, m.dv, S.mixed, p + s.conv_w, conv_shape(ctx, g, B, T),
                            heads_shape(g, N), st);
  deltanet_conv_backward(v.dmixed, dp + s.conv_w, v.dconv, S.mixed, p + s.conv_w, conv_shape(ctx, g, B, T),
                         st);
  // dh (fp32) = dmixed Wqkv + dz Wz + dbraw Wb + daraw Wa; dW += d^T h
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, v.dmixed, p + s.qkv_w, N, C, D, false);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.dz, p + s.z_w, N, C, Vd, true);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.dbraw, p + s.b_w, N, C, g.nv, true);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.daraw, p + s.a_w, N, C, g.nv, true);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.qkv_w, v.dmixed, S.h, N, C, D);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.z_w, m.dz, S.h, N, C, Vd);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.b_w, m.dbraw, S.h, N, C, g.nv);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.a_w, m.daraw, S.h, N, C, g.nv);
}

// From c.dmix (bf16): the gated attention's parameter gradients; dh (fp32) into c.dc, overwritten.
void attention_backward_block(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p,
                              const Qwen35Saved<bf16>& S, const Qwen35BackwardCommon<bf16>& c, Carver& carver,
                              float* dp, int64_t B, int64_t T) {
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim();
  const AttentionBackward<bf16> m = carve_qwen3_5_backward_attention<bf16>(carver, s, B, T);
  cudaStream_t st = ctx.stream;
  output_gate_forward(m.og, S.att, S.gate, N * Q, st);  // recomputed
  linear_backward_input_bf16(ctx, c.gemm_ws, m.dog, c.dmix, p + s.o_w, N, Q, C);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.o_w, c.dmix, m.og, N, Q, C);
  output_gate_backward(m.datt, m.dgate, m.dog, S.att, S.gate, N * Q, st);
  attention_backward(m.dqa, m.dka, m.dva, m.datt, S.q, S.k, S.v, S.att, S.lse, attention_shape(ctx, s, B, T),
                     ctx.attention, m.attn, st);
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);
  rope(m.dqa, freqs, B, T, s.H, s.hd, true, st, ctx.positions);
  rope(m.dka, freqs, B, T, s.KV, s.hd, true, st, ctx.positions);
  rmsnorm_backward(
      {m.dqa, false, S.q_lin, S.rstd_q, p + s.q_norm, dp + s.q_norm, N * s.H, s.hd, kZeroCentred}, m.dq_lin,
      false, nullptr, false, c.reduce, st);
  rmsnorm_backward(
      {m.dka, false, S.k_lin, S.rstd_k, p + s.k_norm, dp + s.k_norm, N * s.KV, s.hd, kZeroCentred}, m.dk_lin,
      false, nullptr, false, c.reduce, st);
  join_query_gate(m.dqp, m.dq_lin, m.dgate, N * s.H, s.hd, st);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.dqp, p + s.q_w, N, C, 2 * Q, false);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.dk_lin, p + s.k_w, N, C, K, true);
  linear_backward_input_f32(ctx, c.gemm_ws, c.dc, m.dva, p + s.v_w, N, C, K, true);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.q_w, m.dqp, S.h, N, C, 2 * Q);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.k_w, m.dk_lin, S.h, N, C, K);
  linear_backward_weight(ctx, c.gemm_ws, dp + s.v_w, m.dva, S.h, N, C, K);
}

}  // namespace

void qwen3_5_forward(const UnitContext& ctx, const Qwen35LayerSpec& spec, const bf16* params, const bf16* x,
                     bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                     const RouterStats* router) {
  SLIDEDP_CHECK(y != nullptr && y != x, "qwen3_5_forward needs an output buffer distinct from x");
  forward_impl(ctx, spec, params, x, y, saved, B, T, ws, router);
}

void qwen3_5_recompute(const UnitContext& ctx, const Qwen35LayerSpec& spec, const bf16* params, const bf16* x,
                       DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  forward_impl(ctx, spec, params, x, nullptr, saved, B, T, ws, nullptr);  // statistics once, in forward
}

void qwen3_5_backward(const UnitContext& ctx, const Qwen35LayerSpec& s, const bf16* p, const bf16* x,
                      DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                      DeviceWorkspace ws, const RouterStats* router) {
  check_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Qwen35Saved<bf16> S = carve_qwen3_5_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  const Qwen35BackwardCommon<bf16> c = carve_qwen3_5_backward_common<bf16>(carver, s, N);
  float* dp = grads;  // same layout as p
  cudaStream_t st = ctx.stream;
  // y = h1 + ffn(u): the feed-forward's gradient is dy; u = norm_post(h1): dh1 = dy + its backward
  const int64_t mark = carver.mark();
  ffn_backward(ctx, s, p, S, c, carve_qwen3_5_backward_ffn<bf16>(carver, s, N), dy, dp, B, T, router);
  carver.release(mark);
  rmsnorm_backward(
      {c.dc, true, S.h1, S.rstd_pa, p + s.post_attn_norm, dp + s.post_attn_norm, N, C, kZeroCentred}, c.dh1,
      true, dy, false, c.reduce, st);
  // h1 = x + mixer(h): the mixer's gradient is dh1
  f32_to_bf16(c.dh1, c.dmix, N * C, st);
  if (s.linear)
    deltanet_backward(ctx, s, p, S, c, carver, dp, B, T);
  else
    attention_backward_block(ctx, s, p, S, c, carver, dp, B, T);
  // dx (bf16) = dh1 (fp32 residual) + input norm backward of dh
  rmsnorm_backward({c.dc, true, x, S.rstd_in, p + s.input_norm, dp + s.input_norm, N, C, kZeroCentred}, dx,
                   false, c.dh1, true, c.reduce, st);
}

}  // namespace slidedp::kernels::cuda
