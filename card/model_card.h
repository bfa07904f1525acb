// The model card: the architecture numbers of a Hugging Face decoder-only config.json (Llama, Qwen2,
// Qwen2.5, Qwen3, Mistral; the text models of Gemma 4 and Qwen3.5/3.6), from a named preset, a
// config.json, or a model directory. Everything downstream (unit layout, FLOPs, memory, the executor's
// math) reads only this struct, and reads a decoder layer's shape through layer(l): Gemma 4's and
// Qwen3.6's layers are not all alike.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "card/family.h"

namespace slidedp {

struct RopeScaling {
  std::string type = "none";  // "none" | "llama3" | "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// kLinear: Qwen3.5/3.6's Gated DeltaNet token mixer (linear attention: a state, no T x T scores).
enum class AttentionKind { kFull, kSliding, kLinear };
// "full_attention" | "sliding_attention" | "linear_attention"
const char* attention_kind_name(AttentionKind kind);
// The kind a layer_types entry names, if it is one of `allowed` (a family's two kinds, or all three);
// otherwise InputError at `where`, naming the entry and the accepted names.
AttentionKind attention_kind_from_name(const std::string& name, std::initializer_list<AttentionKind> allowed,
                                       const std::string& where);

// The shape of one decoder layer, derived from the card (ModelCard::layer).
struct LayerShape {
  AttentionKind attention = AttentionKind::kFull;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t window = 0;   // sliding window: a query sees itself and the window - 1 keys before it; 0 = all
  bool k_eq_v = false;  // values are v_norm(k_proj(x)) (Gemma 4 global layers): no v_proj
  double rope_theta = 0;
  int64_t rope_angles = 0;        // frequency slots that rotate, of head_dim / 2 (the rest have frequency 0)
  int64_t intermediate_size = 0;  // the dense MLP
  int64_t num_experts = 0;        // MoE block beside the dense MLP (0: none)
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // Qwen3.6 MoE: one sigmoid-gated shared SwiGLU expert
  bool output_gate = false;  // Qwen3.6 full attention: q_proj also yields a per-channel gate (2 q_dim rows)
  int64_t rotary_dim = 0;    // Qwen3.6: the leading channels that rotate (partial RoPE); 0: see rope_angles
  // Gated DeltaNet (attention kLinear): key heads, value heads (a multiple), their head dims, the
  // depthwise conv's kernel.
  int64_t linear_k_heads = 0, linear_v_heads = 0, linear_k_dim = 0, linear_v_dim = 0, conv_kernel = 0;
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool moe() const { return num_experts > 0; }
  bool linear() const { return attention == AttentionKind::kLinear; }
  int64_t linear_key_dim() const { return linear_k_heads * linear_k_dim; }
  int64_t linear_value_dim() const { return linear_v_heads * linear_v_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }  // q | k | v
};

struct ModelCard {
  std::string name;          // preset name ("qwen3-14b") or the folder/file it came from
  std::string hf_repo;       // "Qwen/Qwen3-14B" where known
  std::string model_type;    // "llama" | "qwen2" | "qwen3" | "mistral" | "gemma4" | "qwen3_5" | "qwen3_5_moe"
  int64_t hidden_size = 0;   // C
  int64_t num_layers = 0;    // L
  int64_t num_heads = 0;     // H (query heads)
  int64_t num_kv_heads = 0;  // KV heads (GQA)
  int64_t head_dim = 0;      // hd (Gemma 4: of the sliding layers)
  int64_t intermediate_size = 0;  // I (SwiGLU; Gemma 4: the dense GeGLU MLP)
  int64_t vocab_size = 0;         // V
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Qwen2: q, k, v projections carry a bias (o_proj never does)
  bool qk_norm = false;         // Qwen3: RMSNorm over head_dim on q and k, per head, before RoPE
  double published_params = 0;  // the figure the publisher states (0 when unknown)
  std::string source;           // where the numbers came from
  // config.json stated RoPE as transformers 5 writes it (rope_parameters, "dtype"), not as 4 did
  // (top-level rope_theta / rope_scaling, "torch_dtype"): a saved folder is written the same way.
  bool hf_rope_parameters = false;

