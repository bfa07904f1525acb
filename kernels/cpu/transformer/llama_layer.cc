// Decoder layer forward / recompute / backward on the CPU. The file reads as the algorithm: carve
// the saved state and the scratch, then the ops in order. The carve functions are the single
// source of the buffer sizes (the *_bytes queries run them on a measuring Arena).
#include "kernels/cpu/transformer/llama_layer.h"

#include <algorithm>

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
  Real* rstd1;   // (N) input_layernorm 1/rms
  Real* h1;      // (N, C) input_layernorm output
  Real* q_lin;   // (N, H, hd) q_proj output before q_norm          [qk_norm only]
  Real* k_lin;   // (N, KV, hd) k_proj output before k_norm         [qk_norm only]
  Real* rstd_q;  // (N, H) q_norm 1/rms                              [qk_norm only]
  Real* rstd_k;  // (N, KV) k_norm 1/rms                             [qk_norm only]
  Real* q;       // (N, H, hd) queries after norm and RoPE
  Real* k;       // (N, KV, hd) keys after norm and RoPE
  Real* v;       // (N, KV, hd) values
  Real* att;     // (N, H, hd) attention output (o_proj input)
  Real* lse;     // (B, H, T) attention row log-sum-exp
  Real* x2;      // (N, C) residual stream after attention
  Real* rstd2;   // (N) post_attention_layernorm 1/rms          [untiled MLP only]
  Real* h2;      // (N, C) post_attention_layernorm output      [untiled MLP only]
  Real* g;       // (N, I) gate_proj output                     [untiled MLP only]
  Real* u;       // (N, I) up_proj output                       [untiled MLP only]
};

bool mlp_tiled(const DecoderSpec& s) { return s.mlp_token_tile > 0; }
// Rows of one MLP tile for N token rows (the last tile may be shorter).
int64_t mlp_tile_rows(const DecoderSpec& s, int64_t N) { return std::min(s.mlp_token_tile, N); }

template <typename Real>
Saved<Real> carve_saved(Arena& a, const DecoderSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  Saved<Real> v;
  v.rstd1 = a.take<Real>(N, "rstd1");
  v.h1 = a.take<Real>(N * s.C, "h1");
  v.q_lin = s.qk_norm ? a.take<Real>(N * s.q_dim(), "q_lin") : nullptr;
  v.k_lin = s.qk_norm ? a.take<Real>(N * s.kv_dim(), "k_lin") : nullptr;
  v.rstd_q = s.qk_norm ? a.take<Real>(N * s.H, "rstd_q") : nullptr;
  v.rstd_k = s.qk_norm ? a.take<Real>(N * s.KV, "rstd_k") : nullptr;
  v.q = a.take<Real>(N * s.q_dim(), "q");
  v.k = a.take<Real>(N * s.kv_dim(), "k");
  v.v = a.take<Real>(N * s.kv_dim(), "v");
  v.att = a.take<Real>(N * s.q_dim(), "att");
  v.lse = a.take<Real>(B * s.H * T, "lse");
  v.x2 = a.take<Real>(N * s.C, "x2");
  if (mlp_tiled(s)) {  // the MLP recomputes its rows tile by tile in backward: nothing of it is saved
    v.rstd2 = v.h2 = v.g = v.u = nullptr;
    return v;
  }
  v.rstd2 = a.take<Real>(N, "rstd2");
  v.h2 = a.take<Real>(N * s.C, "h2");
  v.g = a.take<Real>(N * s.I, "g");
  v.u = a.take<Real>(N * s.I, "u");
  return v;
}

AttentionShape attention_shape(const DecoderSpec& s, int64_t B, int64_t T,
                               const int32_t* positions = nullptr) {
  AttentionShape a{B, T, s.H, s.KV, s.hd, s.attn_tile, s.threads};
  a.positions = positions;
  return a;
}

// Forward scratch, in take order. rope tables stay; the attention scratch is released before the
// MLP scratch is taken (m, or one MLP tile), so the peak is rope + max(attention, MLP).
template <typename Real>
struct ForwardScratch {
  Real* cos;  // (T, hd/2)
  Real* sin;  // (T, hd/2)
};

