// Hugging Face config.json <-> ModelCard for the llama, qwen2, qwen3, mistral and gemma4 model types.
// Architecture facts that config.json does not state are filled in as transformers does:
// Qwen2 always has q/k/v biases; Qwen3 always has q/k norms. A missing head_dim is 128 for Qwen3
// (Qwen3Config's default) and hidden/heads for the others (Llama, Mistral; Qwen2 has no such key).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "card/gemma4_family.h"
#include "card/model_card.h"
#include "card/qwen3_5_family.h"
#include "common/error.h"
#include "common/strict_json.h"

namespace slidedp {
namespace {

using nlohmann::json;

int64_t get_int(const json& j, const std::string& key, const std::string& origin, bool required,
                int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) throw InputError(origin + ": " + key, "missing required key");
    return fallback;
  }
  if (!j[key].is_number_integer()) throw InputError(origin + ": " + key, "expected an integer");
  return j[key].get<int64_t>();
}

double get_number(const json& j, const std::string& key, const std::string& origin, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) throw InputError(origin + ": " + key, "expected a number");
  return j[key].get<double>();
}

bool get_bool(const json& j, const std::string& key, const std::string& origin, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw InputError(origin + ": " + key, "expected true or false");
  return j[key].get<bool>();
}

std::string get_text(const json& j, const std::string& key, const std::string& origin,
                     const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string())
    throw InputError(origin + ": " + key, fmt::format("expected a string, got {}", j[key].dump()));
  return j[key].get<std::string>();
}

// transformers 5.15 and later write Gemma 4's full-attention shapes as per_layer_config {"05": {head_dim,
// num_key_value_heads}, ...} for every full-attention layer instead of global_head_dim and
// num_global_key_value_heads. Every entry must name a full-attention layer and agree with the others
// (the units have one global shape); a global_* key stated beside them must agree too.
void read_gemma4_per_layer_config(const json& t, const std::string& at, ModelCard& c) {
  if (!t.contains("per_layer_config") || t["per_layer_config"].is_null()) return;
  const json& plc = t["per_layer_config"];
  const std::string where = at + ".per_layer_config";
  if (!plc.is_object()) throw InputError(where, fmt::format("expected an object, got {}", plc.dump()));
  std::optional<int64_t> head_dim, kv_heads;
  for (const auto& [key, entry] : plc.items()) {
    const std::string ew = where + "." + key;
    int64_t layer = -1;
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos || key.size() > 9 ||
        (layer = std::stoll(key)) >= c.num_layers)
      throw InputError(ew, fmt::format("is not a layer index below num_hidden_layers ({})", c.num_layers));
    if (c.layer_types[static_cast<size_t>(layer)] != AttentionKind::kFull)
      throw InputError(
          ew, "layer " + key + " is a sliding-attention layer; only full-attention layers differ here");
    if (!entry.is_object()) throw InputError(ew, "expected an object");
    for (const auto& [k, v] : entry.items())
      if (k != "head_dim" && k != "num_key_value_heads")
        throw InputError(ew + "." + k,
                         "is not supported (only head_dim and num_key_value_heads may differ per layer)");
    const int64_t hd = get_int(entry, "head_dim", ew, false, c.global_head_dim);
    if (head_dim && *head_dim != hd)
      throw InputError(ew + ".head_dim", "full-attention layers of different head_dim are not supported");
    head_dim = hd;
    if (entry.contains("num_key_value_heads")) {
      const int64_t kv = get_int(entry, "num_key_value_heads", ew, false, 0);
      if (kv_heads && *kv_heads != kv)
        throw InputError(ew + ".num_key_value_heads",
                         "full-attention layers of different KV heads are not supported");
      kv_heads = kv;
    }
  }
  auto agree = [&](const char* key, int64_t stated, int64_t from_layers) {
    if (t.contains(key) && !t[key].is_null() && stated != from_layers)
      throw InputError(at + "." + key,
                       fmt::format("{} disagrees with per_layer_config ({})", stated, from_layers));
  };
  if (head_dim) agree("global_head_dim", c.global_head_dim, *head_dim), c.global_head_dim = *head_dim;
  if (kv_heads)
    agree("num_global_key_value_heads", c.num_global_kv_heads, *kv_heads), c.num_global_kv_heads = *kv_heads;
}

