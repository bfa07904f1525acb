// Causal grouped-query attention on the GPU, flash-style: forward saves only the output and the
// row log-sum-exp; backward recomputes score tiles from q, k and lse. Memory is O(B*H*T), never
// O(T^2). Same contract as kernels/cpu/transformer/attention.h (query head h reads key/value head
// h / (H / KV), scores scaled by AttentionShape::scale, lse in natural log, an optional sliding
// window and packed documents).
//
// Two implementations behind one entry point:
//  * tensor-core (head_dim 64 or 128): 64-query x 64-key tiles, bf16 WMMA products with fp32
//    accumulation, online softmax in fp32 (FlashAttention-2's schedule). Backward runs two kernels,
//    dK/dV per key tile (looping over the query tiles and the group's heads) and dQ per query tile,
//    so every output has exactly one writer: deterministic, no atomics, at the price of recomputing
//    the score tile once more than FlashAttention-2.
//  * reference (any even head_dim <= 512): one warp per row, plain fp32 loops in the same order of
//    operations. Slow (O(T^2) warp reductions, O(T window) with a window); the test oracle of the
//    tensor-core path and the path of every other head size (Gemma 4's 256 and 512 among them).
// SLIDEDP_CUDA_ATTENTION=reference|tensor_core|auto (default auto) overrides the choice, so tests
// can run both on one GPU. A device whose per-block shared memory cannot hold the tensor-core tiles
// (Ada's 99 KB for head_dim 128) runs the reference path instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scratch_sizes.h"  // attention_backward_workspace_bytes(B, H, T)

namespace slidedp::kernels::cuda {

struct AttentionShape {
  int64_t B = 0, T = 0;
  int64_t H = 0;   // query heads
  int64_t KV = 0;  // key/value heads, H % KV == 0
  int64_t hd = 0;  // head dim
  // Packed documents: (B, T) int32 positions inside each token's document (0 where one starts); a
  // query sees only its own document's keys. Null: one document per sequence.
  const int32_t* positions = nullptr;
  double scale = 0;    // scores = q.k * scale; 0: 1/sqrt(hd) (Gemma 4: 1, its q and k are RMS-normed)
  int64_t window = 0;  // > 0: a query sees only the `window` latest keys, itself included (sliding layers)
};
// The scale the kernels apply.
float attention_scale(const AttentionShape& s);

enum class AttentionImpl { kAuto, kReference, kTensorCore };
// kAuto resolved: `override` (SLIDEDP_CUDA_ATTENTION's value: reference, tensor_core or auto; null when
// unset), else tensor-core when the head dim allows it. An explicit request wins over the override.
AttentionImpl resolve_attention_impl(AttentionImpl requested, int64_t hd, const char* override);
// The same with the environment's value, read once per process: launches never call getenv (which
// would race a setenv elsewhere).
AttentionImpl resolve_attention_impl(AttentionImpl requested, int64_t hd);
bool attention_tensor_core_supports(int64_t hd);

// out (B, T, H, hd) bf16, lse (B, H, T) fp32; q (B, T, H, hd), k and v (B, T, KV, hd) bf16.
void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                       const __nv_bfloat16* v, const AttentionShape& s, AttentionImpl impl, cudaStream_t stream);

// Scratch: D (B, H, T) fp32 = rowsum(dout * out).
int64_t attention_backward_workspace_bytes(const AttentionShape& s);
// dq (B, T, H, hd), dk and dv (B, T, KV, hd), all overwritten.
void attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* dout,
                        const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        const __nv_bfloat16* out, const float* lse, const AttentionShape& s, AttentionImpl impl,
                        void* workspace, cudaStream_t stream);

}  // namespace slidedp::kernels::cuda
