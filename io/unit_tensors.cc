// Tensor name <-> unit flat buffer mapping; see unit_tensors.h.
#include "io/unit_tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace slidedp {

UnitSpans unit_spans(const UnitBuffers& units) {
  UnitSpans spans;
  spans.reserve(units.size());
  for (const auto& u : units) spans.emplace_back(u.data(), u.size());
  return spans;
}

UnitBuffers zero_unit_buffers(const ModelLayout& layout) {
  UnitBuffers units;
  units.reserve(layout.units.size());
  for (const auto& u : layout.units) units.emplace_back(static_cast<std::size_t>(u.flat_numel), 0.0f);
  return units;
}

void check_unit_sizes(const ModelLayout& layout, const UnitSpans& units, const std::string& what) {
  if (units.size() != layout.units.size())
    throw InputError(what, fmt::format("{} unit buffers given, the model has {} units", units.size(),
                                       layout.units.size()));
  for (std::size_t u = 0; u < units.size(); ++u)
    if (static_cast<int64_t>(units[u].size()) != layout.units[u].flat_numel)
      throw InputError(what, fmt::format("unit {} buffer has {} elements, its layout needs {}", u,
                                         units[u].size(), layout.units[u].flat_numel));
}

std::vector<std::string> layout_tensor_names(const ModelLayout& layout, const std::string& suffix) {
  std::vector<std::string> names;
  for (const auto& u : layout.units)
    for (const auto& t : u.tensors) names.push_back(t.name + suffix);
  return names;
}

UnitTensorRefs find_unit_tensors(const SafetensorsSet& src, const ModelLayout& layout, const std::string& suffix,
                                 std::optional<TensorDtype> require_dtype) {
  UnitTensorRefs found(layout.units.size());
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (const TensorSpec& spec : layout.units[u].tensors) {
      const std::string name = spec.name + suffix;
      auto ref = src.find(name);
      if (!ref)
        throw InputError(src.origin(),
                         fmt::format("missing tensor '{}' (shape [{}])", name, fmt::join(spec.shape, ", ")));
      const SafetensorsEntry& e = *ref->entry;
      const std::string where = fmt::format("{}: tensor '{}'", ref->file->path(), name);
      if (e.shape != spec.shape)
        throw InputError(where, fmt::format("shape [{}] does not match the config's [{}]",
                                            fmt::join(e.shape, ", "), fmt::join(spec.shape, ", ")));
      if (require_dtype && e.dtype != *require_dtype)
        throw InputError(where, fmt::format("dtype {} where {} is required", tensor_dtype_name(e.dtype),
                                            tensor_dtype_name(*require_dtype)));
      if (e.dtype != TensorDtype::kF32 && e.dtype != TensorDtype::kF16 && e.dtype != TensorDtype::kBF16)
        throw InputError(where, fmt::format("dtype {} is not a floating-point weight type (BF16, F16, F32)",
                                            tensor_dtype_name(e.dtype)));
      found[u].push_back(*ref);
    }
  return found;
}

void read_unit_range(const ModelLayout& layout, const UnitTensorRefs& found, int u, int64_t begin, int64_t end,
                     float* out) {
  const UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
  SLIDEDP_CHECK(begin >= 0 && begin <= end && end <= unit.flat_numel, "read_unit_range: range outside the unit");
  std::fill(out, out + (end - begin), 0.0f);  // padding
  for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
    const TensorSpec& spec = unit.tensors[t];
    const int64_t b = std::max(begin, spec.offset), e = std::min(end, spec.offset + spec.numel);
    if (b >= e) continue;
    const SafetensorsSet::Ref& ref = found[static_cast<std::size_t>(u)][t];
    ref.file->read_fp32(*ref.entry, std::span<float>(out + (b - begin), static_cast<std::size_t>(e - b)), b - spec.offset);
  }
}

