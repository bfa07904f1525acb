// Causal grouped-query attention, tiled flash-style (FlashAttention-2 on the CPU).
// Forward walks query tiles x key tiles with an online softmax and saves only the output and the
// log-sum-exp of every (b, h, t) row. Backward recomputes each score tile from q, k and that
// log-sum-exp. Scores exist one (tile x tile) block at a time, so the working set is
// O(tile^2 + tile * hd + B*H*T) and never grows as T^2. Every tile product is a BLAS GEMM on
// strided views of the (B, T, heads, hd) buffers: no transposes, no copies of q, k, v.
// Query head h reads key/value head h / (H / KV) (transformers' repeat_kv order).
// Threads: forward splits the (b, h) pairs, backward the (b, kv head) pairs over `threads` workers
// (each with its own tile scratch); results are bitwise independent of the count. The tile GEMMs
// have M*N*K <= tile^2 * hd; when that exceeds kBlasSingleThreadMaxMnk and BLAS threads > 1,
// OpenBLAS threads each of them and concurrent threaded calls serialize (blas.h), so the call falls
// back to one worker. Tile 64 keeps workers for hd <= 64, tile 32 for hd = 128.
#pragma once

#include <cstdint>

#include "kernels/cpu/transformer/arena.h"

namespace slidedp::kernels {

struct AttentionShape {
  int64_t B = 0, T = 0;
  int64_t H = 0;   // query heads
  int64_t KV = 0;  // key/value heads, H % KV == 0
  int64_t hd = 0;  // head dim
  int64_t tile = 64;
  int64_t threads = 1;  // worker threads of this call (the caller is one of them)
  double scale = 0;     // scores are q.k x scale; 0 means 1/sqrt(hd) (Gemma 4 uses 1)
  // Sliding window (Gemma 4's sliding layers): the query at t sees keys t - window < j <= t. Key
  // tiles entirely outside every row's window are skipped, so the cost is linear in the window, not
  // in T. 0: every key j <= t.
  int64_t window = 0;
  // Packed documents: positions (B, T) holds each token's position inside its document (0 where a
  // document starts, else the previous token's + 1; transformers' position_ids of packed sequences).
  // A query sees only the keys of its own document; key tiles before a query tile's documents are
  // skipped like those outside the window. null: one document per sequence.
  const int32_t* positions = nullptr;
};

// Throws unless positions (B, T) is a valid document layout: 0 at every sequence's first token, and
// each later token either 0 (a new document) or the previous token's position + 1.
void check_document_positions(const int32_t* positions, int64_t B, int64_t T);

// The largest power-of-two tile <= 64 (and >= 8) whose tile GEMMs (tile^2 * hd) stay single-threaded
// in OpenBLAS, so the attention workers run in parallel (64 for hd <= 64, 32 for hd = 128).
int64_t attention_tile_for(int64_t head_dim);

// Workspace bytes for one call (measured by running the same carve code as the kernels).
template <typename Real>
int64_t attention_forward_workspace_bytes(const AttentionShape& s);
template <typename Real>
int64_t attention_backward_workspace_bytes(const AttentionShape& s);

// out (B, T, H, hd) = softmax(scale q k^T + causal (windowed, per-document) mask) v, lse (B, H, T) = log-sum-exp of
// the scaled scores of each row. q (B, T, H, hd), k and v (B, T, KV, hd).
template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const AttentionShape& s, Workspace ws);

// dq (B, T, H, hd), dk and dv (B, T, KV, hd) (all overwritten) from dout (B, T, H, hd) and the
// forward's q, k, v, out and lse.
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const AttentionShape& s,
                        Workspace ws);

}  // namespace slidedp::kernels
