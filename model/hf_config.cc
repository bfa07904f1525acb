// Hugging Face config.json <-> ModelCard for the llama, qwen2, qwen3 and mistral model types.
// Architecture facts that config.json does not state are filled in as transformers does:
// Qwen2 always has q/k/v biases; Qwen3 always has q/k norms. A missing head_dim is 128 for Qwen3
// (Qwen3Config's default) and hidden/heads for the others (Llama, Mistral; Qwen2 has no such key).
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/model_card.h"

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

}  // namespace

ModelCard model_card_from_hf_config(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InputError(origin, fmt::format("malformed JSON: {}", e.what()));
  }
  if (!j.is_object()) throw InputError(origin, "expected a JSON object");
  ModelCard c;
  if (!j.contains("model_type") || !j["model_type"].is_string())
    throw InputError(origin + ": model_type", "missing or not a string");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      c.model_type != "mistral")
    throw InputError(origin + ": model_type",
                     fmt::format("'{}' is not supported (llama, qwen2, qwen3, mistral)", c.model_type));
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
  c.rope_theta = get_number(j, "rope_theta", origin, 10000.0);
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
      throw InputError(origin + ": attention_bias", "biases on q/k/v/o projections are not supported for " + c.model_type);
  }
  if (get_bool(j, "mlp_bias", origin, false))
    throw InputError(origin + ": mlp_bias", "MLP biases are not supported");
  c.qk_norm = c.model_type == "qwen3";
  if (get_bool(j, "use_sliding_window", origin, false))
    throw InputError(origin + ": use_sliding_window", "sliding-window attention is not supported");
  if (c.model_type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null() &&
      get_int(j, "sliding_window", origin, false, 0) < c.max_position_embeddings)
    throw InputError(origin + ": sliding_window", "sliding-window attention is not supported");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) throw InputError(origin + ": rope_scaling", "expected an object or null");
    std::string type = rs.contains("rope_type") ? rs["rope_type"].get<std::string>()
                       : rs.contains("type")    ? rs["type"].get<std::string>()
                                                : "";
    if (type != "llama3" && type != "linear" && type != "default")
      throw InputError(origin + ": rope_scaling.rope_type",
                       fmt::format("'{}' is not supported (llama3, linear)", type));
    if (type != "default") {
      c.rope_scaling.type = type;
      c.rope_scaling.factor = get_number(rs, "factor", origin + ": rope_scaling", 1.0);
      c.rope_scaling.low_freq_factor = get_number(rs, "low_freq_factor", origin, 1.0);
      c.rope_scaling.high_freq_factor = get_number(rs, "high_freq_factor", origin, 4.0);
      c.rope_scaling.original_max_position_embeddings =
          get_int(rs, "original_max_position_embeddings", origin, false, 8192);
    }
  }
  c.source = "config.json " + origin;
  c.validate(origin);
  return c;
}

std::string model_card_to_hf_config(const ModelCard& c) {
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
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == "none") {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings",
                          c.rope_scaling.original_max_position_embeddings}};
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type != "qwen2" && c.model_type != "mistral") j["attention_bias"] = c.attention_bias;
  if (c.model_type == "llama") j["mlp_bias"] = false;
  if (c.model_type == "qwen2") j["use_sliding_window"] = false;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

}  // namespace slidedp
