// Hugging Face model folder reading and writing; see hf_model.h for the contract.
#include "io/hf_model.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "io/posix_file.h"

namespace slidedp {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Regular files of `dir` that are neither weights nor config. Refuses sub-folders when `strict`.
std::vector<fs::path> carry_over_files(const std::string& dir, bool strict) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory()) {
      if (strict) throw IoError(dir, fmt::format("holds the sub-folder '{}'; refusing to replace it", name));
      continue;
    }
    if (entry.is_regular_file() && !is_weight_or_config_file(name)) files.push_back(entry.path());
  }
  if (ec) throw IoError(dir, "cannot list folder: " + ec.message());
  return files;
}

void write_text(const fs::path& path, const std::string& text) {
  OutputFile out(path.string());
  out.write(text);
  out.finish();
}

}  // namespace

bool is_weight_or_config_file(const std::string& name) {
  static const char* kSuffixes[] = {
      ".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth", ".gguf", ".h5",
      ".msgpack"};
  if (name == "config.json" || name == "trainer_state.json") return true;
  for (const char* s : kSuffixes)
    if (ends_with(name, s)) return true;
  return false;
}

HfModel load_hf_model(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  HfModel m;
  m.card = model_card_from_hf_config(read_text_file(config_path), config_path);
  m.layout = make_model_layout(m.card);
  SafetensorsSet src = SafetensorsSet::open_model_dir(dir);

  std::vector<std::string> names = layout_tensor_names(m.layout, "");
  std::set<std::string> expected(names.begin(), names.end());
  std::set<std::string> ignorable;
  for (int64_t l = 0; l < m.card.num_layers; ++l)
    ignorable.insert(fmt::format("model.layers.{}.self_attn.rotary_emb.inv_freq", l));
  if (m.card.tie_word_embeddings) ignorable.insert("lm_head.weight");
  // The family's tensors outside the text model (vision and audio towers, an MTP head): not read.
  std::visit(
      [&](auto family) {
        for (const auto& ref : src.all())
          for (std::string_view part : decltype(family)::kIgnoredTensorPrefixes)
            if (ref.entry->name.starts_with(part)) ignorable.insert(ref.entry->name);
      },
      m.card.family());
  check_no_unexpected_tensors(src, expected, ignorable);
  if (!m.card.tie_word_embeddings && !src.find("lm_head.weight"))
    throw InputError(src.origin(),
                     "missing tensor 'lm_head.weight' (config.json has tie_word_embeddings false, so "
                     "the head needs its own weight)");

  m.units = zero_unit_buffers(m.layout);
  ThreadPool pool(load_threads());
  read_unit_tensors(src, m.layout, "", m.units, std::nullopt, &pool);
  // No training step makes a weight NaN or infinite, and one would spread to every step's loss: a
  // folder holding one is refused, naming the tensor (as the checkpoint reader refuses one).
  for (std::size_t u = 0; u < m.layout.units.size(); ++u)
    for (const TensorSpec& t : m.layout.units[u].tensors) {
      std::atomic<int64_t> bad{-1};
      const float* v = m.units[u].data() + t.offset;
      pool.parallel_for_range(0, t.numel, int64_t{1} << 20, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          if (!std::isfinite(v[i])) {
            int64_t none = -1;
            bad.compare_exchange_strong(none, i);
            return;
          }
      });
      if (bad >= 0) {
        const auto ref = src.find(t.name);
        throw InputError(fmt::format("{}: tensor '{}'", ref ? ref->file->path() : dir, t.name),
                         fmt::format("element {} is {}: a weight must be finite", bad.load(), v[bad.load()]));
      }
    }

  if (m.card.tie_word_embeddings) {
    if (auto lm = src.find("lm_head.weight")) {
      const TensorSpec& emb = m.layout.embedding_weight();
      const std::string where = fmt::format("{}: tensor 'lm_head.weight'", lm->file->path());
      if (lm->entry->shape != emb.shape) throw InputError(where, "shape differs from " + emb.name);
      std::vector<float> head(static_cast<std::size_t>(lm->entry->numel));
      lm->file->read_fp32(*lm->entry, head);
      const float* e = m.units[0].data() + emb.offset;
      if (std::memcmp(head.data(), e, head.size() * sizeof(float)) != 0)
        throw InputError(
            where, "tie_word_embeddings is true but lm_head.weight differs from " + emb.name);
    }
  }
  return m;
}