// Gemma 4's text model: `t` is the text_config of a gemma4 config (or a whole gemma4_text config).
// Defaults are Gemma4TextConfig's; variants we do not train are refused naming their key.
ModelCard gemma4_card(const json& t, const std::string& origin, const std::string& where) {
  const std::string at = origin + ": " + where;
  if (!t.is_object()) throw InputError(at, "expected an object");
  ModelCard c;
  c.model_type = "gemma4";
  c.name = origin;
  c.hidden_size = get_int(t, "hidden_size", at, false, 2304);
  c.num_layers = get_int(t, "num_hidden_layers", at, false, 30);
  c.num_heads = get_int(t, "num_attention_heads", at, false, 8);
  c.num_kv_heads = get_int(t, "num_key_value_heads", at, false, 4);
  c.head_dim = get_int(t, "head_dim", at, false, 256);
  c.global_head_dim = get_int(t, "global_head_dim", at, false, 512);
  c.num_global_kv_heads = get_int(t, "num_global_key_value_heads", at, false, 0);
  c.attention_k_eq_v = get_bool(t, "attention_k_eq_v", at, false);
  c.intermediate_size = get_int(t, "intermediate_size", at, false, 9216);
  c.vocab_size = get_int(t, "vocab_size", at, false, 262144);
  c.max_position_embeddings = get_int(t, "max_position_embeddings", at, false, 131072);
  c.rms_norm_eps = get_number(t, "rms_norm_eps", at, 1e-6);
  c.tie_word_embeddings = get_bool(t, "tie_word_embeddings", at, true);
  c.sliding_window = get_int(t, "sliding_window", at, false, 512);
  c.final_logit_softcapping = get_number(t, "final_logit_softcapping", at, 0.0);
  if (get_int(t, "hidden_size_per_layer_input", at, false, 256) != 0)
    throw InputError(
        at + ".hidden_size_per_layer_input",
        "per-layer embeddings (Gemma 4 E2B/E4B) are not supported; the 26B-A4B and 31B set it to 0");
  if (get_int(t, "num_kv_shared_layers", at, false, 0) != 0)
    throw InputError(at + ".num_kv_shared_layers",
                     "KV sharing across layers (Gemma 4 E2B/E4B) is not supported");
  if (get_bool(t, "use_double_wide_mlp", at, false))
    throw InputError(at + ".use_double_wide_mlp", "double-wide MLPs (Gemma 4 E2B) are not supported");
  if (get_bool(t, "attention_bias", at, false))
    throw InputError(at + ".attention_bias", "projection biases are not supported for gemma4");
  if (t.contains("use_bidirectional_attention") && t["use_bidirectional_attention"] == "all")
    throw InputError(at + ".use_bidirectional_attention",
                     "'all' (bidirectional text) is not supported; text is causal");
  if (t.contains("hidden_activation") && t["hidden_activation"] != "gelu_pytorch_tanh")
    throw InputError(at + ".hidden_activation", "only gelu_pytorch_tanh is supported");
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    if (!t["layer_types"].is_array()) throw InputError(at + ".layer_types", "expected an array");
    for (const json& k : t["layer_types"]) {
      if (!k.is_string())
        throw InputError(at + ".layer_types", fmt::format("{} is not a layer type name", k.dump()));
      c.layer_types.push_back(attention_kind_from_name(
          k.get<std::string>(), {AttentionKind::kSliding, AttentionKind::kFull}, at + ".layer_types"));
    }
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_layers)
      throw InputError(at + ".layer_types", fmt::format("has {} entries for {} layers (num_hidden_layers)",
                                                        c.layer_types.size(), c.num_layers));
    if (!c.layer_types.empty()) c.layer_types.back() = AttentionKind::kFull;  // as Gemma4TextConfig forces
  } else {
    c.layer_types = gemma4_default_layer_types(c.num_layers);
  }
  read_gemma4_per_layer_config(t, at, c);
  c.rope_theta = 10000.0;
  c.global_rope_theta = 1e6;
  c.global_partial_rotary_factor = 0.25;
  if (t.contains("rope_parameters") && !t["rope_parameters"].is_null()) {
    const json& rp = t["rope_parameters"];
    const std::string rat = at + ".rope_parameters";
    if (!rp.is_object()) throw InputError(rat, "expected an object");
    if (rp.contains("sliding_attention")) {
      const json& s = rp["sliding_attention"];
      if (!s.is_object() || get_text(s, "rope_type", rat + ".sliding_attention", "default") != "default")
        throw InputError(rat + ".sliding_attention.rope_type", "only 'default' is supported");
      c.rope_theta = get_number(s, "rope_theta", rat + ".sliding_attention", 10000.0);
    }
    if (rp.contains("full_attention")) {
      const json& f = rp["full_attention"];
      if (!f.is_object() ||
          get_text(f, "rope_type", rat + ".full_attention", "proportional") != "proportional")
        throw InputError(rat + ".full_attention.rope_type", "only 'proportional' is supported");
      c.global_rope_theta = get_number(f, "rope_theta", rat + ".full_attention", 1e6);
      c.global_partial_rotary_factor = get_number(f, "partial_rotary_factor", rat + ".full_attention", 1.0);
    }
  }
  if (get_bool(t, "enable_moe_block", at, false)) {
    c.num_experts = get_int(t, "num_experts", at, true, 0);
    c.num_experts_per_tok = get_int(t, "top_k_experts", at, true, 0);
    c.moe_intermediate_size = get_int(t, "moe_intermediate_size", at, true, 0);
  }
  c.validate(at);
  return c;
}

