// The GPU units; see units.h. The file reads like kernels/cpu/transformer/llama_layer.cc: carve the
// saved state and the scratch, then the ops in order. The carve sequences live in unit_scratch.h,
// which the size queries run too (in every build, CUDA or not), so sizes and use cannot drift.
#include "kernels/cuda/units.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/rmsnorm.h"

namespace slidedp::kernels::cuda {
namespace {

void check_spec(const DecoderSpec& s, int64_t B, int64_t T) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative batch or sequence length");
  SLIDEDP_CHECK(s.C > 0 && s.H > 0 && s.KV > 0 && s.hd > 0 && s.hd % 2 == 0 && s.I > 0 && s.H % s.KV == 0,
                "bad decoder spec");
  SLIDEDP_CHECK(static_cast<int64_t>(s.inv_freq.size()) == s.hd / 2, "inv_freq must have hd/2 entries");
}

// Everything up to the complete saved state; with y also the MLP output (forward). Recompute and
// forward run the same calls on the same values: bitwise equal saved states.
void forward_impl(const UnitContext& ctx, const DecoderSpec& s, const bf16* p, const bf16* x, bf16* y,
                  DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  check_spec(s, B, T);
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Saved<bf16> S = carve_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  const ForwardScratch<bf16> f = carve_forward<bf16>(carver, s, N);
  cudaStream_t st = ctx.stream;

  // attention block
  rmsnorm_forward(S.h1, S.rstd1, x, p + s.input_norm, N, C, s.eps, st);
  bf16* q_out = s.qk_norm ? S.q_lin : S.q;
  bf16* k_out = s.qk_norm ? S.k_lin : S.k;
  linear_forward(ctx, f.gemm_ws, q_out, S.h1, p + s.q_w, N, C, Q);
  linear_forward(ctx, f.gemm_ws, k_out, S.h1, p + s.k_w, N, C, K);
  linear_forward(ctx, f.gemm_ws, S.v, S.h1, p + s.v_w, N, C, K);
  if (s.attention_bias) {  // Qwen2
    add_bias(q_out, p + s.q_b, N, Q, st);
    add_bias(k_out, p + s.k_b, N, K, st);
    add_bias(S.v, p + s.v_b, N, K, st);
  }
  if (s.qk_norm) {  // Qwen3: RMSNorm over head_dim of every head, before RoPE
    rmsnorm_forward(S.q, S.rstd_q, S.q_lin, p + s.q_norm, N * s.H, s.hd, s.eps, st);
    rmsnorm_forward(S.k, S.rstd_k, S.k_lin, p + s.k_norm, N * s.KV, s.hd, s.eps, st);
  }
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);
  rope(S.q, freqs, B, T, s.H, s.hd, false, st, ctx.positions);
  rope(S.k, freqs, B, T, s.KV, s.hd, false, st, ctx.positions);
  attention_forward(S.att, S.lse, S.q, S.k, S.v, AttentionShape{B, T, s.H, s.KV, s.hd, ctx.positions}, ctx.attention, st);
  // x2 = x + att Wo^T (the residual add as the GEMM's C operand)
  linear_forward(ctx, f.gemm_ws, S.x2, S.att, p + s.o_w, N, Q, C, x);

  // MLP block
  if (mlp_tiled(s)) {
    if (y == nullptr) return;  // recompute: the saved state ends at x2 (backward recomputes the MLP)
    const MlpTile<bf16>& t = f.tile;
    const int64_t R = mlp_tile_rows(s, N);
    for (int64_t n0 = 0; n0 < N; n0 += R) {  // rows [n0, n0 + nt): GEMMs on row offsets of the buffers
      const int64_t nt = std::min(R, N - n0);
      const bf16* x2 = S.x2 + n0 * C;  // (nt, C)
      rmsnorm_forward(t.h2, t.rstd2, x2, p + s.post_norm, nt, C, s.eps, st);
      linear_forward(ctx, f.gemm_ws, t.g, t.h2, p + s.gate_w, nt, C, I);
      linear_forward(ctx, f.gemm_ws, t.u, t.h2, p + s.up_w, nt, C, I);
      swiglu_forward(t.m_du, t.g, t.u, nt * I, st);
      linear_forward(ctx, f.gemm_ws, y + n0 * C, t.m_du, p + s.down_w, nt, I, C, x2);  // y = x2 + m Wd^T
    }
    return;
  }
  rmsnorm_forward(S.h2, S.rstd2, S.x2, p + s.post_norm, N, C, s.eps, st);
  linear_forward(ctx, f.gemm_ws, S.g, S.h2, p + s.gate_w, N, C, I);
  linear_forward(ctx, f.gemm_ws, S.u, S.h2, p + s.up_w, N, C, I);
  if (y == nullptr) return;  // recompute: the saved state is complete
  swiglu_forward(f.m, S.g, S.u, N * I, st);
  linear_forward(ctx, f.gemm_ws, y, f.m, p + s.down_w, N, I, C, S.x2);  // y = x2 + m Wd^T
}

}  // namespace

