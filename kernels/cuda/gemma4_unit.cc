// The dense Gemma 4 decoder layer on the GPU; see gemma4_unit.h. The file reads like
// kernels/cpu/transformer/gemma4_layer.cc step by step: carve the saved state and the scratch
// (gemma4_scratch.h, which the size queries run too), then the operations in order.
#include "kernels/cuda/gemma4_unit.h"

#include <cmath>

#include "common/error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"

namespace slidedp::kernels::cuda {
namespace {

void check_spec(const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  check_gemma4_layer_spec(s, B, T);
  SLIDEDP_CHECK(
      !s.has_moe() || (s.moe.E <= kRouterMaxExperts && s.moe.activation == ExpertActivation::kGeluTanh),
      "the CUDA Gemma 4 unit routes at most 1024 experts with GeGLU experts");
}

// q.k unscaled (q and k are RMS-normed per head instead); the layer's window on sliding layers.
AttentionShape attention_shape(const UnitContext& ctx, const Gemma4LayerSpec& s, int64_t B, int64_t T) {
  AttentionShape a{B, T, s.H, s.KV, s.hd, ctx.positions};
  a.scale = 1.0;
  a.window = s.window;
  return a;
}

// The router's GEMMs with its input scale C^-1/2 as alpha (the CPU scales the input instead; the same
// product): logits (N, E) fp32 = alpha r Wr^T; backward dr (N, C) fp32 = alpha dlogits Wr and
// dWr += alpha dlogits^T r.
float router_input_scale(const Gemma4LayerSpec& s) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.C)));
}

void router_logits_backward(const UnitContext& ctx, void* ws, float* dr, float* dwr, const bf16* dlogits,
                            const bf16* r, const bf16* wr, int64_t N, int64_t C, int64_t E, float alpha) {
  GemmArgs in;
  in.M = N, in.N = C, in.K = E, in.alpha = alpha;
  in.A = dlogits, in.lda = E, in.B = wr, in.ldb = C;
  in.D = dr, in.ldd = C, in.out_f32 = true;
  ctx.gemm->run(in, ws, ctx.stream);
  GemmArgs w;
  w.trans_a = true;
  w.M = E, w.N = C, w.K = N, w.alpha = alpha, w.beta = 1.0f;
  w.A = dlogits, w.lda = E, w.B = r, w.ldb = C;
  w.D = dwr, w.ldd = C, w.out_f32 = true;
  ctx.gemm->run(w, ws, ctx.stream);
}

DeviceWorkspace experts_saved(const Gemma4LayerSpec& s, const Gemma4SavedMoe<bf16>& m, int64_t N) {
  return {m.experts, experts_saved_bytes(s.moe, N)};
}

// The routed branch (MoE layers), as the CPU unit's moe_forward: dsum = norm_post_ff_1(d) +
// norm_post_ff_2(experts(norm_pre_ff_2(h1))), the router on h1. Statistics go to `router` if given.
void moe_forward(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* p, const Gemma4Saved<bf16>& S,
                 const Gemma4Forward<bf16>& f, int64_t B, int64_t T, const RouterStats* router) {
  const int64_t N = B * T, C = s.C, E = s.moe.E, K = s.moe.K;
  const Gemma4SavedMoe<bf16>& M = S.moe;
  cudaStream_t st = ctx.stream;
  rmsnorm_forward(M.dsum, M.rstd_p1, S.d, p + s.post_ff_norm_1, N, C, s.eps, st);
  rmsnorm_forward(M.r, M.rstd_r, S.h1, p + s.router_scale, N, C, s.eps, st);
  rmsnorm_forward(M.z2, M.rstd_z2, S.h1, p + s.pre_ff_norm_2, N, C, s.eps, st);
  linear_forward_f32(ctx, f.gemm_ws, f.logits, M.r, p + s.router_w, N, C, E, router_input_scale(s));
  router_topk_forward(M.probs, M.idx, M.w_renorm, f.logits, N, E, K, st);
  expert_scale_forward(M.w, M.w_renorm, p + s.per_expert_scale, M.idx, N * K, st);
  if (router != nullptr) router_stats_add(*router, M.probs, M.idx, B, T, E, K, st);
  experts_forward(s.moe, p + s.experts_gate_up, p + s.experts_down, M.z2, M.idx, M.w, M.eo,
                  experts_saved(s, M, N), N, {f.experts, experts_forward_workspace_bytes(s.moe, N)}, st);
  rmsnorm_forward(f.post, M.rstd_p2, M.eo, p + s.post_ff_norm_2, N, C, s.eps, st);
  add_scaled(M.dsum, M.dsum, f.post, nullptr, N * C, st);
}