// One RoPE description of the llama-style families: `type` "default" means unscaled.
RopeScaling rope_scaling_from(const json& r, const std::string& at) {
  const std::string type =
      r.contains("rope_type") ? get_text(r, "rope_type", at, "") : get_text(r, "type", at, "default");
  if (type != "llama3" && type != "linear" && type != "default")
    throw InputError(at + ".rope_type", fmt::format("'{}' is not supported (default, llama3, linear)", type));
  RopeScaling s;
  if (type == "default") return s;
  s.type = type;
  // The keys each type needs, required as transformers' validate_rope requires them.
  const bool llama3 = type == "llama3";
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if ((llama3 || std::string(key) == "factor") && (!r.contains(key) || r[key].is_null()))
      throw InputError(at + "." + key, fmt::format("missing (rope_type {} needs it)", type));
  s.factor = get_number(r, "factor", at, 1.0);
  s.low_freq_factor = get_number(r, "low_freq_factor", at, 1.0);
  s.high_freq_factor = get_number(r, "high_freq_factor", at, 4.0);
  s.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", at, false, 8192);
  if (!(s.factor > 0)) throw InputError(at + ".factor", fmt::format("{} must be positive", s.factor));
  return s;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type &&
         (a.type == "none" || (a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
                               a.high_freq_factor == b.high_freq_factor &&
                               a.original_max_position_embeddings == b.original_max_position_embeddings));
}