void read_unit_tensors(const SafetensorsSet& src, const ModelLayout& layout, const std::string& suffix,
                       UnitBuffers& units, std::optional<TensorDtype> require_dtype, ThreadPool* pool) {
  SLIDEDP_CHECK(units.size() == layout.units.size(), "read_unit_tensors: unit count mismatch");
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    SLIDEDP_CHECK(static_cast<int64_t>(units[u].size()) == layout.units[u].flat_numel, "unit buffer size mismatch");
  const UnitTensorRefs found = find_unit_tensors(src, layout, suffix, require_dtype);
  struct Job {
    SafetensorsSet::Ref ref;
    float* dst;
    int64_t numel;
  };
  std::vector<Job> jobs;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (std::size_t t = 0; t < found[u].size(); ++t) {
      const TensorSpec& spec = layout.units[u].tensors[t];
      jobs.push_back(Job{found[u][t], units[u].data() + spec.offset, spec.numel});
    }
  // Tiles: (job, element range). Conversion is per element, so the result does not depend on tiling.
  std::vector<std::pair<std::size_t, int64_t>> tiles;  // (job index, first element)
  for (std::size_t j = 0; j < jobs.size(); ++j)
    for (int64_t first = 0; first < jobs[j].numel; first += kReadTileElems) tiles.emplace_back(j, first);
  auto run_tile = [&](int64_t t) {
    const auto& [j, first] = tiles[static_cast<std::size_t>(t)];
    const Job& job = jobs[j];
    const int64_t n = std::min(kReadTileElems, job.numel - first);
    job.ref.file->read_fp32(*job.ref.entry, std::span<float>(job.dst + first, static_cast<std::size_t>(n)),
                            first);
  };
  if (pool != nullptr) {
    pool->parallel_for(static_cast<int64_t>(tiles.size()), run_tile);
  } else {
    for (std::size_t t = 0; t < tiles.size(); ++t) run_tile(static_cast<int64_t>(t));
  }
}

int load_threads() { return std::max(1, std::min(32, ThreadPool::available_cpus())); }

void check_no_unexpected_tensors(const SafetensorsSet& src, const std::set<std::string>& expected,
                                 const std::set<std::string>& ignorable) {
  for (const auto& ref : src.all()) {
    const std::string& name = ref.entry->name;
    if (!expected.count(name) && !ignorable.count(name))
      throw InputError(fmt::format("{}: tensor '{}'", ref.file->path(), name),
                       "unexpected tensor: the config describes no such parameter");
  }
}

std::string TensorSplit::file(const std::string& stem, int part) const {
  return parts == 1 ? stem + ".safetensors" : fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, part + 1, parts);
}

TensorSplit split_tensors_evenly(const ModelLayout& layout, int parts) {
  SLIDEDP_CHECK(parts >= 1, "split_tensors_evenly: parts >= 1");
  TensorSplit split;
  split.parts = parts;
  int64_t total = 0;
  for (const auto& unit : layout.units)
    for (const auto& t : unit.tensors) total += t.numel;
  int64_t before = 0;
  for (const auto& unit : layout.units) {
    split.part_of.emplace_back();
    for (const auto& t : unit.tensors) {
      const int64_t middle2 = 2 * before + t.numel;  // twice the middle, to stay in integers
      split.part_of.back().push_back(
          static_cast<int>(std::min<int64_t>(parts - 1, total > 0 ? middle2 * parts / (2 * total) : 0)));
      before += t.numel;
    }
  }
  return split;
}

std::string tensor_split_index_json(const ModelLayout& layout, const TensorSplit& split, const std::string& stem,
                                    const std::vector<std::string>& suffixes, int64_t bytes_per_element) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (const std::string& suffix : suffixes)
    for (std::size_t u = 0; u < layout.units.size(); ++u)
      for (std::size_t t = 0; t < layout.units[u].tensors.size(); ++t) {
        weight_map[layout.units[u].tensors[t].name + suffix] = split.file(stem, split.part_of[u][t]);
        total += layout.units[u].tensors[t].numel * bytes_per_element;
      }
  return nlohmann::ordered_json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
}

std::vector<TensorToWrite> unit_tensors_to_write(const ModelLayout& layout, const UnitSpans& units,
                                                 const std::string& suffix) {
  SLIDEDP_CHECK(units.size() == layout.units.size(), "unit_tensors_to_write: unit count mismatch");
  std::vector<TensorToWrite> out;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (const TensorSpec& spec : layout.units[u].tensors)
      out.push_back(TensorToWrite{
          spec.name + suffix, spec.shape,
          units[u].subspan(static_cast<std::size_t>(spec.offset), static_cast<std::size_t>(spec.numel))});
  return out;
}

}  // namespace slidedp