void decoder_forward(const UnitContext& ctx, const DecoderSpec& spec, const bf16* params, const bf16* x, bf16* y,
                     DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  SLIDEDP_CHECK(y != nullptr && y != x, "decoder_forward needs an output buffer distinct from x");
  forward_impl(ctx, spec, params, x, y, saved, B, T, ws);
}

void decoder_recompute(const UnitContext& ctx, const DecoderSpec& spec, const bf16* params, const bf16* x,
                       DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  forward_impl(ctx, spec, params, x, nullptr, saved, B, T, ws);
}

void decoder_backward(const UnitContext& ctx, const DecoderSpec& s, const bf16* p, const bf16* x,
                      DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                      DeviceWorkspace ws) {
  check_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  if (N == 0) return;
  Carver saved_carver(saved.data, saved.bytes);
  const Saved<bf16> S = carve_saved<bf16>(saved_carver, s, B, T);
  Carver carver(ws.data, ws.bytes);
  const BackwardCommon<bf16> w = carve_backward_common<bf16>(carver, s, N);
  float* dp = grads;  // same layout as p
  cudaStream_t st = ctx.stream;
  const GatedMlp mlp{p + s.gate_w,      p + s.up_w,    p + s.down_w, dp + s.gate_w, dp + s.up_w,
                     dp + s.down_w, swiglu_forward, swiglu_backward};

  // MLP block: y = x2 + m Wd^T, m = silu(g) * u, g = h2 Wg^T, u = h2 Wu^T, h2 = rmsnorm(x2)
  if (mlp_tiled(s)) {
    // Tile by tile: recompute the rows' norm, gate, up and product from x2, then the untiled block's
    // backward on those rows; weight gradients accumulate tile after tile (beta = 1 GEMMs).
    const int64_t mark = carver.mark();
    const MlpTile<bf16> t = carve_mlp_tile<bf16>(carver, s, mlp_tile_rows(s, N), true);
    const int64_t R = mlp_tile_rows(s, N);
    for (int64_t n0 = 0; n0 < N; n0 += R) {
      const int64_t nt = std::min(R, N - n0);
      const bf16* x2 = S.x2 + n0 * C;  // (nt, C)
      const bf16* dyt = dy + n0 * C;   // (nt, C)
      float* dht = w.dh + n0 * C;      // (nt, C)
      rmsnorm_forward(t.h2, t.rstd2, x2, p + s.post_norm, nt, C, s.eps, st);
      linear_forward(ctx, w.gemm_ws, t.g, t.h2, p + s.gate_w, nt, C, I);
      linear_forward(ctx, w.gemm_ws, t.u, t.h2, p + s.up_w, nt, C, I);
      // dh2 (fp32) of the tile's rows; the weight gradients accumulate
      gated_mlp_backward(ctx, w.gemm_ws, mlp, dyt, t.h2, t.g, t.u, t.m_du, t.dm_dg, dht, nt, C, I);
      // dx2 (fp32) rows = dy (residual) + rmsnorm backward of dh2
      RmsnormBackwardArgs nb;
      nb.dy = dht, nb.dy_f32 = true, nb.x = x2, nb.rstd = t.rstd2, nb.w = p + s.post_norm;
      nb.residual = dyt, nb.residual_f32 = false, nb.dx = w.dx2 + n0 * C, nb.dx_f32 = true, nb.dw = dp + s.post_norm;
      nb.N = nt, nb.C = C;
      rmsnorm_backward(nb, w.reduce, st);
    }
    carver.release(mark);
  } else {
    const int64_t mark = carver.mark();
    const BackwardMlp<bf16> m = carve_backward_mlp<bf16>(carver, s, N);
    // dh2 (fp32); m recomputed (not saved)
    gated_mlp_backward(ctx, w.gemm_ws, mlp, dy, S.h2, S.g, S.u, m.m_du, m.dm_dg, w.dh, N, C, I);
    // dx2 (fp32) = dy (residual) + rmsnorm backward of dh2
    RmsnormBackwardArgs nb;
    nb.dy = w.dh, nb.dy_f32 = true, nb.x = S.x2, nb.rstd = S.rstd2, nb.w = p + s.post_norm;
    nb.residual = dy, nb.residual_f32 = false, nb.dx = w.dx2, nb.dx_f32 = true, nb.dw = dp + s.post_norm;
    nb.N = N, nb.C = C;
    rmsnorm_backward(nb, w.reduce, st);
    carver.release(mark);
  }
  f32_to_bf16(w.dx2, w.dx2_bf, N * C, st);

  // attention block: x2 = x + att Wo^T
  const BackwardAttention<bf16> a = carve_backward_attention<bf16>(carver, s, B, T);
  // datt = dx2 Wo; dWo += dx2^T att
  linear_backward_input_bf16(ctx, w.gemm_ws, a.datt, w.dx2_bf, p + s.o_w, N, Q, C);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.o_w, w.dx2_bf, S.att, N, Q, C);
  // dq, dk, dv of the rotated (and normed) q, k and of v
  attention_backward(a.dq, a.dk, a.dv, a.datt, S.q, S.k, S.v, S.att, S.lse, AttentionShape{B, T, s.H, s.KV, s.hd, ctx.positions},
                     ctx.attention, a.attn, st);
  // undo the rotation: gradients w.r.t. q, k before RoPE
  const RopeFreqs freqs = make_rope_freqs(s.inv_freq);
  rope(a.dq, freqs, B, T, s.H, s.hd, true, st, ctx.positions);
  rope(a.dk, freqs, B, T, s.KV, s.hd, true, st, ctx.positions);
  const bf16* dq_lin = a.dq;
  const bf16* dk_lin = a.dk;
  if (s.qk_norm) {  // through q_norm / k_norm; datt is dead after attention_backward: it takes dq_lin
    RmsnormBackwardArgs qn;
    qn.dy = a.dq, qn.dy_f32 = false, qn.x = S.q_lin, qn.rstd = S.rstd_q, qn.w = p + s.q_norm;
    qn.dx = a.datt, qn.dx_f32 = false, qn.dw = dp + s.q_norm, qn.N = N * s.H, qn.C = s.hd;
    rmsnorm_backward(qn, w.reduce, st);
    RmsnormBackwardArgs kn;
    kn.dy = a.dk, kn.dy_f32 = false, kn.x = S.k_lin, kn.rstd = S.rstd_k, kn.w = p + s.k_norm;
    kn.dx = a.dk_lin, kn.dx_f32 = false, kn.dw = dp + s.k_norm, kn.N = N * s.KV, kn.C = s.hd;
    rmsnorm_backward(kn, w.reduce, st);
    dq_lin = a.datt;
    dk_lin = a.dk_lin;
  }
  if (s.attention_bias) {  // Qwen2: db += colsum(d)
    colsum_accumulate(dp + s.q_b, dq_lin, N, Q, w.reduce, st);
    colsum_accumulate(dp + s.k_b, dk_lin, N, K, w.reduce, st);
    colsum_accumulate(dp + s.v_b, a.dv, N, K, w.reduce, st);
  }
  // dh1 (fp32) = dq Wq + dk Wk + dv Wv; dW += d^T h1
  linear_backward_input_f32(ctx, w.gemm_ws, w.dh, dq_lin, p + s.q_w, N, C, Q, false);
  linear_backward_input_f32(ctx, w.gemm_ws, w.dh, dk_lin, p + s.k_w, N, C, K, true);
  linear_backward_input_f32(ctx, w.gemm_ws, w.dh, a.dv, p + s.v_w, N, C, K, true);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.q_w, dq_lin, S.h1, N, C, Q);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.k_w, dk_lin, S.h1, N, C, K);
  linear_backward_weight(ctx, w.gemm_ws, dp + s.v_w, a.dv, S.h1, N, C, K);
  // dx (bf16) = dx2 (fp32 residual) + rmsnorm backward of dh1
  RmsnormBackwardArgs nb;
  nb.dy = w.dh, nb.dy_f32 = true, nb.x = x, nb.rstd = S.rstd1, nb.w = p + s.input_norm;
  nb.residual = w.dx2, nb.residual_f32 = true, nb.dx = dx, nb.dx_f32 = false, nb.dw = dp + s.input_norm;
  nb.N = N, nb.C = C;
  rmsnorm_backward(nb, w.reduce, st);
}