template <typename Real>
ForwardScratch<Real> carve_forward_common(Arena& a, const DecoderSpec& s, int64_t T) {
  return ForwardScratch<Real>{a.take<Real>(T * s.hd / 2), a.take<Real>(T * s.hd / 2)};
}

// Backward scratch: dh lives throughout; the MLP part and the attention part reuse the same bytes.
template <typename Real>
struct BackwardCommon {
  Real* cos;  // (T, hd/2)
  Real* sin;  // (T, hd/2)
  Real* dh;   // (N, C) gradient of h2, later of h1
};
template <typename Real>
struct BackwardMlp {
  Real* m_du;   // (N, I) recomputed silu(g) * u, then du
  Real* dm_dg;  // (N, I) dm, then dg
};
template <typename Real>
struct BackwardAttention {
  Real* datt;    // (N, H, hd) gradient of the attention output, later of q_lin (qk_norm)
  Real* dq;      // (N, H, hd)
  Real* dk;      // (N, KV, hd)
  Real* dv;      // (N, KV, hd)
  Real* dk_lin;  // (N, KV, hd) [qk_norm only]
  Workspace attn;
};

// One MLP token tile (R rows): what the tiled MLP computes for its rows in forward and recomputes in
// backward. `backward` adds dm.
template <typename Real>
struct MlpTile {
  Real* rstd2;  // (R) post_attention_layernorm 1/rms of the tile's rows
  Real* h2;     // (R, C) post_attention_layernorm output
  Real* g;      // (R, I) gate_proj output
  Real* u;      // (R, I) up_proj output
  Real* m_du;   // (R, I) silu(g) * u, then (backward) du
  Real* dm_dg;  // (R, I) dm, then dg                 [backward only]
};
template <typename Real>
MlpTile<Real> carve_mlp_tile(Arena& a, const DecoderSpec& s, int64_t R, bool backward) {
  MlpTile<Real> t;
  t.rstd2 = a.take<Real>(R, "mlp tile rstd2");
  t.h2 = a.take<Real>(R * s.C, "mlp tile h2");
  t.g = a.take<Real>(R * s.I, "mlp tile g");
  t.u = a.take<Real>(R * s.I, "mlp tile u");
  t.m_du = a.take<Real>(R * s.I, "mlp tile m / du");
  t.dm_dg = backward ? a.take<Real>(R * s.I, "mlp tile dm / dg") : nullptr;
  return t;
}

// The forward pass's MLP scratch: m (N, I) for the untiled MLP, or one MLP tile.
template <typename Real>
struct ForwardMlp {
  Real* m = nullptr;     // (N, I) silu(g) * u               [untiled]
  MlpTile<Real> tile{};  //                              [tiled]
};
template <typename Real>
ForwardMlp<Real> carve_forward_mlp(Arena& a, const DecoderSpec& s, int64_t N) {
  ForwardMlp<Real> f;
  if (mlp_tiled(s))
    f.tile = carve_mlp_tile<Real>(a, s, mlp_tile_rows(s, N), false);
  else
    f.m = a.take<Real>(N * s.I, "m");
  return f;
}

template <typename Real>
BackwardCommon<Real> carve_backward_common(Arena& a, const DecoderSpec& s, int64_t B, int64_t T) {
  return BackwardCommon<Real>{a.take<Real>(T * s.hd / 2), a.take<Real>(T * s.hd / 2),
                              a.take<Real>(B * T * s.C)};
}
template <typename Real>
BackwardMlp<Real> carve_backward_mlp(Arena& a, const DecoderSpec& s, int64_t N) {
  return BackwardMlp<Real>{a.take<Real>(N * s.I), a.take<Real>(N * s.I)};
}
template <typename Real>
BackwardAttention<Real> carve_backward_attention(Arena& a, const DecoderSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  BackwardAttention<Real> v;
  v.datt = a.take<Real>(N * s.q_dim());
  v.dq = a.take<Real>(N * s.q_dim());
  v.dk = a.take<Real>(N * s.kv_dim());
  v.dv = a.take<Real>(N * s.kv_dim());
  v.dk_lin = s.qk_norm ? a.take<Real>(N * s.kv_dim()) : nullptr;
  v.attn = a.take_workspace(attention_backward_workspace_bytes<Real>(attention_shape(s, B, T)));
  return v;
}

