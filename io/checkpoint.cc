// Checkpoint writing, loading and rotation; see checkpoint.h for the layout and the atomicity rules.
// trainer_state.json keeps 64-bit words (seed, RNG) as "0x..." strings so that tools whose JSON numbers
// are doubles (jq, JavaScript) cannot round them.
#include "io/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strict_json.h"
#include "common/file_util.h"
#include "io/posix_file.h"
#include "io/safetensors.h"

namespace slidedp {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps key order: metadata round-trips byte for byte

namespace {

// 2 added adamw_step and lr_schedule; version 1 files still load.
constexpr int kCheckpointFormatVersion = 2;
constexpr const char* kExpAvg = ".exp_avg";
constexpr const char* kExpAvgSq = ".exp_avg_sq";

std::string hex64(uint64_t v) { return fmt::format("0x{:016x}", v); }

// Checks every padding element (between aligned tensors and at the unit's end) is +0.0: padding is not
// stored, so anything else would not survive the round trip bit-exactly.
void check_padding_zero(const ModelLayout& layout, const UnitSpans& units, const std::string& what) {
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    const auto& tensors = layout.units[u].tensors;
    int64_t pos = 0;
    auto check_range = [&](int64_t from, int64_t to) {
      for (int64_t i = from; i < to; ++i)
        if (std::bit_cast<uint32_t>(units[u][static_cast<std::size_t>(i)]) != 0u)
          throw InputError(what, fmt::format("unit {} padding element {} is {} (padding must stay +0)", u, i,
                                             units[u][static_cast<std::size_t>(i)]));
    };
    for (const auto& t : tensors) {
      check_range(pos, t.offset);
      pos = t.offset + t.numel;
    }
    check_range(pos, layout.units[u].flat_numel);
  }
}

void write_text(const fs::path& path, const std::string& text) {
  OutputFile out(path.string());
  out.write(text);
  out.finish();
}

json cursor_to_json(const DataCursor& c) {
  json j = {{"epoch", c.epoch},
            {"position", c.position},
            {"num_sequences", c.num_sequences},
            {"seq_len", c.seq_len},
            {"seed", hex64(c.seed)}};
  if (c.document_end >= 0) j["document_end"] = c.document_end;  // packed documents only
  return j;
}

// Strict readers for trainer_state.json: each names the file and the key path.
class StateReader {
 public:
  explicit StateReader(std::string path) : path_(std::move(path)) {}

  void keys(const json& obj, const std::string& at, const std::vector<std::string>& allowed) const {
    if (!obj.is_object()) throw InputError(where(at), "expected an object");
    for (const auto& [k, _] : obj.items()) {
      bool ok = false;
      for (const std::string& a : allowed) ok = ok || k == a;
      if (!ok) throw InputError(where(at.empty() ? k : at + "." + k), "unknown key");
    }
    for (const std::string& a : allowed)
      if (!obj.contains(a)) throw InputError(where(at.empty() ? a : at + "." + a), "missing key");
  }
  int64_t integer(const json& obj, const std::string& at, const char* key) const {
    const json& v = obj.at(key);
    if (!v.is_number_integer()) throw InputError(where(join(at, key)), "expected an integer");
    return v.get<int64_t>();
  }
  double number(const json& obj, const std::string& at, const char* key) const {
    const json& v = obj.at(key);
    if (!v.is_number()) throw InputError(where(join(at, key)), "expected a number");
    return v.get<double>();
  }
  uint64_t word(const json& v, const std::string& at) const {
    if (!v.is_string()) throw InputError(where(at), "expected a \"0x...\" hex string");
    const std::string s = v.get<std::string>();
    if (s.size() < 3 || s.size() > 18 || s.compare(0, 2, "0x") != 0 ||
        s.find_first_not_of("0123456789abcdefABCDEF", 2) != std::string::npos)
      throw InputError(where(at), fmt::format("'{}' is not a \"0x...\" 64-bit hex string", s));
    return std::stoull(s.substr(2), nullptr, 16);
  }

