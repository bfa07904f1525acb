// What one unit costs per step, derived from the model card: FLOPs of forward, backward and
// recompute, and activation bytes by policy. Shared by the analytical model, the simulator, the
// memory model and the planner, so they can never disagree on the work itself.
//
// FLOP conventions (multiply-add = 2 FLOPs). Causal attention over a sequence of T tokens does
// T(T+1)/2 query-key pairs, each costing 2*hd FLOPs for QK^T and 2*hd for PV per head. Backward is
// 2x the forward for GEMMs (grad input + grad weight) and 2.5x for flash-style attention (it
// recomputes the scores: 5 matmuls against 2). Recompute repeats the forward.
#pragma once

#include <cstdint>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp {

enum class ActivationPolicy { kKeep, kRecompute, kOffload };
const char* activation_policy_name(ActivationPolicy p);

struct UnitFlops {
  double forward_matmul = 0;    // GEMM FLOPs of the forward pass
  double forward_attention = 0; // QK^T + PV FLOPs of the forward pass (a Gated DeltaNet: conv and scan)
  double backward_matmul = 0;
  double backward_attention = 0;
  // Decoder: FLOPs of the gate and up projections (part of forward_matmul, 2/3 of the MLP's and
  // ~50-60% of a layer's GEMMs). With an MLP token tile nothing of the MLP is saved, so backward runs
  // them again per tile; a layer that recomputes anyway skips them in its recompute instead.
  double mlp_gate_up_matmul = 0;
  double forward() const { return forward_matmul + forward_attention; }
  double backward() const { return backward_matmul + backward_attention; }
};

// FLOPs of one unit for `sequences` sequences of `seq_len` tokens; `layer` is the decoder layer (its
// shape: window, head dims, experts), ignored for the embedding and the head. The head's forward
// includes the fused loss, which also computes the input and weight gradients (counted in
// backward_*; the executor runs them during the forward pass). A sliding-window layer does
// min(t + 1, window) query-key pairs for the query at t; a MoE layer computes its router over all
// experts and experts_per_token experts per token.
UnitFlops unit_flops(const ModelCard& card, UnitKind kind, int layer, int64_t sequences, int64_t seq_len);

// Query-key pairs of one causal sequence of T tokens under a window of W keys (0: no window).
double causal_pairs(int64_t T, int64_t window);

// Model FLOPs per step as SlideFormer reports them (Megatron's formula with GQA and SwiGLU, no
// recompute term; shared/reference/baselines.md): used for TFLOP/s figures so they compare.
double model_flops_per_step(const ModelCard& card, int64_t sequences, int64_t seq_len);

// Activation bytes per token of one decoder layer (bf16 = 2 bytes per element), the count the step
// model's elementwise HBM traffic uses. With an MLP token tile (`mlp_token_tile` > 0) the per-token
// terms leave out the MLP's (its intermediates exist for one tile at a time: decoder_mlp_tile_bytes).
// SlideDP's memory is not sized from these but from its units' carve code (memory_account.h).
struct LayerActivationBytes {
  double saved_keep = 0;   // everything backward reads, when the policy is keep
  double unit_input = 0;   // the layer input alone (what recompute keeps, what offload moves)
  double transient = 0;    // peak extra bytes while the layer's forward or backward runs
};
LayerActivationBytes decoder_activation_bytes_per_token(const ModelCard& card, int layer, int64_t mlp_token_tile = 0);

// Activation bytes per token of a Hugging Face decoder layer as the baselines run it: PyTorch
// autograd, bf16, Liger's fused RMSNorm, RoPE and SwiGLU, a flash attention kernel (SlideFormer pins
// liger-kernel; the FSDP2 and ZeRO recipes use the same layers).
//   saved_keep: what autograd saves -- the layer input (norm 1's input), norm 1's output, q and k after
//     RoPE (and before the q/k norms for Qwen3), v, the attention output, the residual after attention
//     (norm 2's input), norm 2's output, gate and up (Liger's SwiGLU recomputes silu), their product
//     (down_proj's input); fp32 the attention log-sum-exp per head and 1/rms per norm row;
//   unit_input: the layer input (bf16);
//   transient: the peak of backward beyond that -- the product's gradient (Liger's SwiGLU backward
//     writes the gate/up gradients over the saved gate and up) and the gradients entering and leaving.
LayerActivationBytes torch_decoder_activation_bytes_per_token(const ModelCard& card, int layer);

// Bytes of one MLP tile's scratch for a micro-batch of `tokens` tokens: min(tile, tokens) rows of
// the recomputed norm output, gate, up and SwiGLU product (bf16) and the gate/up gradients (fp32).
// 0 when untiled (the whole-sequence terms are in decoder_activation_bytes_per_token).
double decoder_mlp_tile_bytes(const ModelCard& card, int64_t mlp_token_tile, double tokens);

// Peak transient bytes per token of the head: the loss works on `loss_chunk_tokens` tokens at a
// time, so logits never exceed loss_chunk_tokens x V in fp32.
double head_loss_chunk_bytes(const ModelCard& card, int64_t loss_chunk_tokens);

}  // namespace slidedp