template <typename Real>
const Real* at(const Real* params, int64_t offset) {
  return offset == kAbsent ? nullptr : params + offset;
}
template <typename Real>
Real* at(Real* grads, int64_t offset) {
  return offset == kAbsent ? nullptr : grads + offset;
}

void check_spec(const DecoderSpec& s, int64_t B, int64_t T) {
  SLIDEDP_CHECK(B >= 0 && T >= 0, "negative batch or sequence length");
  SLIDEDP_CHECK(s.C > 0 && s.H > 0 && s.KV > 0 && s.hd > 0 && s.hd % 2 == 0 && s.I > 0 && s.H % s.KV == 0,
                "bad decoder spec");
  SLIDEDP_CHECK(static_cast<int64_t>(s.inv_freq.size()) == s.hd / 2, "inv_freq must have hd/2 entries");
  SLIDEDP_CHECK(s.mlp_token_tile >= 0, "mlp_token_tile must not be negative");
}

// Everything up to the saved state; y != nullptr also runs the MLP output (forward), y == nullptr
// stops where the saved state is complete (recompute). Both paths run the same calls in the same
// order on the same values, which is what makes recompute bitwise equal to forward.
template <typename Real>
void forward_impl(const DecoderSpec& s, const Real* p, const Real* x, Real* y, Workspace saved, int64_t B,
                  int64_t T, Workspace ws, const int32_t* positions) {
  check_spec(s, B, T);
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  const ForwardScratch<Real> f = carve_forward_common<Real>(arena, s, T);

  // attention block
  rmsnorm_forward(S.h1, S.rstd1, x, p + s.input_norm, N, C, s.eps);
  Real* q_out = s.qk_norm ? S.q_lin : S.q;
  Real* k_out = s.qk_norm ? S.k_lin : S.k;
  linear_forward(q_out, S.h1, p + s.q_w, at(p, s.q_b), N, C, Q, false);
  linear_forward(k_out, S.h1, p + s.k_w, at(p, s.k_b), N, C, K, false);
  linear_forward(S.v, S.h1, p + s.v_w, at(p, s.v_b), N, C, K, false);
  if (s.qk_norm) {  // Qwen3: RMSNorm over head_dim of every head, before RoPE
    rmsnorm_forward(S.q, S.rstd_q, S.q_lin, p + s.q_norm, N * s.H, s.hd, s.eps);
    rmsnorm_forward(S.k, S.rstd_k, S.k_lin, p + s.k_norm, N * s.KV, s.hd, s.eps);
  }
  rope_tables(f.cos, f.sin, s.inv_freq, T);
  rope_forward(S.q, f.cos, f.sin, B, T, s.H, s.hd, positions);
  rope_forward(S.k, f.cos, f.sin, B, T, s.KV, s.hd, positions);
  {
    const int64_t mark = arena.mark();
    const AttentionShape as = attention_shape(s, B, T, positions);
    attention_forward(S.att, S.lse, S.q, S.k, S.v, as,
                      arena.take_workspace(attention_forward_workspace_bytes<Real>(as)));
    arena.release(mark);
  }
  std::copy(x, x + N * C, S.x2);
  // x2 = x + att Wo^T (the residual add folded into the GEMM's beta = 1)
  linear_forward(S.x2, S.att, p + s.o_w, static_cast<const Real*>(nullptr), N, Q, C, true);

  // MLP block
  const Real* const no_bias = nullptr;
  if (mlp_tiled(s)) {
    if (y == nullptr) return;  // recompute: the saved state ends at x2 (backward recomputes the MLP)
    const MlpTile<Real> t = carve_forward_mlp<Real>(arena, s, N).tile;
    const int64_t R = mlp_tile_rows(s, N);
    for (int64_t n0 = 0; n0 < N; n0 += R) {  // rows [n0, n0 + nt): the MLP is row-independent
      const int64_t nt = std::min(R, N - n0);
      const Real* x2 = S.x2 + n0 * C;  // (nt, C)
      Real* yt = y + n0 * C;           // (nt, C)
      rmsnorm_forward(t.h2, t.rstd2, x2, p + s.post_norm, nt, C, s.eps);
      linear_forward(t.g, t.h2, p + s.gate_w, no_bias, nt, C, I, false);
      linear_forward(t.u, t.h2, p + s.up_w, no_bias, nt, C, I, false);
      swiglu_forward(t.m_du, t.g, t.u, nt * I, s.threads);
      std::copy(x2, x2 + nt * C, yt);
      linear_forward(yt, t.m_du, p + s.down_w, no_bias, nt, I, C, true);  // y = x2 + m Wd^T
    }
    return;
  }
  rmsnorm_forward(S.h2, S.rstd2, S.x2, p + s.post_norm, N, C, s.eps);
  linear_forward(S.g, S.h2, p + s.gate_w, no_bias, N, C, I, false);
  linear_forward(S.u, S.h2, p + s.up_w, no_bias, N, C, I, false);
  if (y == nullptr) return;                          // recompute: the saved state is complete
  Real* m = carve_forward_mlp<Real>(arena, s, N).m;  // (N, I)
  swiglu_forward(m, S.g, S.u, N * I, s.threads);
  std::copy(S.x2, S.x2 + N * C, y);
  linear_forward(y, m, p + s.down_w, no_bias, N, I, C, true);  // y = x2 + m Wd^T
}