// Llama, Qwen2/2.5/3 and Mistral state RoPE in one of two layouts: transformers 4 writes a top-level
// rope_theta and rope_scaling; transformers 5 writes rope_parameters {rope_type, rope_theta, and the
// scaling's fields}. Both are read (a folder saved by either trains with its own theta); a config
// stating a value in both that disagree is refused naming both keys. The layout is kept on the card,
// so that --save-model writes the folder back as it came.
void read_llama_rope(const json& j, const std::string& origin, ModelCard& c) {
  const bool has_rp = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  const bool has_theta = j.contains("rope_theta") && !j["rope_theta"].is_null();
  // An empty rope_scaling is absent, as transformers reads it.
  const bool has_scaling = j.contains("rope_scaling") && !j["rope_scaling"].is_null() &&
                           !(j["rope_scaling"].is_object() && j["rope_scaling"].empty());
  if (has_scaling && !j["rope_scaling"].is_object())
    throw InputError(origin + ": rope_scaling",
                     fmt::format("expected an object or null, got {}", j["rope_scaling"].dump()));
  const double top_theta = get_number(j, "rope_theta", origin, 10000.0);
  const RopeScaling top_scaling =
      has_scaling ? rope_scaling_from(j["rope_scaling"], origin + ": rope_scaling") : RopeScaling{};
  c.hf_rope_parameters = has_rp;
  if (!has_rp) {
    c.rope_theta = top_theta;
    c.rope_scaling = top_scaling;
    return;
  }
  const json& rp = j["rope_parameters"];
  const std::string rat = origin + ": rope_parameters";
  if (!rp.is_object()) throw InputError(rat, fmt::format("expected an object, got {}", rp.dump()));
  c.rope_theta = get_number(rp, "rope_theta", rat, has_theta ? top_theta : 10000.0);
  c.rope_scaling = rope_scaling_from(rp, rat);
  if (get_number(rp, "partial_rotary_factor", rat, 1.0) != 1.0)
    throw InputError(rat + ".partial_rotary_factor",
                     "partial RoPE is not supported for " + c.model_type + " (only 1.0)");
  if (has_theta && top_theta != c.rope_theta)
    throw InputError(
        origin + ": rope_theta",
        fmt::format("{:g} disagrees with rope_parameters.rope_theta {:g}: the config states RoPE twice; "
                    "keep one",
                    top_theta, c.rope_theta));
  if (has_scaling && !same_scaling(top_scaling, c.rope_scaling))
    throw InputError(
        origin + ": rope_scaling",
        fmt::format("rope_type '{}' disagrees with rope_parameters (rope_type '{}'): the config states "
                    "RoPE twice; keep one",
                    top_scaling.type == "none" ? "default" : top_scaling.type,
                    c.rope_scaling.type == "none" ? "default" : c.rope_scaling.type));
}

// The card's layer_types as config.json names.
json layer_types_json(const ModelCard& c) {
  json types = json::array();
  for (AttentionKind k : c.layer_types) types.push_back(attention_kind_name(k));
  return types;
}

// The released multimodal wrapper around a text_config (no vision part: a text-only folder that
// transformers' text model class and we both load).
std::string wrapped_text_config(const char* architecture, const std::string& model_type, const json& text,
                                bool tied, const std::string& dtype) {
  json j;
  j["architectures"] = json::array({architecture});
  j["model_type"] = model_type;
  j["text_config"] = text;
  j["tie_word_embeddings"] = tied;
  j["dtype"] = dtype;  // the Gemma 4 and Qwen3.5 classes exist only in transformers 5
  return j.dump(2) + "\n";
}

