// The GPU units' device buffers: the carve sequences that kernels/cuda/units.cc runs over device
// memory and the size queries run over nothing. No CUDA type appears here, so this compiles in every
// build and the memory account (model/unit_memory.h) sizes the CUDA backend's units exactly on a
// machine without CUDA. Templates take the bf16 storage type (__nv_bfloat16 in the kernels, a 2-byte
// stand-in for sizing); every piece is 256-byte aligned so cuBLASLt sees well-aligned operands.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cpu/transformer/unit_spec.h"
#include "kernels/cuda/scratch_sizes.h"

namespace slidedp::kernels::cuda {

inline constexpr int64_t kCarveAlignBytes = 256;

// Hands out 256-byte-aligned pieces of a device block in LIFO order; over a null block it only
// measures (kernels/cpu/transformer/arena.h does the same for host memory).
class Carver {
 public:
  Carver() = default;
  Carver(void* data, int64_t bytes) : base_(static_cast<std::byte*>(data)), capacity_(bytes), measuring_(false) {
    SLIDEDP_CHECK(bytes >= 0 && (data != nullptr || bytes == 0), "device workspace has bytes but no memory");
    SLIDEDP_CHECK(reinterpret_cast<uintptr_t>(data) % kCarveAlignBytes == 0, "device workspace must be 256-byte aligned");
  }
  template <typename U>
  U* take(int64_t n, const char* what) {
    SLIDEDP_CHECK(n >= 0, "negative allocation");
    const int64_t start = (used_ + kCarveAlignBytes - 1) / kCarveAlignBytes * kCarveAlignBytes;
    used_ = start + n * static_cast<int64_t>(sizeof(U));
    high_water_ = std::max(high_water_, used_);
    if (measuring_) return nullptr;
    SLIDEDP_CHECK(used_ <= capacity_, std::string("device workspace too small at ") + what + ": need " +
                                          std::to_string(used_) + " bytes, have " + std::to_string(capacity_));
    return reinterpret_cast<U*>(base_ + start);
  }
  int64_t mark() const { return used_; }
  void release(int64_t mark) { used_ = mark; }
  int64_t high_water() const { return high_water_; }

