// safetensors reading (strict validation, mmap) and writing; see safetensors.h for the format.
// Validation order matters for useful messages: the length field and the JSON first, then each
// tensor's own fields, then ranges against the file size (a truncated file names the first tensor it
// cuts), then the ranges against each other (overlaps and gaps name both neighbours).
#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/bf16.h"
#include "common/error.h"
#include "common/strict_json.h"
#include "common/file_util.h"
#include "io/fp16.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors and token files are little-endian; a big-endian host needs byte swaps");

namespace slidedp {
namespace {

using nlohmann::json;

struct DtypeInfo {
  TensorDtype dtype;
  const char* name;
  int64_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {TensorDtype::kBool, "BOOL", 1},      {TensorDtype::kU8, "U8", 1},
    {TensorDtype::kI8, "I8", 1},          {TensorDtype::kF8E5M2, "F8_E5M2", 1},
    {TensorDtype::kF8E4M3, "F8_E4M3", 1}, {TensorDtype::kI16, "I16", 2},
    {TensorDtype::kU16, "U16", 2},        {TensorDtype::kF16, "F16", 2},
    {TensorDtype::kBF16, "BF16", 2},      {TensorDtype::kI32, "I32", 4},
    {TensorDtype::kU32, "U32", 4},        {TensorDtype::kF32, "F32", 4},
    {TensorDtype::kF64, "F64", 8},        {TensorDtype::kI64, "I64", 8},
    {TensorDtype::kU64, "U64", 8},
};

std::string tensor_where(const std::string& path, const std::string& name) {
  return fmt::format("{}: tensor '{}'", path, name);
}

// Reads a non-negative integer that fits int64 (shape dims, offsets); nullopt otherwise.
std::optional<uint64_t> as_index(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return x;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v) {
  const std::string where = tensor_where(path, name);
  if (name.empty()) throw InputError(path, "header has a tensor with an empty name");
  if (!v.is_object()) throw InputError(where, "expected an object with dtype, shape, data_offsets");
  for (const auto& [key, _] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      throw InputError(where, fmt::format("unknown key '{}' (expected dtype, shape, data_offsets)", key));
  SafetensorsEntry e;
  e.name = name;
  if (!v.contains("dtype") || !v["dtype"].is_string())
    throw InputError(where + ".dtype", "missing or not a string");
  std::string dtype_name = v["dtype"].get<std::string>();
  auto dtype = tensor_dtype_from_name(dtype_name);
  if (!dtype) throw InputError(where + ".dtype", fmt::format("unknown dtype '{}'", dtype_name));
  e.dtype = *dtype;

  if (!v.contains("shape") || !v["shape"].is_array())
    throw InputError(where + ".shape", "missing or not an array");
  e.numel = 1;
  for (const json& d : v["shape"]) {
    auto dim = as_index(d);
    if (!dim) throw InputError(where + ".shape", "dimensions must be non-negative integers");
    // numel * 8 bytes must stay below 2^63: reject before the multiplication can overflow.
    if (*dim != 0 && static_cast<uint64_t>(e.numel) > (uint64_t{1} << 59) / *dim)
      throw InputError(where + ".shape", "element count overflows");
    e.shape.push_back(static_cast<int64_t>(*dim));
    e.numel *= static_cast<int64_t>(*dim);
  }

  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    throw InputError(where + ".data_offsets", "missing or not a [begin, end] pair");
  auto begin = as_index(v["data_offsets"][0]);
  auto end = as_index(v["data_offsets"][1]);
  if (!begin || !end) throw InputError(where + ".data_offsets", "offsets must be non-negative integers");
  if (*end < *begin)
    throw InputError(where + ".data_offsets", fmt::format("end {} is before begin {}", *end, *begin));
  e.begin = *begin;
  e.end = *end;
  uint64_t expected = static_cast<uint64_t>(e.numel) * static_cast<uint64_t>(tensor_dtype_bytes(e.dtype));
  if (e.end - e.begin != expected)
    throw InputError(
        where, fmt::format("shape [{}] x {} is {} bytes but data_offsets [{}, {}) hold {}",
                           fmt::join(e.shape, ", "), dtype_name, expected, e.begin, e.end, e.end - e.begin));
  return e;
}

}  // namespace

const char* tensor_dtype_name(TensorDtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

int64_t tensor_dtype_bytes(TensorDtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.bytes;
  return 0;
}

std::optional<TensorDtype> tensor_dtype_from_name(std::string_view name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& path) {
  if (file.size() < 8)
    throw IoError(path,
                  fmt::format("truncated: {} bytes, shorter than the 8-byte header length", file.size()));
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > kMaxSafetensorsHeaderBytes)
    throw InputError(path, fmt::format("header length {} exceeds the {}-byte limit (not a safetensors file?)",
                                       n, kMaxSafetensorsHeaderBytes));
  if (n < 2) throw InputError(path, fmt::format("header length {} is too small for a JSON object", n));
  if (8 + n > file.size())
    throw IoError(
        path, fmt::format("truncated: header length says {} bytes but only {} follow", n, file.size() - 8));
  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
  if (text.front() != '{') throw InputError(path, "header does not start with '{' (not a safetensors file?)");

  // The reference parser rejects duplicate keys, and a duplicate tensor name would make two tensors
  // share one name: the strict parse refuses them.
  const json header = parse_json_strict<json>(text, path + " (header)");
  if (!header.is_object()) throw InputError(path, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_bytes = file.size() - h.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw InputError(path + ": __metadata__", "expected an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) throw InputError(path + ": __metadata__." + mk, "expected a string value");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(path, key, value);
    if (e.end > data_bytes)
      throw IoError(tensor_where(path, key),
                    fmt::format("data_offsets [{}, {}) run past the {}-byte data section (file truncated, or "
                                "the header lies)",
                                e.begin, e.end, data_bytes));
    h.tensors.push_back(std::move(e));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The reference implementation requires the ranges to tile the data section exactly.
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : h.tensors) {
    if (e.begin < covered)
      throw InputError(tensor_where(path, e.name),
                       fmt::format("data_offsets [{}, {}) overlap tensor '{}' (which ends at {})", e.begin,
                                   e.end, previous->name, covered));
    if (e.begin > covered)
      throw InputError(
          tensor_where(path, e.name),
          fmt::format("data_offsets begin at {} but the previous tensor ends at {}: {} bytes belong "
                      "to no tensor",
                      e.begin, covered, e.begin - covered));
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes)
    throw InputError(path,
                     fmt::format("{} bytes after the last tensor belong to no tensor", data_bytes - covered));
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  header_ = parse_safetensors(file_.bytes(), path);
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) by_name_[header_.tensors[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const uint8_t> SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return file_.bytes().subspan(header_.data_start + entry.begin, entry.end - entry.begin);
}

void SafetensorsFile::read_fp32(const SafetensorsEntry& entry, std::span<float> out, int64_t first) const {
  SLIDEDP_CHECK(first >= 0 && first + static_cast<int64_t>(out.size()) <= entry.numel,
                "read_fp32 range outside tensor " + entry.name);
  std::span<const uint8_t> bytes = data(entry);
  const uint8_t* p = bytes.data() + first * tensor_dtype_bytes(entry.dtype);
  const std::size_t n = out.size();
  // Data offsets need not be aligned, so elements are read with memcpy (compiled to plain loads).
  switch (entry.dtype) {
    case TensorDtype::kF32:
      if (n > 0) std::memcpy(out.data(), p, n * 4);
      return;
    case TensorDtype::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_to_float(b);
      }
      return;
    case TensorDtype::kF16:
      for (std::size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = half_to_float(h);
      }
      return;
    default:
      throw InputError(tensor_where(path(), entry.name),
                       fmt::format("dtype {} is not a floating-point weight type (BF16, F16, F32)",
                                   tensor_dtype_name(entry.dtype)));
  }
}

int64_t write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                          const SafetensorsWriteOptions& options) {
  const TensorDtype dtype = options.dtype;
  SLIDEDP_CHECK(dtype == TensorDtype::kF32 || dtype == TensorDtype::kBF16 || dtype == TensorDtype::kF16,
                "write_safetensors writes F32, F16 or BF16 only");
  const uint64_t elem_bytes = static_cast<uint64_t>(tensor_dtype_bytes(dtype));
  json header = json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    SLIDEDP_CHECK(static_cast<int64_t>(t.values.size()) == numel, "values/shape mismatch for " + t.name);
    SLIDEDP_CHECK(!t.name.empty() && t.name != "__metadata__" && names.insert(t.name).second,
                  "tensor names must be unique and non-empty: " + t.name);
    uint64_t bytes = static_cast<uint64_t>(numel) * elem_bytes;
    header[t.name] = {
        {"dtype", tensor_dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  std::string text = header.dump();
  // The spec allows trailing spaces in the header; padding to 8 bytes keeps the data section aligned
  // for readers that map it directly (the reference writer does the same).
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();

  OutputFile out(path);
  out.write(&n, 8);
  out.write(text);
  constexpr std::size_t kBlock = 1 << 16;  // elements converted per write
  std::vector<uint16_t> narrow;
  for (const auto& t : tensors) {
    if (options.poll) options.poll();
    if (dtype == TensorDtype::kF32) {
      out.write(t.values.data(), t.values.size() * 4);
      continue;
    }
    for (std::size_t i = 0; i < t.values.size(); i += kBlock) {
      if (options.poll && i > 0) options.poll();
      std::size_t m = std::min(kBlock, t.values.size() - i);
      narrow.resize(m);
      if (dtype == TensorDtype::kBF16) {
        for (std::size_t k = 0; k < m; ++k) narrow[k] = float_to_bf16(t.values[i + k]);
      } else {
        for (std::size_t k = 0; k < m; ++k) narrow[k] = float_to_half(t.values[i + k]);
      }
      out.write(narrow.data(), m * 2);
    }
  }
  out.finish(options.fsync);
  return static_cast<int64_t>(offset);
}

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
  SafetensorsSet set;
  set.origin_ = path;
  set.files_.push_back(std::make_unique<SafetensorsFile>(path));
  const SafetensorsFile* f = set.files_.back().get();
  for (const auto& e : f->tensors()) set.by_name_[e.name] = Ref{f, &e};
  return set;
}

SafetensorsSet SafetensorsSet::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  const json index = parse_json_strict<json>(read_text_file(index_path), index_path);
  if (!index.is_object()) throw InputError(index_path, "expected a JSON object");
  for (const auto& [key, _] : index.items())
    if (key != "metadata" && key != "weight_map")
      throw InputError(index_path + ": " + key, "unknown key (expected metadata, weight_map)");
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw InputError(index_path + ": weight_map", "missing or not an object");
  // metadata.total_size is informational: transformers never reads it, and published checkpoints do
  // not always agree with it, so it is not checked here (scripts/check_safetensors.py checks ours).
  const json& weight_map = index["weight_map"];
  if (weight_map.empty()) throw InputError(index_path + ": weight_map", "is empty");

  SafetensorsSet set;
  set.origin_ = index_path;
  fs::path folder = fs::path(index_path).parent_path();
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [tensor, file] : weight_map.items()) {
    if (!file.is_string())
      throw InputError(index_path + ": weight_map." + tensor, "expected a shard file name (string)");
    std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.front() == '.')
      throw InputError(index_path + ": weight_map." + tensor,
                       fmt::format("'{}' is not a plain file name in the index's folder", shard));
    if (!shards.count(shard)) {
      set.files_.push_back(std::make_unique<SafetensorsFile>((folder / shard).string()));
      shards[shard] = set.files_.back().get();
    }
    const SafetensorsFile* f = shards[shard];
    const SafetensorsEntry* e = f->find(tensor);
    if (e == nullptr)
      throw InputError(index_path + ": weight_map." + tensor,
                       fmt::format("maps the tensor to {} but that file has no such tensor", f->path()));
    set.by_name_[tensor] = Ref{f, e};
  }
  for (const auto& [shard, f] : shards)
    for (const auto& e : f->tensors()) {
      auto it = set.by_name_.find(e.name);
      if (it == set.by_name_.end() || it->second.file != f)
        throw InputError(tensor_where(f->path(), e.name),
                         fmt::format("is not mapped to this shard by {}", index_path));
    }
  return set;
}

SafetensorsSet SafetensorsSet::open_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  // transformers' from_pretrained takes model.safetensors before the index when a folder holds both
  // (modeling_utils, _get_resolved_checkpoint_files): load what it loads.
  if (fs::exists(single)) return open_file(single.string());
  if (fs::exists(index)) return open_index(index.string());
  if (!fs::is_directory(dir)) throw IoError(dir, "no such folder");
  throw IoError(dir, "holds neither model.safetensors nor model.safetensors.index.json");
}

std::optional<SafetensorsSet::Ref> SafetensorsSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<SafetensorsSet::Ref> SafetensorsSet::all() const {
  std::vector<Ref> refs;
  for (const auto& f : files_)
    for (const auto& e : f->tensors()) refs.push_back(Ref{f.get(), &e});
  return refs;
}

}  // namespace slidedp