// Qwen3.5/3.6's text model: `t` is the text_config of a qwen3_5 / qwen3_5_moe config (or a whole
// *_text config). Keys and defaults are Qwen3_5TextConfig's / Qwen3_5MoeTextConfig's; the DeltaNet's
// dimensions are required (a config without them is not one of these models).
ModelCard qwen3_5_card(const json& t, bool moe, const std::string& origin, const std::string& where) {
  const std::string at = origin + ": " + where;
  if (!t.is_object()) throw InputError(at, "expected an object");
  ModelCard c;
  c.model_type = moe ? "qwen3_5_moe" : "qwen3_5";
  c.name = origin;
  c.hidden_size = get_int(t, "hidden_size", at, true, 0);
  c.num_layers = get_int(t, "num_hidden_layers", at, true, 0);
  c.num_heads = get_int(t, "num_attention_heads", at, true, 0);
  c.num_kv_heads = get_int(t, "num_key_value_heads", at, true, 0);
  c.head_dim = get_int(t, "head_dim", at, false, 256);
  c.intermediate_size = moe ? 0 : get_int(t, "intermediate_size", at, true, 0);
  c.vocab_size = get_int(t, "vocab_size", at, true, 0);
  c.max_position_embeddings = get_int(t, "max_position_embeddings", at, false, 32768);
  c.rms_norm_eps = get_number(t, "rms_norm_eps", at, 1e-6);
  c.tie_word_embeddings = get_bool(t, "tie_word_embeddings", at, false);
  if (get_bool(t, "attention_bias", at, false))
    throw InputError(at + ".attention_bias", "projection biases are not supported for " + c.model_type);
  if (t.contains("attn_output_gate") && !get_bool(t, "attn_output_gate", at, true))
    throw InputError(at + ".attn_output_gate",
                     "false is not supported: the released models gate the attention output");
  if (t.contains("hidden_act") && t["hidden_act"] != "silu")
    throw InputError(at + ".hidden_act", "only silu is supported");
  c.linear_num_key_heads = get_int(t, "linear_num_key_heads", at, true, 0);
  c.linear_num_value_heads = get_int(t, "linear_num_value_heads", at, true, 0);
  c.linear_key_head_dim = get_int(t, "linear_key_head_dim", at, true, 0);
  c.linear_value_head_dim = get_int(t, "linear_value_head_dim", at, true, 0);
  c.linear_conv_kernel_dim = get_int(t, "linear_conv_kernel_dim", at, false, 4);
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    if (!t["layer_types"].is_array()) throw InputError(at + ".layer_types", "expected an array");
    for (const json& k : t["layer_types"]) {
      if (!k.is_string())
        throw InputError(at + ".layer_types", fmt::format("{} is not a layer type name", k.dump()));
      c.layer_types.push_back(attention_kind_from_name(
          k.get<std::string>(), {AttentionKind::kLinear, AttentionKind::kFull}, at + ".layer_types"));
    }
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_layers)
      throw InputError(at + ".layer_types", fmt::format("has {} entries for {} layers (num_hidden_layers)",
                                                        c.layer_types.size(), c.num_layers));
  } else {
    const int64_t interval = get_int(t, "full_attention_interval", at, false, 4);
    if (interval < 1)
      throw InputError(
          at + ".full_attention_interval",
          fmt::format("{} is not a layer interval: expected a positive integer (every N-th layer is "
                      "full attention)",
                      interval));
    c.layer_types = qwen3_5_default_layer_types(c.num_layers, interval);
  }
  // rope_parameters (transformers 5) or the older top-level keys; mrope_section collapses to 1-D RoPE
  // for text, whose three position streams are equal.
  const bool has_rp = t.contains("rope_parameters") && !t["rope_parameters"].is_null();
  if (has_rp && !t["rope_parameters"].is_object())
    throw InputError(at + ".rope_parameters",
                     fmt::format("expected an object, got {}", t["rope_parameters"].dump()));
  const json& rp = has_rp ? t["rope_parameters"] : t;
  const std::string rat = &rp == &t ? at : at + ".rope_parameters";
  if (rp.contains("rope_type") && rp["rope_type"] != "default")
    throw InputError(rat + ".rope_type", "only 'default' is supported");
  // Inside rope_parameters first, else the top-level key (transformers fills the dict from it); the
  // released files state both, equal.
  c.rope_theta = get_number(rp, "rope_theta", rat, get_number(t, "rope_theta", at, 10000000.0));
  c.partial_rotary_factor =
      get_number(rp, "partial_rotary_factor", rat, get_number(t, "partial_rotary_factor", at, 0.25));
  for (const char* key : {"rope_theta", "partial_rotary_factor"})
    if (has_rp && rp.contains(key) && t.contains(key) && !t[key].is_null() &&
        get_number(t, key, at, 0) != get_number(rp, key, rat, 0))
      throw InputError(at + "." + key, fmt::format("{} disagrees with rope_parameters.{} {}", t[key].dump(),
                                                   key, rp[key].dump()));
  if (moe) {
    c.num_experts = get_int(t, "num_experts", at, true, 0);
    c.num_experts_per_tok = get_int(t, "num_experts_per_tok", at, true, 0);
    c.moe_intermediate_size = get_int(t, "moe_intermediate_size", at, true, 0);
    c.shared_expert_intermediate_size = get_int(t, "shared_expert_intermediate_size", at, true, 0);
  }
  c.validate(at);
  return c;
}

