// The units the executor streams, on the GPU: decoder layer forward / recompute / backward, the head
// (final norm + fused chunked cross-entropy, forward and backward in one call) and the embedding.
// Same contracts as kernels/cpu/transformer/{llama_layer,head_unit,embedding_unit}.h, with these
// dtypes: parameters bf16 (the delivered mirror, used as is), activations and their gradients bf16,
// parameter gradients fp32 and ACCUMULATED (+=), saved statistics fp32. Inside an operation the
// residual-stream gradient and every gradient that is a sum of GEMMs stay fp32 and are rounded
// once, where a GEMM needs bf16 input or where the unit's bf16 output is written.
// Every operation is enqueued on ctx.stream and never allocates: scratch comes from the caller's
// workspace (sized by the *_bytes functions, which run the same carve code as the operations,
// including the cuBLASLt workspace) and the saved state from the caller's `saved` buffer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/transformer/unit_spec.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/unit_context.h"
#include "kernels/cuda/unit_scratch.h"

namespace slidedp::kernels {
struct RouterStats;  // kernels/cpu/transformer/router_aux_loss.h: this family's dense layers take none
}  // namespace slidedp::kernels

namespace slidedp::kernels::cuda {

// ---- sizes (bytes): decoder and head in unit_scratch.h; the embedding's sort scratch needs CUB ----
int64_t embedding_backward_workspace_bytes(const EmbeddingSpec& spec, int64_t B, int64_t T);

// ---- decoder layer ----
// x, y (B, T, C) bf16; params: the unit's flat bf16 buffer; saved: decoder_saved_bytes().
void decoder_forward(const UnitContext& ctx, const DecoderSpec& spec, const bf16* params, const bf16* x, bf16* y,
                     DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws);
// Refills `saved` from x: the same kernels and GEMMs as decoder_forward, so bitwise what it saved.
void decoder_recompute(const UnitContext& ctx, const DecoderSpec& spec, const bf16* params, const bf16* x,
                       DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws);
// dx (B, T, C) bf16 overwritten; grads (flat fp32, spec.flat_numel) += dL/dparams.
void decoder_backward(const UnitContext& ctx, const DecoderSpec& spec, const bf16* params, const bf16* x,
                      DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B, int64_t T,
                      DeviceWorkspace ws);

// The family's GPU operations under the names every family provides (the CUDA backend visits the
// layer's kernels::LayerSpec once per operation).
inline void layer_forward(const UnitContext& ctx, const DecoderSpec& s, const bf16* params, const bf16* x,
                          bf16* y, DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws,
                          const RouterStats* /*dense: none*/) {
  decoder_forward(ctx, s, params, x, y, saved, B, T, ws);
}
inline void layer_recompute(const UnitContext& ctx, const DecoderSpec& s, const bf16* params, const bf16* x,
                            DeviceWorkspace saved, int64_t B, int64_t T, DeviceWorkspace ws) {
  decoder_recompute(ctx, s, params, x, saved, B, T, ws);
}
inline void layer_backward(const UnitContext& ctx, const DecoderSpec& s, const bf16* params, const bf16* x,
                           DeviceWorkspace saved, const bf16* dy, bf16* dx, float* grads, int64_t B,
                           int64_t T, DeviceWorkspace ws, const RouterStats* /*dense: none*/) {
  decoder_backward(ctx, s, params, x, saved, dy, dx, grads, B, T, ws);
}

// ---- head ----
// x (B, T, C), targets (B, T) int32. dx (B, T, C) overwritten; grads (the head's flat fp32 buffer)
// and lm_head_grad (V, C) fp32 accumulated; loss: 2 doubles of device memory = (loss sum, count).
void head_forward_backward(const UnitContext& ctx, const HeadSpec& spec, const bf16* params, const bf16* lm_head_w,
                           const bf16* x, const int32_t* targets, int64_t B, int64_t T, double grad_scale, bf16* dx,
                           float* grads, float* lm_head_grad, double* loss, DeviceWorkspace ws);

// ---- embedding ----
// y (B, T, C) = embed_tokens[tokens (B, T)].
void embedding_forward(const UnitContext& ctx, const EmbeddingSpec& spec, const bf16* params, const int32_t* tokens,
                       int64_t B, int64_t T, bf16* y);
// grads (flat fp32) += scatter of dy (B, T, C) to the rows of tokens (deterministic).
void embedding_backward(const UnitContext& ctx, const EmbeddingSpec& spec, const int32_t* tokens, const bf16* dy,
                        float* grads, int64_t B, int64_t T, DeviceWorkspace ws);

}  // namespace slidedp::kernels::cuda