 private:
  static std::string join(const std::string& at, const char* key) {
    return at.empty() ? key : at + "." + key;
  }
  std::string where(const std::string& at) const { return path_ + ": " + at; }
  std::string path_;
};

TrainerState parse_trainer_state(const std::string& path) {
  const json j = parse_json_strict<json>(read_text_file(path), path);
  StateReader r(path);
  const int64_t version = j.is_object() && j.contains("format_version") ? r.integer(j, "", "format_version") : 0;
  if (version < 1 || version > kCheckpointFormatVersion)
    throw InputError(path + ": format_version",
                     fmt::format("{} is not supported (this build reads 1 to {})",
                                 j.is_object() && j.contains("format_version") ? j["format_version"].dump() : "missing",
                                 kCheckpointFormatVersion));
  std::vector<std::string> keys = {"format", "format_version", "optimizer_step", "lr_schedule_step", "learning_rate",
                                   "data_cursor", "rng_state", "metadata"};
  if (version >= 2) keys.insert(keys.end(), {"adamw_step", "lr_schedule"});
  if (j.is_object() && j.contains("optimizer_states")) keys.push_back("optimizer_states");
  r.keys(j, "", keys);
  if (j["format"] != "slidedp-checkpoint")
    throw InputError(path + ": format", "expected \"slidedp-checkpoint\"");
  TrainerState s;
  s.optimizer_step = r.integer(j, "", "optimizer_step");
  if (version >= 2) {
    s.adamw_step = r.integer(j, "", "adamw_step");
    if (s.adamw_step < 0 || s.adamw_step > s.optimizer_step)
      throw InputError(path + ": adamw_step", fmt::format("{} must be in [0, optimizer_step = {}]", s.adamw_step,
                                                          s.optimizer_step));
    if (!j["lr_schedule"].is_null()) {
      if (!j["lr_schedule"].is_object()) throw InputError(path + ": lr_schedule", "expected an object or null");
      s.lr_schedule_json = j["lr_schedule"].dump();
    }
  }
  if (j.contains("optimizer_states")) {
    const json& f = j["optimizer_states"];
    if (!f.is_string())
      throw InputError(path + ": optimizer_states", fmt::format("{} is not a name", f.dump()));
    s.optimizer_states = parse_optimizer_states(f.get<std::string>(), path + ": optimizer_states");
  }
  s.lr_schedule_step = r.integer(j, "", "lr_schedule_step");
  s.learning_rate = r.number(j, "", "learning_rate");
  const json& c = j["data_cursor"];
  std::vector<std::string> cursor_keys = {"epoch", "position", "num_sequences", "seq_len", "seed"};
  const bool documents = c.is_object() && c.contains("document_end");
  if (documents) cursor_keys.push_back("document_end");
  r.keys(c, "data_cursor", cursor_keys);
  if (documents) {
    s.data_cursor.document_end = r.integer(c, "data_cursor", "document_end");
    if (s.data_cursor.document_end < 0) throw InputError(path + ": data_cursor.document_end", "must be >= 0");
  }
  s.data_cursor.epoch = r.integer(c, "data_cursor", "epoch");
  s.data_cursor.position = r.integer(c, "data_cursor", "position");
  s.data_cursor.num_sequences = r.integer(c, "data_cursor", "num_sequences");
  s.data_cursor.seq_len = r.integer(c, "data_cursor", "seq_len");
  s.data_cursor.seed = r.word(c["seed"], "data_cursor.seed");
  if (!j["rng_state"].is_array()) throw InputError(path + ": rng_state", "expected an array of hex strings");
  for (std::size_t i = 0; i < j["rng_state"].size(); ++i)
    s.rng_state.push_back(r.word(j["rng_state"][i], fmt::format("rng_state[{}]", i)));
  s.metadata_json = j["metadata"].dump();
  if (s.optimizer_step < 0) throw InputError(path + ": optimizer_step", "must be >= 0");
  return s;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }

CheckpointData LoadedCheckpoint::view() const {
  return CheckpointData{card, unit_spans(master), unit_spans(adam_m), unit_spans(adam_v), state};
}

namespace {

json trainer_state_json(const TrainerState& st) {
  if (st.optimizer_step < 0) throw InputError("checkpoint: optimizer_step", "must be >= 0");
  // ordered_json keeps the caller's key order, so a compact metadata string comes back byte-identical.
  json metadata;
  try {
    metadata = json::parse(st.metadata_json.empty() ? std::string("null") : st.metadata_json);
  } catch (const json::parse_error& e) {
    throw InputError("checkpoint: metadata_json", fmt::format("not valid JSON: {}", e.what()));
  }
  if (st.adamw_step > st.optimizer_step)
    throw InputError("checkpoint: adamw_step", fmt::format("{} exceeds optimizer_step {}", st.adamw_step, st.optimizer_step));
  json lr_schedule;  // null when not recorded
  if (!st.lr_schedule_json.empty()) {
    try {
      lr_schedule = json::parse(st.lr_schedule_json);
    } catch (const json::parse_error& e) {
      throw InputError("checkpoint: lr_schedule_json", fmt::format("not valid JSON: {}", e.what()));
    }
    if (!lr_schedule.is_object()) throw InputError("checkpoint: lr_schedule_json", "expected a JSON object");
  }
  json state = {{"format", "slidedp-checkpoint"},
                {"format_version", kCheckpointFormatVersion},
                {"optimizer_step", st.optimizer_step},
                {"adamw_step", st.adamw_step < 0 ? st.optimizer_step : st.adamw_step},
                {"lr_schedule_step", st.lr_schedule_step},
                {"lr_schedule", lr_schedule},
                {"learning_rate", st.learning_rate},
                {"data_cursor", cursor_to_json(st.data_cursor)},
                {"rng_state", json::array()},
                {"metadata", metadata}};
  for (uint64_t w : st.rng_state) state["rng_state"].push_back(hex64(w));
  if (st.optimizer_states != OptimizerStates::kFp32)
    state["optimizer_states"] = optimizer_states_name(st.optimizer_states);
  return state;
}

void rotate_checkpoints(const std::string& root_dir, int64_t kept_step, int keep_last) {
  if (keep_last <= 0) return;
  // Keep the checkpoint just written and the newest keep_last - 1 others. The new one is never
  // deleted, even when checkpoints of later steps exist (a run resumed from an older checkpoint):
  // those are left for the caller to judge.
  std::vector<std::pair<int64_t, std::string>> others;
  for (auto& c : list_checkpoints(root_dir))
    if (c.first != kept_step) others.push_back(std::move(c));
  const std::size_t keep_others = static_cast<std::size_t>(keep_last - 1);
  std::error_code ec;
  for (std::size_t i = 0; i + keep_others < others.size(); ++i) {
    // Rename first (one atomic step) so a kill mid-delete leaves a .tmp-* folder, never a
    // half-deleted step-* folder that looks complete.
    std::string trash = make_temp_dir_beside(others[i].second);
    if (::rename(others[i].second.c_str(), trash.c_str()) != 0)
      throw IoError(others[i].second, std::string("cannot move aside for deletion: ") + std::strerror(errno));
    fs::remove_all(trash, ec);
  }
  fsync_path(root_dir);
}

}  // namespace

std::string begin_checkpoint(const std::string& root_dir, const TrainerState& state) {
  trainer_state_json(state);  // a bad state fails before anything is written
  std::error_code ec;
  fs::create_directories(root_dir, ec);
  if (ec) throw IoError(root_dir, "cannot create folder: " + ec.message());
  remove_stale_temp_dirs(root_dir);
  return make_temp_dir_beside((fs::path(root_dir) / checkpoint_dir_name(state.optimizer_step)).string());
}

void write_checkpoint_part(const std::string& tmp_dir, const ModelLayout& layout, const TensorSplit& split,
                           int part, std::span<const TensorStateView> tensors, int64_t step,
                           const CheckpointFileHook& on_file_written) {
  std::vector<TensorToWrite> master, moments, second;
  // Either file may be left out (its views empty): a writer short of memory calls twice.
  const bool with_master = tensors.empty() || !tensors.front().master.empty();
  const bool with_moments = tensors.empty() || !tensors.front().m.empty();
  std::size_t i = 0;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (std::size_t t = 0; t < layout.units[u].tensors.size(); ++t) {
      if (split.part_of[u][t] != part) continue;
      SLIDEDP_CHECK(i < tensors.size(), "write_checkpoint_part: fewer tensors than the part holds");
      const TensorSpec& spec = layout.units[u].tensors[t];
      const TensorStateView& view = tensors[i++];
      SLIDEDP_CHECK(static_cast<int64_t>(view.master.size()) == (with_master ? spec.numel : 0) &&
                    static_cast<int64_t>(view.m.size()) == (with_moments ? spec.numel : 0) &&
                    static_cast<int64_t>(view.v.size()) == (with_moments ? spec.numel : 0),
                    "write_checkpoint_part: tensor size differs from the layout: " + spec.name);
      // A poisoned update (a weight decay that overflows, a NaN the step did not catch) never reaches
      // disk: the previous checkpoint stays the newest.
      for (const auto& [values, what, second_moment] :
           {std::tuple{view.master, "master weight", false}, std::tuple{view.m, "AdamW first moment", false},
            std::tuple{view.v, "AdamW second moment", true}})
        for (std::size_t k = 0; k < values.size(); ++k)
          if (!std::isfinite(values[k]) || (second_moment && values[k] < 0.0f))
            throw NumericError(fmt::format("step {}: {} {}[{}] is {}; the checkpoint is not written (the previous one "
                                           "stays the newest)",
                                           step, what, spec.name, k, values[k]));
      master.push_back(TensorToWrite{spec.name, spec.shape, view.master});
      moments.push_back(TensorToWrite{spec.name + kExpAvg, spec.shape, view.m});
      second.push_back(TensorToWrite{spec.name + kExpAvgSq, spec.shape, view.v});
    }
  SLIDEDP_CHECK(i == tensors.size(), "write_checkpoint_part: more tensors than the part holds");
  if (master.empty()) return;  // an empty part writes no files
  for (auto& t : second) moments.push_back(std::move(t));
  SafetensorsWriteOptions fp32;
  fp32.dtype = TensorDtype::kF32;
  const std::string model_file = split.file("model", part), optimizer_file = split.file("optimizer", part);
  if (with_master) {
    write_safetensors((fs::path(tmp_dir) / model_file).string(), master, fp32);
    if (on_file_written) on_file_written(model_file);
  }
  if (!with_moments) return;
  SafetensorsWriteOptions opt_options = fp32;
  opt_options.metadata["optimizer"] = "adamw";
  write_safetensors((fs::path(tmp_dir) / optimizer_file).string(), moments, opt_options);
  if (on_file_written) on_file_written(optimizer_file);
}

std::string finish_checkpoint(const std::string& tmp_dir, const std::string& root_dir, const ModelCard& card,
                              const TensorSplit& split, const TrainerState& state, int keep_last,
                              const CheckpointFileHook& on_file_written) {
  auto done = [&](const char* file) {
    if (on_file_written) on_file_written(file);
  };
  const std::string final_dir = (fs::path(root_dir) / checkpoint_dir_name(state.optimizer_step)).string();
  write_text(fs::path(tmp_dir) / "config.json", model_card_to_hf_config(card, "float32"));  // fp32 masters
  done("config.json");
  if (split.parts > 1) {
    const ModelLayout layout = make_model_layout(card);
    write_text(fs::path(tmp_dir) / "model.safetensors.index.json", tensor_split_index_json(layout, split, "model", {""}, 4));
    write_text(fs::path(tmp_dir) / "optimizer.safetensors.index.json",
               tensor_split_index_json(layout, split, "optimizer", {kExpAvg, kExpAvgSq}, 4));
    done("model.safetensors.index.json");
  }
  write_text(fs::path(tmp_dir) / "trainer_state.json", trainer_state_json(state).dump(2) + "\n");
  done("trainer_state.json");
  publish_dir(tmp_dir, final_dir, /*replace=*/true);
  rotate_checkpoints(root_dir, state.optimizer_step, keep_last);
  return final_dir;
}

void abandon_checkpoint(const std::string& tmp_dir) {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
}

std::string save_checkpoint(const std::string& root_dir, const CheckpointData& data, int keep_last,
                            const CheckpointFileHook& on_file_written) {
  const TrainerState& st = data.state;
  ModelLayout layout = make_model_layout(data.card);
  check_unit_sizes(layout, data.master, "checkpoint: master weights");
  check_unit_sizes(layout, data.adam_m, "checkpoint: AdamW m");
  check_unit_sizes(layout, data.adam_v, "checkpoint: AdamW v");
  check_padding_zero(layout, data.master, "checkpoint: master weights");
  check_padding_zero(layout, data.adam_m, "checkpoint: AdamW m");
  check_padding_zero(layout, data.adam_v, "checkpoint: AdamW v");
  std::vector<TensorStateView> tensors;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (const TensorSpec& t : layout.units[u].tensors) {
      const std::size_t o = static_cast<std::size_t>(t.offset), n = static_cast<std::size_t>(t.numel);
      tensors.push_back({data.master[u].subspan(o, n), data.adam_m[u].subspan(o, n), data.adam_v[u].subspan(o, n)});
    }
  const TensorSplit one = split_tensors_evenly(layout, 1);
  const std::string tmp = begin_checkpoint(root_dir, st);
  try {
    write_checkpoint_part(tmp, layout, one, 0, tensors, st.optimizer_step, on_file_written);
    return finish_checkpoint(tmp, root_dir, data.card, one, st, keep_last, on_file_written);
  } catch (...) {
    abandon_checkpoint(tmp);
    throw;
  }
}

namespace {

// The model's or the optimizer's tensors of a checkpoint folder: the index when there is one.
SafetensorsSet open_checkpoint_tensors(const std::string& dir, const char* stem) {
  const fs::path index = fs::path(dir) / (std::string(stem) + ".safetensors.index.json");
  if (fs::exists(index)) return SafetensorsSet::open_index(index.string());
  return SafetensorsSet::open_file((fs::path(dir) / (std::string(stem) + ".safetensors")).string());
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  card_ = model_card_from_hf_config(read_text_file(config_path), config_path);
  layout_ = make_model_layout(card_);
  const std::vector<std::string> names = layout_tensor_names(layout_, "");
  model_ = open_checkpoint_tensors(dir, "model");
  check_no_unexpected_tensors(model_, std::set<std::string>(names.begin(), names.end()));
  optimizer_ = open_checkpoint_tensors(dir, "optimizer");
  std::set<std::string> moment_names;
  for (const auto& n : names) {
    moment_names.insert(n + kExpAvg);
    moment_names.insert(n + kExpAvgSq);
  }
  check_no_unexpected_tensors(optimizer_, moment_names);
  found_[0] = find_unit_tensors(model_, layout_, "", TensorDtype::kF32);
  found_[1] = find_unit_tensors(optimizer_, layout_, kExpAvg, TensorDtype::kF32);
  found_[2] = find_unit_tensors(optimizer_, layout_, kExpAvgSq, TensorDtype::kF32);
  state_ = parse_trainer_state((fs::path(dir) / "trainer_state.json").string());
}

void CheckpointReader::read(Part part, int u, int64_t begin, int64_t end, float* out) const {
  const int k = static_cast<int>(part);
  read_unit_range(layout_, found_[k], u, begin, end, out);
  // Values no training step writes (a hand-edited or corrupted file) would train on silently: a
  // negative second moment makes sqrt(v) NaN at the first update.
  const bool second = part == Part::kExpAvgSq;
  const UnitLayout& unit = layout_.units[static_cast<std::size_t>(u)];
  for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
    const TensorSpec& spec = unit.tensors[t];
    for (int64_t i = std::max(begin, spec.offset); i < std::min(end, spec.offset + spec.numel); ++i) {
      const float x = out[i - begin];
      if (!std::isfinite(x) || (second && x < 0.0f)) {
        const SafetensorsSet::Ref& ref = found_[k][static_cast<std::size_t>(u)][t];
        throw InputError(ref.file->path(), fmt::format("{}[{}] is {} (must be finite{})", ref.entry->name,
                                                       i - spec.offset, x, second ? " and >= 0" : ""));
      }
    }
  }
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  const CheckpointReader reader(dir);
  LoadedCheckpoint ck;
  ck.dir = dir;
  ck.card = reader.card();
  ck.layout = reader.layout();
  ck.state = reader.state();
  ThreadPool pool(load_threads());
  using Part = CheckpointReader::Part;
  for (auto [buffers, part] : {std::pair{&ck.master, Part::kMaster}, std::pair{&ck.adam_m, Part::kExpAvg},
                               std::pair{&ck.adam_v, Part::kExpAvgSq}}) {
    *buffers = zero_unit_buffers(ck.layout);
    // Tiles of each unit: page faults on the mapped files and the checks parallelize.
    std::vector<std::pair<int, int64_t>> tiles;
    for (std::size_t u = 0; u < ck.layout.units.size(); ++u)
      for (int64_t b = 0; b < ck.layout.units[u].flat_numel; b += kReadTileElems) tiles.emplace_back(static_cast<int>(u), b);
    pool.parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t i) {
      const auto [u, b] = tiles[static_cast<std::size_t>(i)];
      std::vector<float>& unit = (*buffers)[static_cast<std::size_t>(u)];
      reader.read(part, u, b, std::min<int64_t>(b + kReadTileElems, static_cast<int64_t>(unit.size())), unit.data() + b);
    });
  }
  return ck;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root_dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(root_dir, ec)) {
    // "step-" and 8 to 18 digits (checkpoint_dir_name pads to 8; 18 digits always fit int64).
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step-", 0) != 0) continue;
    const std::string digits = name.substr(5);
    if (digits.size() < 8 || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    found.emplace_back(std::stoll(digits), entry.path().string());
  }
  if (ec) throw IoError(root_dir, "cannot list folder: " + ec.message());
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<std::string> find_latest_checkpoint(const std::string& root_dir) {
  auto all = list_checkpoints(root_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

TrainerState load_trainer_state(const std::string& dir) {
  const fs::path path = fs::path(dir) / "trainer_state.json";
  if (!fs::exists(path)) throw IoError(path.string(), "missing (not a checkpoint folder)");
  return parse_trainer_state(path.string());
}

std::string resolve_checkpoint_dir(const std::string& path) {
  if (fs::exists(fs::path(path) / "trainer_state.json")) return path;
  auto latest = find_latest_checkpoint(path);
  if (!latest)
    throw IoError(path, "no complete checkpoint to resume from (expected step-* folders or a checkpoint folder)");
  return *latest;
}

}  // namespace slidedp