// A qwen3_5 / qwen3_5_moe config.json as the released ForConditionalGeneration checkpoints have it,
// the text part only (no vision tower, no MTP head: not trained here).
std::string family_hf_config(const Qwen35Family& /*family*/, const ModelCard& c, const std::string& dtype) {
  const bool moe = c.model_type == "qwen3_5_moe";
  json t;
  t["model_type"] = c.model_type + "_text";
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_layers;
  t["num_attention_heads"] = c.num_heads;
  t["num_key_value_heads"] = c.num_kv_heads;
  t["head_dim"] = c.head_dim;
  if (!moe) t["intermediate_size"] = c.intermediate_size;
  t["vocab_size"] = c.vocab_size;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["layer_types"] = layer_types_json(c);
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.partial_rotary_factor}};
  t["attn_output_gate"] = true;
  t["hidden_act"] = "silu";
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  if (moe) {
    t["num_experts"] = c.num_experts;
    t["num_experts_per_tok"] = c.num_experts_per_tok;
    t["moe_intermediate_size"] = c.moe_intermediate_size;
    t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  }
  return wrapped_text_config(moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration",
                             c.model_type, t, c.tie_word_embeddings, dtype);
}

// Llama-style families: the whole config is the text model's.
ModelCard card_from_hf_config(const LlamaFamily& /*family*/, const json& j, const std::string& model_type,
                              const std::string& origin) {
  ModelCard c;
  c.model_type = model_type;
  c.name = origin;
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string())
    c.hf_repo = j["_name_or_path"].get<std::string>();
  c.hidden_size = get_int(j, "hidden_size", origin, true, 0);
  c.num_layers = get_int(j, "num_hidden_layers", origin, true, 0);
  c.num_heads = get_int(j, "num_attention_heads", origin, true, 0);
  c.num_kv_heads = get_int(j, "num_key_value_heads", origin, false, c.num_heads);
  if (c.num_heads <= 0) throw InputError(origin + ": num_attention_heads", "must be positive");
  const int64_t default_head_dim = c.model_type == "qwen3" ? 128 : c.hidden_size / c.num_heads;
  c.head_dim = get_int(j, "head_dim", origin, false, default_head_dim);
  c.intermediate_size = get_int(j, "intermediate_size", origin, true, 0);
  c.vocab_size = get_int(j, "vocab_size", origin, true, 0);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", origin, false, 4096);
  read_llama_rope(j, origin, c);
  c.rms_norm_eps = get_number(j, "rms_norm_eps", origin, 1e-6);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", origin, false);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // hard-coded in Qwen2Attention; no config key
  } else if (c.model_type == "mistral") {
    c.attention_bias = false;  // hard-coded in MistralAttention
  } else {
    // In LlamaAttention (and Qwen3, built on it) attention_bias also adds an o_proj bias, which the
    // unit layout does not have; such checkpoints are rare and rejected rather than mis-loaded.
    if (get_bool(j, "attention_bias", origin, false))
      throw InputError(origin + ": attention_bias",
                       "biases on q/k/v/o projections are not supported for " + c.model_type);
  }
  if (get_bool(j, "mlp_bias", origin, false))
    throw InputError(origin + ": mlp_bias", "MLP biases are not supported");
  // What these families could also state and the units do not do: refused, never trained as SiLU or
  // without the dropout the file asks for.
  if (get_text(j, "hidden_act", origin, "silu") != "silu")
    throw InputError(origin + ": hidden_act",
                     fmt::format("'{}' is not supported (silu)", j["hidden_act"].get<std::string>()));
  if (get_number(j, "attention_dropout", origin, 0.0) != 0.0)
    throw InputError(origin + ": attention_dropout",
                     "dropout is not supported; fine-tuning configs state 0.0");
  c.qk_norm = c.model_type == "qwen3";
  if (get_bool(j, "use_sliding_window", origin, false))
    throw InputError(origin + ": use_sliding_window", "sliding-window attention is not supported");
  // transformers 5 writes layer_types for these families too: every layer full attention here.
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
      throw InputError(
          origin + ": layer_types",
          fmt::format("expected {} entries (num_hidden_layers), got {}", c.num_layers, lt.dump()));
    for (const json& k : lt)
      if (k != "full_attention")
        throw InputError(
            origin + ": layer_types",
            fmt::format("{} is not supported for {}: every layer is full_attention", k.dump(), c.model_type));
  }
  if (c.model_type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null() &&
      get_int(j, "sliding_window", origin, false, 0) < c.max_position_embeddings)
    throw InputError(origin + ": sliding_window", "sliding-window attention is not supported");
  c.source = "config.json " + origin;
  c.validate(origin);
  return c;
}

