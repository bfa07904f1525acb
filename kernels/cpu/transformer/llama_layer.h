// The Llama family's decoder layer (Llama, Qwen2 / 2.5, Qwen3, Mistral: card/llama_family.h) as a
// unit the executor streams:
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

struct RouterStats;  // router_aux_loss.h: the dense layers of this family take none

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

// The family's operations under the names every family provides: layer_spec.h's LayerSpec holds one
// alternative per family and layer_dispatch.cc visits it once per operation.
inline int64_t layer_flat_numel(const DecoderSpec& s) { return s.flat_numel; }
inline int64_t layer_moe_experts(const DecoderSpec&) { return 0; }
inline void layer_set_threads(DecoderSpec& s, int64_t threads) { s.threads = threads; }
// False when the family cannot tile its MLP (rows > 0); the caller names the plan key.
inline bool layer_set_mlp_token_tile(DecoderSpec& s, int64_t rows) {
  s.mlp_token_tile = rows;
  return true;
}
template <typename Real>
int64_t layer_saved_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_saved_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_forward_workspace_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_forward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
int64_t layer_backward_workspace_bytes(const DecoderSpec& s, int64_t B, int64_t T) {
  return decoder_backward_workspace_bytes<Real>(s, B, T);
}
template <typename Real>
void layer_forward(const DecoderSpec& s, const Real* params, const Real* x, Real* y, Workspace saved,
                   int64_t B, int64_t T, Workspace ws, const RouterStats* /*router: dense*/,
                   const int32_t* positions) {
  decoder_forward(s, params, x, y, saved, B, T, ws, positions);
}
template <typename Real>
void layer_recompute(const DecoderSpec& s, const Real* params, const Real* x, Workspace saved, int64_t B,
                     int64_t T, Workspace ws, const int32_t* positions) {
  decoder_recompute(s, params, x, saved, B, T, ws, positions);
}
inline DecoderSpec make_layer_spec(const LlamaFamily& /*family*/, const ModelCard& card,
                                   const UnitLayout& unit) {
  return make_decoder_spec(card, unit);
}
template <typename Real>
void layer_backward(const DecoderSpec& s, const Real* params, const Real* x, Workspace saved, const Real* dy,
                    Real* dx, Real* grads, int64_t B, int64_t T, Workspace ws,
                    const RouterStats* /*router: dense*/, const int32_t* positions) {
  decoder_backward(s, params, x, saved, dy, dx, grads, B, T, ws, positions);
}

}  // namespace slidedp::kernels