// ---- head ----

void head_forward_backward(const UnitContext& ctx, const HeadSpec& s, const bf16* params, const bf16* lm_head_w,
                           const bf16* x, const int32_t* targets, int64_t B, int64_t T, double grad_scale, bf16* dx,
                           float* grads, float* lm_head_grad, double* loss, DeviceWorkspace ws) {
  SLIDEDP_CHECK(lm_head_w != nullptr && dx != nullptr && grads != nullptr && lm_head_grad != nullptr && dx != x,
                "head needs the lm_head weight, its gradient, grads and a dx distinct from x");
  SLIDEDP_CHECK(s.loss_chunk_tokens > 0, "loss_chunk_tokens must be positive");
  const int64_t N = B * T, C = s.C, V = s.V;
  cudaStream_t st = ctx.stream;
  if (N == 0) {
    SLIDEDP_CUDA_CHECK(cudaMemsetAsync(loss, 0, 2 * sizeof(double), st));
    return;
  }
  Carver carver(ws.data, ws.bytes);
  const HeadScratch<bf16> h = carve_head<bf16>(carver, s, N);
  const int64_t chunk = chunk_rows(s, N);
  // Qwen3.6's final norm scales by (1 + w), as the CPU head's; without the offset its logits are
  // scaled by w alone (half of them at the initial w = 1).
  const float norm_offset = s.norm_zero_centred ? 1.0f : 0.0f;

  rmsnorm_forward(h.hn, h.rstd, x, params + s.norm_w, N, C, s.eps, st, norm_offset);
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nc = std::min(chunk, N - n0);
    const bf16* hc = h.hn + n0 * C;  // (nc, C)
    // logits (nc, V) = hc W^T, fp32
    GemmArgs lg;
    lg.trans_b = true;
    lg.M = nc, lg.N = V, lg.K = C;
    lg.A = hc, lg.lda = C, lg.B = lm_head_w, lg.ldb = C;
    lg.D = h.logits, lg.ldd = V, lg.out_f32 = true;
    ctx.gemm->run(lg, h.gemm_ws, st);
    cross_entropy_chunk(h.logits, h.dlogits, h.loss_rows + n0, targets + n0, nc, V, grad_scale, s.logit_softcap, st);
    // dhn rows (nc, C) = dlogits (nc, V) W (V, C)
    GemmArgs dh;
    dh.M = nc, dh.N = C, dh.K = V;
    dh.A = h.dlogits, dh.lda = V, dh.B = lm_head_w, dh.ldb = C;
    dh.D = h.dhn + n0 * C, dh.ldd = C, dh.out_f32 = true;
    ctx.gemm->run(dh, h.gemm_ws, st);
    // dW (V, C) += dlogits^T (V, nc) hc (nc, C)
    GemmArgs dw;
    dw.trans_a = true;
    dw.M = V, dw.N = C, dw.K = nc;
    dw.A = h.dlogits, dw.lda = V, dw.B = hc, dw.ldb = C;
    dw.beta = 1.0f;
    dw.D = lm_head_grad, dw.ldd = C, dw.out_f32 = true;
    ctx.gemm->run(dw, h.gemm_ws, st);
  }
  cross_entropy_finish(loss, h.loss_rows, targets, N, st);
  RmsnormBackwardArgs nb;
  nb.dy = h.dhn, nb.dy_f32 = true, nb.x = x, nb.rstd = h.rstd;
  nb.w = params + s.norm_w, nb.w_offset = norm_offset;
  nb.dx = dx, nb.dx_f32 = false, nb.dw = grads + s.norm_w, nb.N = N, nb.C = C;
  rmsnorm_backward(nb, h.reduce, st);
}

// ---- embedding ----

int64_t embedding_backward_workspace_bytes(const EmbeddingSpec& spec, int64_t B, int64_t T) {
  return embedding_backward_workspace_bytes(B * T, spec.V);
}

void embedding_forward(const UnitContext& ctx, const EmbeddingSpec& spec, const bf16* params, const int32_t* tokens,
                       int64_t B, int64_t T, bf16* y) {
  embedding_forward(y, tokens, params + spec.weight, B * T, spec.C, spec.V, static_cast<float>(spec.scale), ctx.stream);
}

void embedding_backward(const UnitContext& ctx, const EmbeddingSpec& spec, const int32_t* tokens, const bf16* dy,
                        float* grads, int64_t B, int64_t T, DeviceWorkspace ws) {
  SLIDEDP_CHECK(ws.bytes >= embedding_backward_workspace_bytes(spec, B, T), "embedding backward workspace too small");
  embedding_backward(grads + spec.weight, tokens, dy, B * T, spec.C, spec.V, static_cast<float>(spec.scale), ws.data,
                     ctx.stream);
}

}  // namespace slidedp::kernels::cuda