std::vector<std::vector<std::size_t>> plan_shards(const std::vector<int64_t>& tensor_bytes,
                                                  int64_t max_shard_bytes) {
  SLIDEDP_CHECK(max_shard_bytes > 0, "max_shard_bytes must be positive");
  std::vector<std::vector<std::size_t>> shards;
  int64_t current = 0;
  for (std::size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (shards.empty() || (current > 0 && current + tensor_bytes[i] > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += tensor_bytes[i];
  }
  return shards;
}

namespace {

// Runs `fill` on the temp folder `tmp` of a save to `dir`; on any error removes the folder and
// rethrows (a file-system error as an IoError naming `dir`).
template <class Fill>
void filling_temp_dir(const std::string& tmp, const std::string& dir, Fill fill) {
  try {
    fill();
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw IoError(dir, e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

std::string begin_hf_model_save(const std::string& dir, const ModelCard& card, const HfSaveOptions& options) {
  if (options.dtype != TensorDtype::kBF16 && options.dtype != TensorDtype::kF32)
    throw InputError("save_hf_model: dtype", "only BF16 and F32 are written");
  if (options.max_shard_bytes <= 0) throw InputError("save_hf_model: max_shard_bytes", "must be positive");
  std::vector<fs::path> carried;
  if (fs::exists(dir)) {
    if (!fs::is_directory(dir)) throw IoError(dir, "exists and is not a folder");
    if (!fs::is_empty(dir) && !options.overwrite)
      throw IoError(dir, "exists and is not empty (set overwrite to replace it)");
    carried = carry_over_files(dir, /*strict=*/true);
  }
  if (!options.copy_extra_files_from.empty()) {
    for (auto& f : carry_over_files(options.copy_extra_files_from, /*strict=*/false)) carried.push_back(f);
  }

  // A save killed before its rename left ".tmp-<name>-<pid>-<n>" beside the target: this save's
  // writer is dead, so the folder is garbage (other targets' and live writers' folders stay).
  {
    fs::path target = fs::path(dir);
    if (!target.has_filename()) target = target.parent_path();
    const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    if (fs::is_directory(parent)) remove_stale_temp_dirs(parent.string(), target.filename().string());
  }
  std::string tmp = make_temp_dir_beside(dir);
  filling_temp_dir(tmp, dir, [&] {
    write_text(fs::path(tmp) / "config.json",
               model_card_to_hf_config(card, options.dtype == TensorDtype::kBF16 ? "bfloat16" : "float32"));
    for (const auto& f : carried)
      fs::copy_file(f, fs::path(tmp) / f.filename(), fs::copy_options::overwrite_existing);
  });
  return tmp;
}

void write_hf_model_part(const std::string& tmp_dir, const ModelLayout& layout, const TensorSplit& split, int part,
                         std::span<const std::span<const float>> tensors, TensorDtype dtype,
                         const std::function<void()>& poll) {
  std::vector<TensorToWrite> mine;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (std::size_t t = 0; t < layout.units[u].tensors.size(); ++t) {
      if (split.part_of[u][t] != part) continue;
      const TensorSpec& spec = layout.units[u].tensors[t];
      SLIDEDP_CHECK(mine.size() < tensors.size() && static_cast<int64_t>(tensors[mine.size()].size()) == spec.numel,
                    "write_hf_model_part: the tensors differ from the part's: " + spec.name);
      mine.push_back(TensorToWrite{spec.name, spec.shape, tensors[mine.size()]});
    }
  SLIDEDP_CHECK(mine.size() == tensors.size(), "write_hf_model_part: more tensors than the part holds");
  if (mine.empty()) return;
  // A model folder with a NaN or infinite weight would load as garbage everywhere: the save fails
  // (exit 5) and its temp folder goes, as a checkpoint's does.
  for (const TensorToWrite& t : mine)
    for (std::size_t i = 0; i < t.values.size(); ++i)
      if (!std::isfinite(t.values[i]))
        throw NumericError(fmt::format("{}: tensor '{}' element {} is {}; the model is not saved", tmp_dir, t.name, i,
                                       t.values[i]));
  SafetensorsWriteOptions wopt;
  wopt.dtype = dtype;
  wopt.poll = poll;
  write_safetensors((fs::path(tmp_dir) / split.file("model", part)).string(), mine, wopt);
}

void finish_hf_model_save(const std::string& tmp_dir, const std::string& dir, const ModelLayout& layout,
                          const TensorSplit& split, TensorDtype dtype) {
  if (split.parts > 1)
    write_text(fs::path(tmp_dir) / "model.safetensors.index.json",
               tensor_split_index_json(layout, split, "model", {""}, tensor_dtype_bytes(dtype)));
  // An existing folder here is empty or overwrite was asked for (begin_hf_model_save checked): replace it.
  publish_dir(tmp_dir, dir, /*replace=*/true);
}

void save_hf_model(const std::string& dir, const ModelCard& card, const UnitSpans& units,
                   const HfSaveOptions& options) {
  ModelLayout layout = make_model_layout(card);
  check_unit_sizes(layout, units, dir);
  std::vector<TensorToWrite> tensors = unit_tensors_to_write(layout, units, "");
  std::vector<int64_t> bytes;
  for (const auto& t : tensors) bytes.push_back(static_cast<int64_t>(t.values.size()) * tensor_dtype_bytes(options.dtype));
  const std::string tmp = begin_hf_model_save(dir, card, options);
  filling_temp_dir(tmp, dir, [&] {
    // The shards by size, as a split of the layout's tensors (in order, so unit by unit).
    const auto shards = plan_shards(bytes, options.max_shard_bytes);
    TensorSplit split;
    split.parts = static_cast<int>(shards.size());
    std::size_t i = 0;
    std::vector<int> shard_of(tensors.size());
    for (std::size_t s = 0; s < shards.size(); ++s)
      for (std::size_t t : shards[s]) shard_of[t] = static_cast<int>(s);
    for (const auto& unit : layout.units) {
      split.part_of.emplace_back();
      for (std::size_t t = 0; t < unit.tensors.size(); ++t) split.part_of.back().push_back(shard_of[i++]);
    }
    for (int s = 0; s < split.parts; ++s) {
      std::vector<std::span<const float>> mine;
      for (std::size_t t : shards[static_cast<std::size_t>(s)]) mine.push_back(tensors[t].values);
      write_hf_model_part(tmp, layout, split, s, mine, options.dtype, options.poll);
    }
    finish_hf_model_save(tmp, dir, layout, split, options.dtype);
  });
}

}  // namespace slidedp
