// The model card: the architecture numbers of a Hugging Face decoder-only config.json (Llama, Qwen2,
// Qwen2.5, Qwen3, Mistral), from a named preset, a config.json, or a model directory. Everything
// downstream (unit layout, FLOPs, memory, the executor's math) reads only this struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slidedp {

struct RopeScaling {
  std::string type = "none";  // "none" | "llama3" | "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelCard {
  std::string name;        // preset name ("qwen3-14b") or the folder/file it came from
  std::string hf_repo;     // "Qwen/Qwen3-14B" where known
  std::string model_type;  // "llama" | "qwen2" | "qwen3" | "mistral"
  int64_t hidden_size = 0;        // C
  int64_t num_layers = 0;         // L
  int64_t num_heads = 0;          // H (query heads)
  int64_t num_kv_heads = 0;       // KV heads (GQA)
  int64_t head_dim = 0;           // hd
  int64_t intermediate_size = 0;  // I (SwiGLU)
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

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Parameter count from the config numbers (weights, biases, norm vectors), as in
  // shared/reference/model-configs.md section 2.
  int64_t embedding_params() const { return vocab_size * hidden_size; }
  int64_t decoder_layer_params() const;
  int64_t head_params() const;  // final norm + untied lm_head
  int64_t total_params() const;

  // Throws InputError (naming `origin`) when numbers are inconsistent (heads % kv_heads, ...).
  void validate(const std::string& origin) const;
};

// Named presets (model/presets/models/*.yaml, compiled in).
std::vector<std::string> model_preset_names();
bool is_model_preset(const std::string& name);
ModelCard model_preset(const std::string& name);

// Resolves NAME (a preset), a model card YAML file, a Hugging Face config.json, or a directory that
// holds config.json. Throws InputError / IoError naming what was tried.
ModelCard load_model_card(const std::string& name_or_path);

// Parses a Hugging Face config.json's text; `origin` names it in errors.
ModelCard model_card_from_hf_config(const std::string& json_text, const std::string& origin);
// Writes a Hugging Face config.json for the card (what save_pretrained would need to reload it).
std::string model_card_to_hf_config(const ModelCard& card);

// Our own YAML card format (HF key names, strict): parse and emit.
ModelCard model_card_from_yaml(const std::string& yaml_text, const std::string& origin);
std::string model_card_to_yaml(const ModelCard& card);

}  // namespace slidedp
