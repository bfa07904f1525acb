// safetensors, the Hugging Face tensor file: u64 little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}), then the
// data section. The reader memory-maps the file and validates it as strictly as the reference
// implementation does (tensors contiguous from 0, covering the data section exactly, sizes agreeing
// with shape x dtype), so what we accept, every standard tool accepts; every error names the file and
// the tensor. The writer pads the header with spaces to 8 bytes and records {"format": "pt"}.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/posix_file.h"

namespace slidedp {

// Every dtype of the safetensors spec; only kF32, kF16 and kBF16 convert to fp32 (model weights).
enum class TensorDtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};
const char* tensor_dtype_name(TensorDtype dtype);  // the spec's spelling: "BF16", "F8_E4M3", ...
int64_t tensor_dtype_bytes(TensorDtype dtype);
std::optional<TensorDtype> tensor_dtype_from_name(std::string_view name);

struct SafetensorsEntry {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0;  // byte range inside the data section, [begin, end)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                // 8 + N: file offset of the data section
  std::vector<SafetensorsEntry> tensors;  // ordered by begin (= file order)
  std::map<std::string, std::string> metadata;
};

// Largest header accepted (the reference implementation's limit): a lying length field is caught
// before any allocation.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates a whole file image. `path` names the file in errors. Throws InputError for a
// malformed header or inconsistent ranges, IoError for a truncated file.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& path);

// One memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsEntry* find(std::string_view name) const;
  // The tensor's raw little-endian bytes (inside the mapping).
  std::span<const uint8_t> data(const SafetensorsEntry& entry) const;
  // Converts elements [first, first + out.size()) of an F32/F16/BF16 tensor into `out` (by default the
  // whole tensor: out.size() == numel). Throws InputError naming the file and the tensor for any other
  // dtype. Thread-safe: disjoint ranges of one tensor may be read concurrently.
  void read_fp32(const SafetensorsEntry& entry, std::span<float> out, int64_t first = 0) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

// A tensor to write: fp32 values converted to the file's dtype while writing.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;  // numel(shape) elements
};

struct SafetensorsWriteOptions {
  TensorDtype dtype = TensorDtype::kBF16;  // kBF16, kF16 or kF32
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  bool fsync = true;
  // Called between blocks of data (and between tensors); it may throw to abandon the file, which is
  // then left half written: callers that need atomicity write into a temporary folder and remove it.
  std::function<void()> poll;
};

// Writes `tensors` (unique names; data in the given order) to `path`, which is overwritten in place:
// callers that need atomicity write into a temporary folder. Returns the data section's size in
// bytes (what an index's metadata.total_size sums). Throws IoError naming the path.
int64_t write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                          const SafetensorsWriteOptions& options = {});

// The tensors of one model across a single file or the shards listed by an index
// (model.safetensors.index.json), with one namespace: every name maps to exactly one file.
class SafetensorsSet {
 public:
  struct Ref {
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };

  // A Hugging Face model folder: model.safetensors when present (transformers' from_pretrained takes it
  // before the index when a folder holds both), else the shards model.safetensors.index.json lists.
  // Throws IoError when neither exists.
  static SafetensorsSet open_model_dir(const std::string& dir);
  static SafetensorsSet open_file(const std::string& path);
  // Validates the index: weight_map is an object of tensor -> shard file (a plain name in the index's
  // folder); every mapped tensor is in the shard it names and every shard tensor is mapped there.
  static SafetensorsSet open_index(const std::string& index_path);

  std::optional<Ref> find(const std::string& name) const;
  // Every tensor, shard by shard in file order.
  std::vector<Ref> all() const;
  // What the set was opened from (the index or the single file), for messages.
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Ref> by_name_;
};

}  // namespace slidedp