// From dd (the gradient of dsum, bf16): the routed branch's parameter gradients, its input gradients
// added to dh1 (fp32; the experts' norm and the router's norm both read h1); returns the dense MLP
// output's gradient (through norm_post_ff_1), carved from `carver`.
const bf16* moe_backward(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* p,
                         const Gemma4Saved<bf16>& S, const bf16* dd, const Gemma4BackwardCommon<bf16>& w,
                         float* dp, int64_t B, int64_t T, const RouterStats* router, Carver& carver) {
  const int64_t N = B * T, C = s.C, E = s.moe.E, K = s.moe.K;
  const Gemma4SavedMoe<bf16>& M = S.moe;
  cudaStream_t st = ctx.stream;
  const Gemma4BackwardMoe<bf16> b = carve_gemma4_backward_moe<bf16>(carver, s, N);
  rmsnorm_backward({dd, false, M.eo, M.rstd_p2, p + s.post_ff_norm_2, dp + s.post_ff_norm_2, N, C}, b.deo,
                   false, nullptr, true, w.reduce, st);
  experts_backward(s.moe, p + s.experts_gate_up, p + s.experts_down, M.z2, M.idx, M.w, experts_saved(s, M, N),
                   b.deo, b.dz2, b.dw, dp + s.experts_gate_up, dp + s.experts_down, N,
                   {b.experts, experts_backward_workspace_bytes(s.moe, N)}, st);
  rmsnorm_backward({b.dz2, true, S.h1, M.rstd_z2, p + s.pre_ff_norm_2, dp + s.pre_ff_norm_2, N, C}, w.dh1,
                   true, w.dh1, true, w.reduce, st);
  // w = w_renorm * per_expert_scale[idx]
  expert_scale_backward(dp + s.per_expert_scale, b.dw, M.w_renorm, p + s.per_expert_scale, M.idx, N * K, E,
                        st);
  router_topk_backward(b.dlogits, b.dw, M.probs, M.idx, N, E, K, st);
  if (router != nullptr) router_aux_backward(b.dlogits, M.probs, *router, B, T, E, st);
  f32_to_bf16(b.dlogits, b.dlogits_bf16, N * E, st);
  router_logits_backward(ctx, w.gemm_ws, b.dz2, dp + s.router_w, b.dlogits_bf16, M.r, p + s.router_w, N, C, E,
                         router_input_scale(s));
  rmsnorm_backward({b.dz2, true, S.h1, M.rstd_r, p + s.router_scale, dp + s.router_scale, N, C}, w.dh1, true,
                   w.dh1, true, w.reduce, st);
  rmsnorm_backward({dd, false, S.d, M.rstd_p1, p + s.post_ff_norm_1, dp + s.post_ff_norm_1, N, C}, b.dd_dense,
                   false, nullptr, true, w.reduce, st);
  return b.dd_dense;
}