// Backward of the tiled MLP block, tile by tile: recompute the rows' norm, gate, up and SwiGLU product
// from the saved x2, then the same backward as the untiled block on those rows. Weight gradients
// accumulate tile after tile (only the summation order over tokens differs from the untiled block).
// dx (N, C) receives dx2 = dy + the post-norm backward; dh (N, C) is scratch.
template <typename Real>
void mlp_backward_tiled(const DecoderSpec& s, const Real* p, const Saved<Real>& S, const Real* dy, Real* dx,
                        Real* dp, Real* dh, int64_t N, Arena& arena) {
  const int64_t C = s.C, I = s.I, R = mlp_tile_rows(s, N);
  const MlpTile<Real> t = carve_mlp_tile<Real>(arena, s, R, true);
  const Real* const no_bias_in = nullptr;
  Real* const no_bias = nullptr;
  for (int64_t n0 = 0; n0 < N; n0 += R) {
    const int64_t nt = std::min(R, N - n0);
    const Real* x2 = S.x2 + n0 * C;  // (nt, C)
    const Real* dyt = dy + n0 * C;   // (nt, C)
    Real* dxt = dx + n0 * C;         // (nt, C)
    Real* dht = dh + n0 * C;         // (nt, C)
    // recompute the tile exactly as forward computed it
    rmsnorm_forward(t.h2, t.rstd2, x2, p + s.post_norm, nt, C, s.eps);
    linear_forward(t.g, t.h2, p + s.gate_w, no_bias_in, nt, C, I, false);
    linear_forward(t.u, t.h2, p + s.up_w, no_bias_in, nt, C, I, false);
    swiglu_forward(t.m_du, t.g, t.u, nt * I, s.threads);
    // dm = dy Wd; dWd += dy^T m
    linear_backward(t.dm_dg, dp + s.down_w, no_bias, dyt, t.m_du, p + s.down_w, nt, I, C, false);
    // dg, du (in place over dm and m)
    swiglu_backward(t.dm_dg, t.m_du, t.dm_dg, t.g, t.u, nt * I, s.threads);
    // dh2 = dg Wg + du Wu; dWg += dg^T h2; dWu += du^T h2
    linear_backward(dht, dp + s.gate_w, no_bias, t.dm_dg, t.h2, p + s.gate_w, nt, C, I, false);
    linear_backward(dht, dp + s.up_w, no_bias, t.m_du, t.h2, p + s.up_w, nt, C, I, true);
    // dx2 = dy (residual) + rmsnorm backward of dh2
    std::copy(dyt, dyt + nt * C, dxt);
    rmsnorm_backward(dxt, dp + s.post_norm, dht, x2, t.rstd2, p + s.post_norm, nt, C, true);
  }
}

}  // namespace