  // Gemma 4 (model_type "gemma4", the text model of Gemma4ForConditionalGeneration). The family's fixed
  // facts (sandwich norms, x*w RMSNorm, q/k norm and the weightless v norm, attention scale 1, GeGLU
  // with tanh GELU, embedding times sqrt(C) in bf16, layer_scalar, tied head) follow from model_type.
  std::vector<AttentionKind> layer_types;  // one per layer; empty: every layer full attention
  int64_t sliding_window = 0;
  int64_t global_head_dim = 0;      // head_dim of the full-attention layers
  int64_t num_global_kv_heads = 0;  // their KV heads (with attention_k_eq_v; else num_kv_heads)
  bool attention_k_eq_v = false;    // full-attention layers take values from k_proj
  double global_rope_theta = 0;     // full-attention layers' "proportional" RoPE
  double global_partial_rotary_factor = 1.0;
  int64_t num_experts = 0;  // MoE block in every layer (0: dense)
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  double final_logit_softcapping = 0;  // logits = cap * tanh(z / cap); 0: none

  // Qwen3.5 / Qwen3.6 ("qwen3_5" dense, "qwen3_5_moe"; the text model of the released
  // ForConditionalGeneration checkpoints). layer_types holds linear_attention (Gated DeltaNet) and
  // full_attention (gated attention, partial RoPE) layers. Fixed facts of the family: zero-centred
  // RMSNorm x*(1+w) (a plain w norm inside the DeltaNet), q/k norm, the attention output gate, conv
  // SiLU, untied head. The MoE variant has no dense MLP: intermediate_size is 0 there.
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0, linear_key_head_dim = 0,
          linear_value_head_dim = 0, linear_conv_kernel_dim = 0;
  double partial_rotary_factor = 1.0;  // of head_dim, the leading channels that rotate
  int64_t shared_expert_intermediate_size = 0;

  // The family model_type names (family.h); InputError naming model_type when none reads it.
  ModelFamily family() const;
  template <typename Family>
  bool is_family() const {
    return std::holds_alternative<Family>(family());
  }
  // Families whose layers differ by type (read through layer(l), per-layer costs and memory).
  bool hybrid_layers() const;
  // Whether the family's decoder units can run their MLP over token tiles (mlp_token_tile > 0).
  bool mlp_token_tiles() const;
  bool moe() const { return num_experts > 0; }
  LayerShape layer(int64_t l) const;
  // Whether every decoder layer has the same shape (and the same unit size).
  bool uniform_layers() const;
  // Where the text model's tensors live in the checkpoint: "model." or "model.language_model.".
  std::string tensor_prefix() const;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Parameter count from the config numbers (weights, biases, norm vectors), as in
  // shared/reference/model-configs.md section 2.
  int64_t embedding_params() const { return vocab_size * hidden_size; }
  int64_t decoder_layer_params(int64_t layer = 0) const;
  int64_t head_params() const;  // final norm + untied lm_head
  int64_t total_params() const;
  // Parameters one token computes with: all of them for a dense model; a MoE layer's router, dense
  // MLP and experts_per_token of its experts (the reference's "active" count, embedding included).
  int64_t active_params() const;
  // "14.77 B params", or "25.23 B params, 3.82 B active" for a mixture of experts.
  std::string params_summary() const;

  // Throws InputError (naming `origin`) when numbers are inconsistent (heads % kv_heads, ...).
  void validate(const std::string& origin) const;
};

// A card check: InputError at "<origin>: <key>" saying `what` unless `ok`.
struct CardCheck {
  std::string origin;
  void operator()(bool ok, const std::string& key, const std::string& what) const;
};

// Named presets (card/presets/models/*.yaml, compiled in).
std::vector<std::string> model_preset_names();
bool is_model_preset(const std::string& name);
ModelCard model_preset(const std::string& name);

// Resolves NAME (a preset), a model card YAML file, a Hugging Face config.json, or a directory that
// holds config.json. Throws InputError / IoError naming what was tried.
ModelCard load_model_card(const std::string& name_or_path);

// Parses a Hugging Face config.json's text; `origin` names it in errors.
ModelCard model_card_from_hf_config(const std::string& json_text, const std::string& origin);
// Writes a Hugging Face config.json for the card (what save_pretrained would need to reload it).
// `dtype`: the weights' dtype the file states ("bfloat16", "float32"), under "dtype" for a card read
// from a transformers-5 config (hf_rope_parameters), else under "torch_dtype".
std::string model_card_to_hf_config(const ModelCard& card, const std::string& dtype = "bfloat16");

// Our own YAML card format (HF key names, strict): parse and emit.
ModelCard model_card_from_yaml(const std::string& yaml_text, const std::string& origin);
std::string model_card_to_yaml(const ModelCard& card);

// The architecture fields in which two cards differ (everything model_card_to_yaml writes but the
// name, hf_repo, source and published_params), as "key: <a's value> vs <b's value>", in the order
// the YAML lists them. Empty: the same model. What resume checks against the checkpoint's config.
std::vector<std::string> architecture_differences(const ModelCard& a, const ModelCard& b);

}  // namespace slidedp