// The text model of a family whose released checkpoints are ...ForConditionalGeneration, from `t`
// (text_config, or a whole *_text config), and what the folder holds that is not trained.
ModelCard text_model_card(const Gemma4Family& /*family*/, const json& t, const std::string& /*model_type*/,
                          const std::string& origin, const std::string& where) {
  return gemma4_card(t, origin, where);
}
std::string untrained_parts(const Gemma4Family& /*family*/, const json& j, bool outer) {
  return outer && j.contains("vision_config") && !j["vision_config"].is_null() ? "the vision tower is" : "";
}
// Qwen3.6 is loaded with the Qwen3.5 classes.
ModelCard text_model_card(const Qwen35Family& /*family*/, const json& t, const std::string& model_type,
                          const std::string& origin, const std::string& where) {
  return qwen3_5_card(t, model_type.starts_with("qwen3_5_moe"), origin, where);
}
std::string untrained_parts(const Qwen35Family& /*family*/, const json& /*j*/, bool outer) {
  return outer ? "the vision tower and the MTP head are" : "";
}

// Families that nest their text model under text_config (model_type `T`; `T_text` names a bare text
// config): the vision (and audio) towers and Qwen's MTP head are not trained, their tensors not read.
template <typename Family>
ModelCard card_from_hf_config(const Family& family, const json& j, const std::string& model_type,
                              const std::string& origin) {
  const bool outer = !model_type.ends_with("_text");
  if (outer && (!j.contains("text_config") || !j["text_config"].is_object()))
    throw InputError(
        origin + ": text_config",
        fmt::format("missing or not an object (a {} config holds the text model there)", model_type));
  const json& t = outer ? j["text_config"] : j;
  ModelCard m = text_model_card(family, t, model_type, origin, outer ? "text_config" : "config");
  if (outer && j.contains("tie_word_embeddings"))
    m.tie_word_embeddings = get_bool(j, "tie_word_embeddings", origin, m.tie_word_embeddings);
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string())
    m.hf_repo = j["_name_or_path"].get<std::string>();
  const std::string untrained = untrained_parts(family, j, outer);
  m.source =
      "config.json " + origin + (untrained.empty() ? "" : " (text model; " + untrained + " not trained)");
  m.validate(origin);
  return m;
}

// The family that reads `model_type`: its own names, and `T_text` for a family that nests its text
// model under text_config.
std::optional<ModelFamily> family_reading(const std::string& model_type) {
  if (!model_type.ends_with("_text")) return family_of_model_type(model_type);
  const std::optional<ModelFamily> f = family_of_model_type(model_type.substr(0, model_type.size() - 5));
  if (f && std::visit([](const auto& family) { return family.kTextConfigNested; }, *f)) return f;
  return std::nullopt;
}

}  // namespace

ModelCard model_card_from_hf_config(const std::string& json_text, const std::string& origin) {
  const json j = parse_json_strict(json_text, origin);
  if (!j.is_object()) throw InputError(origin, "expected a JSON object");
  if (!j.contains("model_type") || !j["model_type"].is_string())
    throw InputError(origin + ": model_type", "missing or not a string");
  const std::string model_type = j["model_type"].get<std::string>();
  // Keys we do not use are still refused when of the wrong type (a file transformers would not load).
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    if (!j["architectures"].is_array())
      throw InputError(origin + ": architectures", "expected a list of class names");
    for (const json& a : j["architectures"])
      if (!a.is_string())
        throw InputError(origin + ": architectures", fmt::format("{} is not a class name", a.dump()));
  }
  for (const char* key : {"torch_dtype", "dtype"}) get_text(j, key, origin, "");
  const std::optional<ModelFamily> family = family_reading(model_type);
  if (!family)
    throw InputError(origin + ": model_type", fmt::format("'{}' is not supported ({})", model_type,
                                                          fmt::join(supported_model_types(), ", ")));
  return std::visit([&](const auto& f) { return card_from_hf_config(f, j, model_type, origin); }, *family);
}