// Everything up to the saved state; with y also the layer's output (forward). Recompute and forward
// run the same calls on the same values: bitwise equal saved states.
void forward_impl(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* p, const bf16* x, bf16* y,
                  DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                  const RouterStats* router) {
  check_spec(s, B, T);
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Gemma4Saved<bf16> S = carve_gemma4_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  const Gemma4Forward<bf16> f = carve_gemma4_forward<bf16>(carver, s, N);
  cudaStream_t st = ctx.stream;

  // attention block
  rmsnorm_forward(S.h, S.rstd_in, x, p + s.input_norm, N, C, s.eps, st);
  linear_forward(ctx, f.gemm_ws, S.q_lin, S.h, p + s.q_w, N, C, Q);
  linear_forward(ctx, f.gemm_ws, S.k_lin, S.h, p + s.k_w, N, C, K);
  if (!s.k_eq_v) linear_forward(ctx, f.gemm_ws, S.v_lin, S.h, p + s.v_w, N, C, K);
  rmsnorm_forward(S.q, S.rstd_q, S.q_lin, p + s.q_norm, N * s.H, s.hd, s.eps, st);
  rmsnorm_forward(S.k, S.rstd_k, S.k_lin, p + s.k_norm, N * s.KV, s.hd, s.eps, st);
  // K=V: the values are the raw k projection, normed without a weight, not roped
  rmsnorm_forward(S.v, S.rstd_v, s.k_eq_v ? S.k_lin : S.v_lin, nullptr, N * s.KV, s.hd, s.eps, st);
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);  // proportional RoPE: zeros leave pairs unrotated
  rope(S.q, freqs, B, T, s.H, s.hd, false, st, ctx.positions);
  rope(S.k, freqs, B, T, s.KV, s.hd, false, st, ctx.positions);
  attention_forward(S.att, S.lse, S.q, S.k, S.v, attention_shape(ctx, s, B, T), ctx.attention, st);
  linear_forward(ctx, f.gemm_ws, S.a, S.att, p + s.o_w, N, Q, C);
  // h1 = x + norm_post_attn(a)
  rmsnorm_forward(S.h1, S.rstd_pa, S.a, p + s.post_attn_norm, N, C, s.eps, st);
  add_scaled(S.h1, x, S.h1, nullptr, N * C, st);

  // MLP block: d = down(gelu_tanh(z Wg^T) * (z Wu^T)), z = norm_pre_ff(h1)
  rmsnorm_forward(S.z, S.rstd_pf, S.h1, p + s.pre_ff_norm, N, C, s.eps, st);
  linear_forward(ctx, f.gemm_ws, S.g, S.z, p + s.gate_w, N, C, I);
  linear_forward(ctx, f.gemm_ws, S.u, S.z, p + s.up_w, N, C, I);
  geglu_forward(f.m, S.g, S.u, N * I, st);
  linear_forward(ctx, f.gemm_ws, S.d, f.m, p + s.down_w, N, I, C);
  if (s.has_moe()) moe_forward(ctx, s, p, S, f, B, T, router);
  // y = (h1 + norm_post_ff(d)) * layer_scalar (d: dsum on MoE layers); recompute needs only the norm's 1/rms
  bf16* post = y != nullptr ? y : f.post;
  rmsnorm_forward(post, S.rstd_post, s.has_moe() ? S.moe.dsum : S.d, p + s.post_ff_norm, N, C, s.eps, st);
  if (y != nullptr) add_scaled(y, S.h1, y, p + s.layer_scalar, N * C, st);
}

}  // namespace

void gemma4_forward(const UnitContext& ctx, const Gemma4LayerSpec& spec, const bf16* params, const bf16* x,
                    bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                    const RouterStats* router) {
  SLIDEDP_CHECK(y != nullptr && y != x, "gemma4_forward needs an output buffer distinct from x");
  forward_impl(ctx, spec, params, x, y, saved, B, T, ws, router);
}

void gemma4_recompute(const UnitContext& ctx, const Gemma4LayerSpec& spec, const bf16* params, const bf16* x,
                      DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  forward_impl(ctx, spec, params, x, nullptr, saved, B, T, ws, nullptr);  // statistics once, in forward
}

