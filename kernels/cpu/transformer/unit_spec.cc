// Unit specs from the card and the layout: offsets are looked up by Hugging Face tensor name, so a
// layout change (order, alignment) can never silently shift what the math reads.
#include "kernels/cpu/transformer/unit_spec.h"

#include <cmath>

#include "common/bf16.h"
#include "common/error.h"
#include "kernels/cpu/transformer/attention.h"
#include "kernels/cpu/transformer/rope.h"

namespace slidedp::kernels {
namespace {

int64_t optional_offset(const UnitLayout& unit, const std::string& short_name, bool present,
                        const std::vector<int64_t>& shape) {
  return present ? tensor_offset(unit, short_name, shape) : kAbsent;
}

}  // namespace

int64_t tensor_offset(const UnitLayout& unit, const std::string& short_name, const std::vector<int64_t>& shape) {
  const TensorSpec& t = unit.at(short_name);
  SLIDEDP_CHECK(t.shape == shape, "tensor " + t.name + " has an unexpected shape");
  return t.offset;
}

DecoderSpec make_decoder_spec(const ModelCard& card, const UnitLayout& unit) {
  SLIDEDP_CHECK(unit.kind == UnitKind::kDecoder, "make_decoder_spec needs a decoder unit");
  DecoderSpec s;
  s.C = card.hidden_size;
  s.H = card.num_heads;
  s.KV = card.num_kv_heads;
  s.hd = card.head_dim;
  s.I = card.intermediate_size;
  s.eps = card.rms_norm_eps;
  s.attention_bias = card.attention_bias;
  s.qk_norm = card.qk_norm;
  s.inv_freq = rope_inv_freq(card);
  s.attn_tile = attention_tile_for(s.hd);
  s.flat_numel = unit.flat_numel;
  const int64_t C = s.C, Q = s.q_dim(), K = s.kv_dim(), I = s.I;
  s.input_norm = tensor_offset(unit, "input_layernorm.weight", {C});
  s.q_w = tensor_offset(unit, "self_attn.q_proj.weight", {Q, C});
  s.q_b = optional_offset(unit, "self_attn.q_proj.bias", s.attention_bias, {Q});
  s.k_w = tensor_offset(unit, "self_attn.k_proj.weight", {K, C});
  s.k_b = optional_offset(unit, "self_attn.k_proj.bias", s.attention_bias, {K});
  s.v_w = tensor_offset(unit, "self_attn.v_proj.weight", {K, C});
  s.v_b = optional_offset(unit, "self_attn.v_proj.bias", s.attention_bias, {K});
  s.o_w = tensor_offset(unit, "self_attn.o_proj.weight", {C, Q});
  s.q_norm = optional_offset(unit, "self_attn.q_norm.weight", s.qk_norm, {s.hd});
  s.k_norm = optional_offset(unit, "self_attn.k_norm.weight", s.qk_norm, {s.hd});
  s.post_norm = tensor_offset(unit, "post_attention_layernorm.weight", {C});
  s.gate_w = tensor_offset(unit, "mlp.gate_proj.weight", {I, C});
  s.up_w = tensor_offset(unit, "mlp.up_proj.weight", {I, C});
  s.down_w = tensor_offset(unit, "mlp.down_proj.weight", {C, I});
  return s;
}

EmbeddingSpec make_embedding_spec(const ModelCard& card, const UnitLayout& unit) {
  SLIDEDP_CHECK(unit.kind == UnitKind::kEmbedding, "make_embedding_spec needs the embedding unit");
  EmbeddingSpec s;
  s.V = card.vocab_size;
  s.C = card.hidden_size;
  s.weight = tensor_offset(unit, card.tensor_prefix() + "embed_tokens.weight", {s.V, s.C});
  s.flat_numel = unit.flat_numel;
  if (std::visit([](auto f) { return decltype(f)::kEmbeddingTimesSqrtC; }, card.family()))
    s.scale = round_to_bf16(std::sqrt(static_cast<float>(card.hidden_size)));
  return s;
}

HeadSpec make_head_spec(const ModelCard& card, const UnitLayout& unit) {
  SLIDEDP_CHECK(unit.kind == UnitKind::kHead, "make_head_spec needs the head unit");
  HeadSpec s;
  s.V = card.vocab_size;
  s.C = card.hidden_size;
  s.eps = card.rms_norm_eps;
  s.norm_w = tensor_offset(unit, card.tensor_prefix() + "norm.weight", {s.C});
  s.logit_softcap = card.final_logit_softcapping;
  s.norm_zero_centred = std::visit([](auto f) { return decltype(f)::kZeroCentredNorm; }, card.family());
  s.tied = unit.reads_tied_embedding;
  SLIDEDP_CHECK(s.tied == card.tie_word_embeddings, "layout and card disagree on tied embeddings");
  s.lm_head_w = optional_offset(unit, "lm_head.weight", !s.tied, {s.V, s.C});
  s.flat_numel = unit.flat_numel;
  return s;
}

}  // namespace slidedp::kernels