template <typename Real>
int64_t decoder_saved_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  Arena a;
  carve_saved<Real>(a, spec, B, T);
  return a.high_water_bytes();
}

template <typename Real>
std::vector<ArenaPiece> decoder_saved_layout(const DecoderSpec& spec, int64_t B, int64_t T) {
  Arena a;
  a.enable_trace();
  carve_saved<Real>(a, spec, B, T);
  return a.trace();
}

template <typename Real>
int64_t decoder_forward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  Arena a;  // the take sequence of forward_impl
  carve_forward_common<Real>(a, spec, T);
  const int64_t mark = a.mark();
  a.take_workspace(attention_forward_workspace_bytes<Real>(attention_shape(spec, B, T)));
  a.release(mark);
  carve_forward_mlp<Real>(a, spec, B * T);
  return a.high_water_bytes();
}

template <typename Real>
int64_t decoder_backward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T) {
  Arena a;  // the take sequence of decoder_backward
  carve_backward_common<Real>(a, spec, B, T);
  const int64_t mark = a.mark();
  if (mlp_tiled(spec))
    carve_mlp_tile<Real>(a, spec, mlp_tile_rows(spec, B * T), true);
  else
    carve_backward_mlp<Real>(a, spec, B * T);
  a.release(mark);
  carve_backward_attention<Real>(a, spec, B, T);
  return a.high_water_bytes();
}

template <typename Real>
void decoder_forward(const DecoderSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                     int64_t B, int64_t T, Workspace ws, const int32_t* positions) {
  SLIDEDP_CHECK(y != nullptr && y != x, "decoder_forward needs an output buffer distinct from x");
  forward_impl(spec, params, x, y, saved, B, T, ws, positions);
}

template <typename Real>
void decoder_recompute(const DecoderSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                       int64_t T, Workspace ws, const int32_t* positions) {
  forward_impl(spec, params, x, static_cast<Real*>(nullptr), saved, B, T, ws, positions);
}

