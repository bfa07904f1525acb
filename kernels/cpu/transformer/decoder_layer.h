// One decoder layer of Llama / Qwen2 / Qwen3 / Mistral as a unit the executor streams:
//
//   x (B,T,C) -> h1 = rmsnorm(x) -> q,k,v = h1 W^T (+ Qwen2 bias) -> [Qwen3: rmsnorm(q), rmsnorm(k)
//   per head] -> RoPE(q, k) -> att = causal GQA flash attention -> x2 = x + att Wo^T
//   -> h2 = rmsnorm(x2) -> y = x2 + (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T
//
// Contract with the executor (activation policies keep / recompute / offload):
//  * forward(params, x) writes y and the SAVED state: everything backward needs except x itself.
//  * The executor always keeps the unit input x (it is the previous unit's output; under
//    recompute/offload it is the only thing kept, on device or in pinned host memory).
//  * keep: hold `saved` from forward to backward. recompute/offload: drop it, then before
//    backward call recompute(params, x) into a saved buffer; it is bitwise what forward saved (same
//    code path, same BLAS calls; recompute only skips the down projection, which nothing saved
//    depends on).
//  * spec.mlp_token_tile > 0: the MLP runs over that many token rows at a time; `saved` then ends at
//    x2 (no post-norm output, gate or up: backward recomputes them per tile), and recompute stops
//    there too. Same results as the untiled MLP up to the summation order of the weight gradients.
//  * backward(params, x, saved, dy) overwrites dx and ACCUMULATES (+=) every parameter gradient into
//    `grads`, a flat buffer with the params' layout (padding untouched), so micro-batches add up.
//  * params is the unit's flat buffer in the compute type (widen_bf16 from the delivery mirror).
//  * Scratch comes from a caller workspace of decoder_*_workspace_bytes(); nothing allocates.
//  * Re-entrant: no global state; concurrent calls need distinct saved/workspace/grads buffers.
// Buffers must not alias one another (dx != dy, y != x, ...).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/transformer/arena.h"
#include "kernels/cpu/transformer/unit_spec.h"

namespace slidedp::kernels {

// Bytes of the saved state, and of the scratch of forward (also enough for recompute) and backward.
template <typename Real>
int64_t decoder_saved_bytes(const DecoderSpec& spec, int64_t B, int64_t T);
// The saved state's tensors (name, byte offset, bytes) in buffer order; the gaps between them are
// alignment padding that nothing reads or writes.
template <typename Real>
std::vector<ArenaPiece> decoder_saved_layout(const DecoderSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t decoder_forward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T);
template <typename Real>
int64_t decoder_backward_workspace_bytes(const DecoderSpec& spec, int64_t B, int64_t T);

// x, y (B, T, C). saved: decoder_saved_bytes() bytes, 64-byte aligned. `positions` (B, T): document
// positions of packed sequences (attention.h: attention and RoPE restart at each document), or null.
template <typename Real>
void decoder_forward(const DecoderSpec& spec, const Real* params, const Real* x, Real* y, Workspace saved,
                     int64_t B, int64_t T, Workspace ws, const int32_t* positions = nullptr);

// Refills `saved` from x, bitwise equal to what decoder_forward saved for the same params and x.
template <typename Real>
void decoder_recompute(const DecoderSpec& spec, const Real* params, const Real* x, Workspace saved, int64_t B,
                       int64_t T, Workspace ws, const int32_t* positions = nullptr);

// dx (B, T, C) = dL/dx (overwritten); grads (flat, spec.flat_numel) += dL/dparams.
template <typename Real>
void decoder_backward(const DecoderSpec& spec, const Real* params, const Real* x, Workspace saved,
                      const Real* dy, Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                      const int32_t* positions = nullptr);

}  // namespace slidedp::kernels
