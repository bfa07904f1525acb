// What the math of one unit needs, read once from the model card and the unit's flat-buffer
// layout: dimensions, eps, architecture switches, and the element offset of every tensor inside
// the unit's ONE flat parameter buffer (card/unit_layout.h). The flat gradient buffer has the
// same layout, so the same offsets address both. All decoder layers share one spec (same shapes,
// same relative offsets). Tunables of the CPU math (tile sizes) live here too, with defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"

namespace slidedp::kernels {

inline constexpr int64_t kAbsent = -1;  // offset of a tensor the architecture does not have

struct DecoderSpec {
  int64_t C = 0;   // hidden size
  int64_t H = 0;   // query heads
  int64_t KV = 0;  // key/value heads (GQA: H % KV == 0, query head h reads kv head h / (H / KV))
  int64_t hd = 0;  // head dim
  int64_t I = 0;   // SwiGLU intermediate size
  double eps = 1e-6;
  bool attention_bias = false;   // Qwen2: q, k, v biases
  bool qk_norm = false;          // Qwen3: RMSNorm over head_dim per head on q and k, before RoPE
  std::vector<double> inv_freq;  // (hd/2) RoPE inverse frequencies after rope_scaling
  int64_t flat_numel = 0;        // the unit's flat buffer, padding included

  // Element offsets in the unit's flat buffer (kAbsent when the tensor does not exist).
  int64_t input_norm = 0, q_w = 0, q_b = kAbsent, k_w = 0, k_b = kAbsent, v_w = 0, v_b = kAbsent, o_w = 0,
          q_norm = kAbsent, k_norm = kAbsent, post_norm = 0, gate_w = 0, up_w = 0, down_w = 0;

  // Flash attention: rows of a query tile and of a key/value tile. The working set of attention is
  // O(attn_tile^2 + attn_tile * hd), independent of T. make_decoder_spec picks the largest power of
  // two <= 64 whose tile GEMMs stay single-threaded in OpenBLAS (tile^2 * hd <= 4 * 65536), so the
  // attention workers run in parallel: 64 for hd <= 64, 32 for hd = 128 (measured on 2 cores at
  // T = 2048, hd 128: tile 32 gives 105 GFLOP/s, tile 64 gives 64).
  int64_t attn_tile = 64;
  // Worker threads of the non-BLAS loops (attention tiles, SwiGLU); the calling thread is one. One
  // rank owning C cores: C; N ranks: cores / N, like the BLAS threads. Results do not depend on it.
  // See attention.h for the tile size that keeps the workers' small GEMMs single-threaded in OpenBLAS.
  int64_t threads = 1;
  // MLP token tile: 0 runs the MLP over all B*T token rows at once and saves gate, up and the
  // post-attention norm output for backward (N x (2I + C) values). > 0 runs post-attention RMSNorm ->
  // gate/up -> SwiGLU -> down_proj over this many rows at a time and saves none of them: backward
  // recomputes each tile's norm, gate and up (the MLP is row-independent) and accumulates the weight
  // gradients tile by tile, so the MLP's memory is O(tile x I) instead of O(B*T x I). Costs the gate
  // and up GEMMs once more in backward of a kept layer (a recomputed layer skips them in recompute).
  int64_t mlp_token_tile = 0;

  int64_t q_dim() const { return H * hd; }
  int64_t kv_dim() const { return KV * hd; }
};

struct EmbeddingSpec {
  int64_t V = 0, C = 0;
  int64_t weight = 0;  // model.embed_tokens.weight (V, C)
  int64_t flat_numel = 0;
  // The rows are multiplied by this (Gemma 4: sqrt(C) rounded to bf16, as its scaled embedding's
  // buffer is cast to the weights' dtype: 73.5 for C = 5376, 53.0 for 2816; 1 for the Llama family).
  double scale = 1.0;
};

struct HeadSpec {
  int64_t V = 0, C = 0;
  double eps = 1e-6;
  int64_t norm_w = 0;           // model.norm.weight (C)
  int64_t lm_head_w = kAbsent;  // lm_head.weight (V, C) in the head's own buffer; kAbsent when tied
  bool tied = false;            // lm_head is unit 0's model.embed_tokens.weight
  int64_t flat_numel = 0;
  // Fused cross-entropy: (tokens x V) logits exist only for this many unmasked tokens at a time.
  int64_t loss_chunk_tokens = 256;  // 256 x 151936 fp32 logits = 156 MB
  double logit_softcap = 0;         // Gemma 4's final_logit_softcapping (0: none)
  bool norm_zero_centred = false;   // Qwen3.5 / 3.6: the final norm scales by (1 + w)
};

// The element offset of the unit's tensor `short_name` (relative to the unit's prefix), checking its
// shape: a layout change can never silently shift what the math reads.
int64_t tensor_offset(const UnitLayout& unit, const std::string& short_name, const std::vector<int64_t>& shape);

// `unit` must be a decoder unit of make_model_layout(card); any layer gives the same spec.
DecoderSpec make_decoder_spec(const ModelCard& card, const UnitLayout& unit);
EmbeddingSpec make_embedding_spec(const ModelCard& card, const UnitLayout& unit);
HeadSpec make_head_spec(const ModelCard& card, const UnitLayout& unit);

}  // namespace slidedp::kernels