 private:
  std::byte* base_ = nullptr;
  int64_t capacity_ = 0;
  bool measuring_ = true;
  int64_t used_ = 0, high_water_ = 0;
};

// DecoderSpec::mlp_token_tile > 0: the MLP runs over that many token rows at a time and saves nothing
// (backward recomputes each tile's norm, gate and up from x2), as on the CPU backend.
inline bool mlp_tiled(const DecoderSpec& s) { return s.mlp_token_tile > 0; }
inline int64_t mlp_tile_rows(const DecoderSpec& s, int64_t N) { return std::min(s.mlp_token_tile, N); }

// Views of the decoder's saved state (N = B*T tokens).
template <typename Bf16>
struct Saved {
  float* rstd1;   // (N) input_layernorm 1/rms
  Bf16* h1;       // (N, C) input_layernorm output
  Bf16* q_lin;    // (N, H, hd) q_proj output before q_norm        [qk_norm only]
  Bf16* k_lin;    // (N, KV, hd) k_proj output before k_norm       [qk_norm only]
  float* rstd_q;  // (N, H) q_norm 1/rms                            [qk_norm only]
  float* rstd_k;  // (N, KV) k_norm 1/rms                           [qk_norm only]
  Bf16* q;        // (N, H, hd) queries after norm and RoPE
  Bf16* k;        // (N, KV, hd) keys after norm and RoPE
  Bf16* v;        // (N, KV, hd) values
  Bf16* att;      // (N, H, hd) attention output (o_proj input)
  float* lse;     // (B, H, T) attention row log-sum-exp
  Bf16* x2;       // (N, C) residual stream after attention
  float* rstd2;   // (N) post_attention_layernorm 1/rms          [untiled MLP only]
  Bf16* h2;       // (N, C) post_attention_layernorm output      [untiled MLP only]
  Bf16* g;        // (N, I) gate_proj output                     [untiled MLP only]
  Bf16* u;        // (N, I) up_proj output                       [untiled MLP only]
};
template <typename Bf16>
Saved<Bf16> carve_saved(Carver& a, const DecoderSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  Saved<Bf16> v{};
  v.rstd1 = a.take<float>(N, "rstd1");
  v.h1 = a.take<Bf16>(N * s.C, "h1");
  if (s.qk_norm) {
    v.q_lin = a.take<Bf16>(N * s.q_dim(), "q_lin");
    v.k_lin = a.take<Bf16>(N * s.kv_dim(), "k_lin");
    v.rstd_q = a.take<float>(N * s.H, "rstd_q");
    v.rstd_k = a.take<float>(N * s.KV, "rstd_k");
  }
  v.q = a.take<Bf16>(N * s.q_dim(), "q");
  v.k = a.take<Bf16>(N * s.kv_dim(), "k");
  v.v = a.take<Bf16>(N * s.kv_dim(), "v");
  v.att = a.take<Bf16>(N * s.q_dim(), "att");
  v.lse = a.take<float>(B * s.H * T, "lse");
  v.x2 = a.take<Bf16>(N * s.C, "x2");
  if (mlp_tiled(s)) return v;
  v.rstd2 = a.take<float>(N, "rstd2");
  v.h2 = a.take<Bf16>(N * s.C, "h2");
  v.g = a.take<Bf16>(N * s.I, "g");
  v.u = a.take<Bf16>(N * s.I, "u");
  return v;
}

// One MLP token tile (R rows): what the tiled MLP computes for its rows in forward and recomputes
// in backward; `backward` adds dm.
template <typename Bf16>
struct MlpTile {
  float* rstd2;  // (R) post_attention_layernorm 1/rms of the tile's rows
  Bf16* h2;      // (R, C)
  Bf16* g;       // (R, I)
  Bf16* u;       // (R, I)
  Bf16* m_du;    // (R, I) silu(g) * u, then (backward) du
  Bf16* dm_dg;   // (R, I) dm, then dg                 [backward only]
};
template <typename Bf16>
MlpTile<Bf16> carve_mlp_tile(Carver& a, const DecoderSpec& s, int64_t R, bool backward) {
  MlpTile<Bf16> t{};
  t.rstd2 = a.take<float>(R, "mlp tile rstd2");
  t.h2 = a.take<Bf16>(R * s.C, "mlp tile h2");
  t.g = a.take<Bf16>(R * s.I, "mlp tile g");
  t.u = a.take<Bf16>(R * s.I, "mlp tile u");
  t.m_du = a.take<Bf16>(R * s.I, "mlp tile m / du");
  t.dm_dg = backward ? a.take<Bf16>(R * s.I, "mlp tile dm / dg") : nullptr;
  return t;
}

// Forward scratch: the cuBLASLt workspace, then m = silu(g) * u for the down projection (untiled),
// or one MLP tile.
template <typename Bf16>
struct ForwardScratch {
  void* gemm_ws;
  Bf16* m;             // (N, I)  [untiled]
  MlpTile<Bf16> tile;  //         [tiled]
};
template <typename Bf16>
ForwardScratch<Bf16> carve_forward(Carver& a, const DecoderSpec& s, int64_t N) {
  ForwardScratch<Bf16> f{};
  f.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  if (mlp_tiled(s))
    f.tile = carve_mlp_tile<Bf16>(a, s, mlp_tile_rows(s, N), false);
  else
    f.m = a.take<Bf16>(N * s.I, "m");
  return f;
}

// Backward scratch: the pieces that live throughout, then the MLP part and the attention part
// reusing the same bytes.
template <typename Bf16>
struct BackwardCommon {
  void* gemm_ws;
  float* dh;      // (N, C) fp32 gradient of h2, later of h1 (sums of GEMMs)
  float* dx2;     // (N, C) fp32 gradient of the residual stream after attention
  Bf16* dx2_bf;   // (N, C) dx2 rounded, the GEMM input of the attention block
  void* reduce;   // partials of the norm-weight and bias gradients
};
template <typename Bf16>
struct BackwardMlp {
  Bf16* m_du;   // (N, I) recomputed silu(g) * u, then du
  Bf16* dm_dg;  // (N, I) dm, then dg
};
template <typename Bf16>
struct BackwardAttention {
  Bf16* datt;    // (N, H, hd) gradient of the attention output, later of q_lin (qk_norm)
  Bf16* dq;      // (N, H, hd)
  Bf16* dk;      // (N, KV, hd)
  Bf16* dv;      // (N, KV, hd)
  Bf16* dk_lin;  // (N, KV, hd) [qk_norm only]
  float* attn;   // attention backward scratch (B, H, T)
};

inline int64_t reduce_bytes(const DecoderSpec& s, int64_t N) {
  int64_t b = rmsnorm_backward_workspace_bytes(N, s.C);
  if (s.qk_norm) {
    b = std::max(b, rmsnorm_backward_workspace_bytes(N * s.H, s.hd));
    b = std::max(b, rmsnorm_backward_workspace_bytes(N * s.KV, s.hd));
  }
  if (s.attention_bias) b = std::max(b, colsum_workspace_bytes(N, std::max(s.q_dim(), s.kv_dim())));
  return b;
}

template <typename Bf16>
BackwardCommon<Bf16> carve_backward_common(Carver& a, const DecoderSpec& s, int64_t N) {
  BackwardCommon<Bf16> c{};
  c.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  c.dh = a.take<float>(N * s.C, "dh");
  c.dx2 = a.take<float>(N * s.C, "dx2");
  c.dx2_bf = a.take<Bf16>(N * s.C, "dx2 bf16");
  c.reduce = a.take<std::byte>(reduce_bytes(s, N), "gradient reduction partials");
  return c;
}
template <typename Bf16>
BackwardMlp<Bf16> carve_backward_mlp(Carver& a, const DecoderSpec& s, int64_t N) {
  return BackwardMlp<Bf16>{a.take<Bf16>(N * s.I, "m / du"), a.take<Bf16>(N * s.I, "dm / dg")};
}
template <typename Bf16>
BackwardAttention<Bf16> carve_backward_attention(Carver& a, const DecoderSpec& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  BackwardAttention<Bf16> v{};
  v.datt = a.take<Bf16>(N * s.q_dim(), "datt");
  v.dq = a.take<Bf16>(N * s.q_dim(), "dq");
  v.dk = a.take<Bf16>(N * s.kv_dim(), "dk");
  v.dv = a.take<Bf16>(N * s.kv_dim(), "dv");
  v.dk_lin = s.qk_norm ? a.take<Bf16>(N * s.kv_dim(), "dk_lin") : nullptr;
  v.attn = reinterpret_cast<float*>(a.take<std::byte>(attention_backward_workspace_bytes(B, s.H, T), "attention D"));
  return v;
}

// The head's scratch (N tokens; the loss works on chunk_rows() of them at a time).
template <typename Bf16>
struct HeadScratch {
  void* gemm_ws;
  Bf16* hn;           // (N, C) final norm output
  float* rstd;        // (N)
  float* dhn;         // (N, C) fp32 gradient of hn
  double* loss_rows;  // (N) per-token loss
  float* logits;      // (chunk, V)
  Bf16* dlogits;      // (chunk, V)
  void* reduce;       // norm-weight gradient partials
};
inline int64_t chunk_rows(const HeadSpec& s, int64_t N) { return std::max<int64_t>(1, std::min(s.loss_chunk_tokens, N)); }
template <typename Bf16>
HeadScratch<Bf16> carve_head(Carver& a, const HeadSpec& s, int64_t N) {
  const int64_t chunk = chunk_rows(s, N);
  HeadScratch<Bf16> h{};
  h.gemm_ws = a.take<std::byte>(kGemmWorkspaceBytes, "cuBLASLt workspace");
  h.hn = a.take<Bf16>(N * s.C, "hn");
  h.rstd = a.take<float>(N, "rstd");
  h.dhn = a.take<float>(N * s.C, "dhn");
  h.loss_rows = a.take<double>(N, "loss rows");
  h.logits = a.take<float>(chunk * s.V, "logits");
  h.dlogits = a.take<Bf16>(chunk * s.V, "dlogits");
  h.reduce = a.take<std::byte>(rmsnorm_backward_workspace_bytes(N, s.C), "norm gradient partials");
  return h;
}

// ---- sizes (bytes), from the sequences above ----
int64_t decoder_saved_bytes(const DecoderSpec& spec, int64_t B, int64_t T);
int64_t decoder_forward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T);  // also recompute
int64_t decoder_backward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T);
// The same under the names every family's GPU layer provides (visited per layer by the memory account).
inline int64_t layer_saved_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_saved_bytes(s, B, T);
}
inline int64_t layer_forward_workspace_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_forward_workspace_bytes(s, B, T);
}
inline int64_t layer_backward_workspace_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_backward_workspace_bytes(s, B, T);
}
int64_t head_workspace_bytes(const HeadSpec& spec, int64_t B, int64_t T);

}  // namespace slidedp::kernels::cuda