namespace {

// A gemma4 config.json as Gemma4ForConditionalGeneration's save_pretrained writes its text part (no
// vision tower: a text-only folder that transformers' Gemma4ForCausalLM and we both load).
std::string family_hf_config(const Gemma4Family& /*family*/, const ModelCard& c, const std::string& dtype) {
  json t;
  t["model_type"] = "gemma4_text";
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_layers;
  t["num_attention_heads"] = c.num_heads;
  t["num_key_value_heads"] = c.num_kv_heads;
  t["head_dim"] = c.head_dim;
  t["global_head_dim"] = c.global_head_dim;
  if (c.num_global_kv_heads > 0) t["num_global_key_value_heads"] = c.num_global_kv_heads;
  t["attention_k_eq_v"] = c.attention_k_eq_v;
  t["intermediate_size"] = c.intermediate_size;
  t["vocab_size"] = c.vocab_size;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["sliding_window"] = c.sliding_window;
  t["layer_types"] = layer_types_json(c);
  t["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
                          {"full_attention",
                           {{"rope_type", "proportional"},
                            {"partial_rotary_factor", c.global_partial_rotary_factor},
                            {"rope_theta", c.global_rope_theta}}}};
  t["final_logit_softcapping"] =
      c.final_logit_softcapping > 0 ? json(c.final_logit_softcapping) : json(nullptr);
  t["hidden_activation"] = "gelu_pytorch_tanh";
  t["hidden_size_per_layer_input"] = 0;
  t["num_kv_shared_layers"] = 0;
  t["use_double_wide_mlp"] = false;
  t["attention_bias"] = false;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["enable_moe_block"] = c.moe();
  if (c.moe()) {
    t["num_experts"] = c.num_experts;
    t["top_k_experts"] = c.num_experts_per_tok;
    t["moe_intermediate_size"] = c.moe_intermediate_size;
  }
  return wrapped_text_config("Gemma4ForConditionalGeneration", "gemma4", t, c.tie_word_embeddings, dtype);
}

std::string family_hf_config(const LlamaFamily& /*family*/, const ModelCard& c, const std::string& dtype) {
  static const std::map<std::string, std::string> kArch = {{"llama", "LlamaForCausalLM"},
                                                           {"qwen2", "Qwen2ForCausalLM"},
                                                           {"qwen3", "Qwen3ForCausalLM"},
                                                           {"mistral", "MistralForCausalLM"}};
  json j;
  j["architectures"] = json::array({kArch.at(c.model_type)});
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate_size"] = c.intermediate_size;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  json rope = {{"rope_type", c.rope_scaling.type == "none" ? "default" : c.rope_scaling.type}};
  if (c.rope_scaling.type == "llama3") {
    rope["factor"] = c.rope_scaling.factor;
    rope["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  } else if (c.rope_scaling.type == "linear") {
    rope["factor"] = c.rope_scaling.factor;
  }
  if (c.hf_rope_parameters) {  // transformers 5: theta inside, no top-level keys
    rope["rope_theta"] = c.rope_theta;
    j["rope_parameters"] = rope;
  } else {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = c.rope_scaling.type == "none" ? json(nullptr) : rope;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type != "qwen2" && c.model_type != "mistral") j["attention_bias"] = c.attention_bias;
  if (c.model_type == "llama") j["mlp_bias"] = false;
  if (c.model_type == "qwen2") j["use_sliding_window"] = false;
  j["hidden_act"] = "silu";
  j[c.hf_rope_parameters ? "dtype" : "torch_dtype"] = dtype;
  return j.dump(2) + "\n";
}

}  // namespace

std::string model_card_to_hf_config(const ModelCard& c, const std::string& dtype) {
  return std::visit([&](const auto& f) { return family_hf_config(f, c, dtype); }, c.family());
}

}  // namespace slidedp