void gemma4_backward(const UnitContext& ctx, const Gemma4LayerSpec& s, const bf16* p, const bf16* x,
                     DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                     DeviceWorkspace ws, const RouterStats* router) {
  check_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Gemma4Saved<bf16> S = carve_gemma4_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  const Gemma4BackwardCommon<bf16> w = carve_gemma4_backward_common<bf16>(carver, s, N);
  float* dp = grads;  // same layout as p
  cudaStream_t st = ctx.stream;

  // y = h2 * layer_scalar, h2 = h1 + norm_post_ff(d): dh2 = dy * scalar flows into h1 and the norm
  scale_to_f32(w.dh1, dy, p + s.layer_scalar, N * C, st);
  {
    const int64_t mark = carver.mark();
    const Gemma4BackwardMlp<bf16> m = carve_gemma4_backward_mlp<bf16>(carver, s, N);
    rmsnorm_backward({w.dh1, true, s.has_moe() ? S.moe.dsum : S.d, S.rstd_post, p + s.post_ff_norm,
                      dp + s.post_ff_norm, N, C},
                     m.dd, false, nullptr, true, w.reduce, st);
    const bf16* dd_dense = s.has_moe() ? moe_backward(ctx, s, p, S, m.dd, w, dp, B, T, router, carver) : m.dd;
    // dz (fp32) through down, GeGLU (m = gelu(g) * u recomputed, not saved), gate and up
    const GatedMlp mlp{p + s.gate_w, p + s.up_w,    p + s.down_w,  dp + s.gate_w,
                       dp + s.up_w,  dp + s.down_w, geglu_forward, geglu_backward};
    gated_mlp_backward(ctx, w.gemm_ws, mlp, dd_dense, S.z, S.g, S.u, m.m_du, m.dm_dg, w.dc, N, C, I);
    // h1 feeds the residual and pre_feedforward_layernorm: dh1 += its backward, in place
    rmsnorm_backward({w.dc, true, S.h1, S.rstd_pf, p + s.pre_ff_norm, dp + s.pre_ff_norm, N, C}, w.dh1, true,
                     w.dh1, true, w.reduce, st);
    carver.release(mark);
  }

  // h1 = x + norm_post_attn(a): dx gets dh1 (residual) at the end, da through the norm
  const Gemma4BackwardAttention<bf16> a = carve_gemma4_backward_attention<bf16>(carver, s, B, T);
  rmsnorm_backward({w.dh1, true, S.a, S.rstd_pa, p + s.post_attn_norm, dp + s.post_attn_norm, N, C}, a.da,
                   false, nullptr, true, w.reduce, st);
  // datt = da Wo; dWo += da^T att
  linear_backward_input_bf16(ctx, w.gemm_ws, a.datt, a.da, p + s.o_w, N, Q, C);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.o_w, a.da, S.att, N, Q, C);
  attention_backward(a.dq, a.dk, a.dv, a.datt, S.q, S.k, S.v, S.att, S.lse, attention_shape(ctx, s, B, T),
                     ctx.attention, a.attn, st);
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);
  rope(a.dq, freqs, B, T, s.H, s.hd, true, st, ctx.positions);
  rope(a.dk, freqs, B, T, s.KV, s.hd, true, st, ctx.positions);
  // through q_norm (into datt, dead now), k_norm and the weightless v_norm
  rmsnorm_backward({a.dq, false, S.q_lin, S.rstd_q, p + s.q_norm, dp + s.q_norm, N * s.H, s.hd}, a.datt,
                   false, nullptr, true, w.reduce, st);
  const RmsnormGrad k_norm{a.dk, false, S.k_lin, S.rstd_k, p + s.k_norm, dp + s.k_norm, N * s.KV, s.hd};
  if (s.k_eq_v) {  // the values are the raw k projection: both gradients flow into k_proj, summed in fp32
    rmsnorm_backward(k_norm, a.dk_sum, true, nullptr, true, w.reduce, st);
    rmsnorm_backward({a.dv, false, S.k_lin, S.rstd_v, nullptr, nullptr, N * s.KV, s.hd}, a.dk_sum, true,
                     a.dk_sum, true, w.reduce, st);
    f32_to_bf16(a.dk_sum, a.dk_lin, N * K, st);
  } else {
    rmsnorm_backward(k_norm, a.dk_lin, false, nullptr, true, w.reduce, st);
    rmsnorm_backward({a.dv, false, S.v_lin, S.rstd_v, nullptr, nullptr, N * s.KV, s.hd}, a.dv_lin, false,
                     nullptr, true, w.reduce, st);
  }
  // dh (fp32) = dq Wq + dk Wk (+ dv Wv); dW += d^T h
  linear_backward_input_f32(ctx, w.gemm_ws, w.dc, a.datt, p + s.q_w, N, C, Q, false);
  linear_backward_input_f32(ctx, w.gemm_ws, w.dc, a.dk_lin, p + s.k_w, N, C, K, true);
  if (!s.k_eq_v) linear_backward_input_f32(ctx, w.gemm_ws, w.dc, a.dv_lin, p + s.v_w, N, C, K, true);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.q_w, a.datt, S.h, N, C, Q);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.k_w, a.dk_lin, S.h, N, C, K);
  if (!s.k_eq_v) linear_backward_weight(ctx, w.gemm_ws, dp + s.v_w, a.dv_lin, S.h, N, C, K);
  // dx (bf16) = dh1 (fp32 residual) + input norm backward of dh
  rmsnorm_backward({w.dc, true, x, S.rstd_in, p + s.input_norm, dp + s.input_norm, N, C}, dx, false, w.dh1,
                   true, w.reduce, st);
}

}  // namespace slidedp::kernels::cuda
