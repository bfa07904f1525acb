// Hugging Face model folders <-> unit flat buffers. A folder is config.json (read and written by
// card/hf_config.cc) plus model.safetensors or shards listed in model.safetensors.index.json.
// Loading checks every tensor's presence, dtype and shape against the config; saving writes bf16
// shards with an index and publishes the whole folder atomically (temp folder, fsync, rename), so a
// reader never sees a half-written model. load -> save -> load is bitwise identical.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "io/safetensors.h"
#include "io/unit_tensors.h"

namespace slidedp {

struct HfModel {
  ModelCard card;
  ModelLayout layout;
  UnitBuffers units;  // [unit] -> (flat_numel,) fp32, padding zero
};

// Reads dir/config.json and the weights. Accepted: every layout tensor in F32/F16/BF16 with the
// config's shape; for tied models an lm_head.weight that equals embed_tokens (some exporters write the
// shared tensor twice); rotary_emb.inv_freq buffers of older Llama exports (derived, not parameters).
// Anything else is an InputError naming the file and the tensor.
HfModel load_hf_model(const std::string& dir);

struct HfSaveOptions {
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"; a larger tensor gets its own shard
  TensorDtype dtype = TensorDtype::kBF16;   // kBF16 (what the model trains with) or kF32
  bool overwrite = false;                   // replace an existing folder (atomically); files that are
                                            // not weights or config (tokenizer, ...) carry over
  std::string copy_extra_files_from;        // a folder whose non-weight files (tokenizer, generation
                                            // config) are copied in; empty: none
  // Called while the weights are written; it may throw to abandon the save (a run interrupted during
  // it): the temp folder goes and `dir` is left as it was.
  std::function<void()> poll;
};

// Writes config.json + model.safetensors (or model-0000k-of-0000n.safetensors + index) into `dir`.
// `units` are the flat buffers of make_model_layout(card). Throws IoError / InputError.
void save_hf_model(const std::string& dir, const ModelCard& card, const UnitSpans& units,
                   const HfSaveOptions& options = {});

// Saving by several writers (one per node of a state sharded across nodes), in three steps like
// checkpoints (io/checkpoint.h): one process checks `dir` as save_hf_model does and returns a temp
// folder holding config.json and the carried files; every writer writes its part's tensors (layout
// order, `split.file("model", part)`); the first process writes the index (more than one part) and
// publishes the folder. After a failure the temp folder is removed (std::filesystem::remove_all).
std::string begin_hf_model_save(const std::string& dir, const ModelCard& card, const HfSaveOptions& options);
void write_hf_model_part(const std::string& tmp_dir, const ModelLayout& layout, const TensorSplit& split, int part,
                         std::span<const std::span<const float>> tensors, TensorDtype dtype,
                         const std::function<void()>& poll = {});
void finish_hf_model_save(const std::string& tmp_dir, const std::string& dir, const ModelLayout& layout,
                          const TensorSplit& split, TensorDtype dtype);

// The shard plan save_hf_model uses: tensors in order, a new shard when the next tensor would exceed
// max_shard_bytes. Returns [shard] -> tensor indices. Exposed for tests.
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<int64_t>& tensor_bytes,
                                                  int64_t max_shard_bytes);

// True for files that are weights or the model config (what save_hf_model writes or must not carry
// over stale): *.safetensors, *.safetensors.index.json, *.bin, *.pt, *.pth, *.gguf, config.json, ...
bool is_weight_or_config_file(const std::string& file_name);

}  // namespace slidedp