template <typename Real>
void decoder_backward(const DecoderSpec& s, const Real* p, const Real* x, Workspace saved, const Real* dy,
                      Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws, const int32_t* positions) {
  check_spec(s, B, T);
  SLIDEDP_CHECK(dx != dy && dx != x, "dx must not alias dy or x");
  const int64_t N = B * T, C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  Arena saved_arena(saved);
  const Saved<Real> S = carve_saved<Real>(saved_arena, s, B, T);
  Arena arena(ws);
  const BackwardCommon<Real> w = carve_backward_common<Real>(arena, s, B, T);
  Real* dp = grads;  // same layout as p

  // MLP block: y = x2 + m Wd^T, m = silu(g) * u, g = h2 Wg^T, u = h2 Wu^T, h2 = rmsnorm(x2)
  if (mlp_tiled(s)) {
    const int64_t mark = arena.mark();
    mlp_backward_tiled(s, p, S, dy, dx, dp, w.dh, N, arena);
    arena.release(mark);
  } else {
    const int64_t mark = arena.mark();
    const BackwardMlp<Real> m = carve_backward_mlp<Real>(arena, s, N);
    Real* const no_bias = nullptr;
    // recompute m = silu(g) * u (not saved: 2 elementwise passes cost less than N*I of memory)
    swiglu_forward(m.m_du, S.g, S.u, N * I, s.threads);
    // dm = dy Wd; dWd += dy^T m
    linear_backward(m.dm_dg, dp + s.down_w, no_bias, dy, m.m_du, p + s.down_w, N, I, C, false);
    // dg, du (in place over dm and m)
    swiglu_backward(m.dm_dg, m.m_du, m.dm_dg, S.g, S.u, N * I, s.threads);
    // dh2 = dg Wg + du Wu; dWg += dg^T h2; dWu += du^T h2
    linear_backward(w.dh, dp + s.gate_w, no_bias, m.dm_dg, S.h2, p + s.gate_w, N, C, I, false);
    linear_backward(w.dh, dp + s.up_w, no_bias, m.m_du, S.h2, p + s.up_w, N, C, I, true);
    // dx2 = dy (residual) + rmsnorm backward of dh2; held in dx from here on
    std::copy(dy, dy + N * C, dx);
    rmsnorm_backward(dx, dp + s.post_norm, w.dh, S.x2, S.rstd2, p + s.post_norm, N, C, true);
    arena.release(mark);
  }

  // attention block: x2 = x + att Wo^T
  const BackwardAttention<Real> a = carve_backward_attention<Real>(arena, s, B, T);
  Real* const no_bias = nullptr;
  // datt = dx2 Wo; dWo += dx2^T att
  linear_backward(a.datt, dp + s.o_w, no_bias, dx, S.att, p + s.o_w, N, Q, C, false);
  // dq, dk, dv of the rotated (and normed) q, k and of v
  attention_backward(a.dq, a.dk, a.dv, a.datt, S.q, S.k, S.v, S.att, S.lse,
                     attention_shape(s, B, T, positions), a.attn);
  // undo the rotation: gradients w.r.t. q, k before RoPE
  rope_tables(w.cos, w.sin, s.inv_freq, T);
  rope_backward(a.dq, w.cos, w.sin, B, T, s.H, s.hd, positions);
  rope_backward(a.dk, w.cos, w.sin, B, T, s.KV, s.hd, positions);
  const Real* dq_lin = a.dq;
  const Real* dk_lin = a.dk;
  if (s.qk_norm) {  // through q_norm / k_norm; datt is dead after attention_backward: it takes dq_lin
    rmsnorm_backward(a.datt, dp + s.q_norm, a.dq, S.q_lin, S.rstd_q, p + s.q_norm, N * s.H, s.hd, false);
    rmsnorm_backward(a.dk_lin, dp + s.k_norm, a.dk, S.k_lin, S.rstd_k, p + s.k_norm, N * s.KV, s.hd, false);
    dq_lin = a.datt;
    dk_lin = a.dk_lin;
  }
  // dh1 = dq Wq + dk Wk + dv Wv; dW += d^T h1; db += colsum(d) (Qwen2)
  linear_backward(w.dh, dp + s.q_w, at(dp, s.q_b), dq_lin, S.h1, p + s.q_w, N, C, Q, false);
  linear_backward(w.dh, dp + s.k_w, at(dp, s.k_b), dk_lin, S.h1, p + s.k_w, N, C, K, true);
  linear_backward(w.dh, dp + s.v_w, at(dp, s.v_b), a.dv, S.h1, p + s.v_w, N, C, K, true);
  // dx = dx2 (residual) + rmsnorm backward of dh1
  rmsnorm_backward(dx, dp + s.input_norm, w.dh, x, S.rstd1, p + s.input_norm, N, C, true);
}

#define SLIDEDP_INSTANTIATE(Real)                                                                            \
  template int64_t decoder_saved_bytes<Real>(const DecoderSpec&, int64_t, int64_t);                          \
  template std::vector<ArenaPiece> decoder_saved_layout<Real>(const DecoderSpec&, int64_t, int64_t);         \
  template int64_t decoder_forward_workspace_bytes<Real>(const DecoderSpec&, int64_t, int64_t);              \
  template int64_t decoder_backward_workspace_bytes<Real>(const DecoderSpec&, int64_t, int64_t);             \
  template void decoder_forward<Real>(const DecoderSpec&, const Real*, const Real*, Real*, Workspace,        \
                                      int64_t, int64_t, Workspace, const int32_t*);                          \
  template void decoder_recompute<Real>(const DecoderSpec&, const Real*, const Real*, Workspace, int64_t,    \
                                        int64_t, Workspace, const int32_t*);                                 \
  template void decoder_backward<Real>(const DecoderSpec&, const Real*, const Real*, Workspace, const Real*, \
                                       Real*, Real*, int64_t, int64_t, Workspace, const int32_t*);
SLIDEDP_INSTANTIATE(float)
SLIDEDP_INSTANTIATE(double)
#undef SLIDEDP_INSTANTIATE

}  // namespace slidedp::kernels
