// Hugging Face tensor names <-> unit flat buffers (card/unit_layout.h). Shared by the model folder
// reader/writer and by checkpoints: each unit is one fp32 buffer of layout.units[u].flat_numel
// elements, every named tensor at its aligned offset, the padding zero.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "common/thread_pool.h"
#include "io/safetensors.h"

namespace slidedp {

using UnitBuffers = std::vector<std::vector<float>>;  // [unit] -> (flat_numel,) fp32, host
using UnitSpans = std::vector<std::span<const float>>;

UnitSpans unit_spans(const UnitBuffers& units);

// Allocates zeroed buffers of the layout's unit sizes.
UnitBuffers zero_unit_buffers(const ModelLayout& layout);

// Checks `units` has one buffer per unit with flat_numel elements each (InputError naming `what`).
void check_unit_sizes(const ModelLayout& layout, const UnitSpans& units, const std::string& what);

// Every tensor name of the layout with `suffix` appended ("" for weights, ".exp_avg" for AdamW m).
std::vector<std::string> layout_tensor_names(const ModelLayout& layout, const std::string& suffix);

// The layout's tensors (names + `suffix`) in `src`, [unit][tensor], each checked as read_unit_tensors
// says (present, exact shape, a floating-point dtype, exactly `require_dtype` when given).
using UnitTensorRefs = std::vector<std::vector<SafetensorsSet::Ref>>;
UnitTensorRefs find_unit_tensors(const SafetensorsSet& src, const ModelLayout& layout, const std::string& suffix,
                                 std::optional<TensorDtype> require_dtype = std::nullopt);

// Elements [begin, end) of unit u's flat buffer, read from `found` into `out` (padding zero): a shard
// of the unit without reading the rest of it.
void read_unit_range(const ModelLayout& layout, const UnitTensorRefs& found, int u, int64_t begin, int64_t end,
                     float* out);

// Reads the layout's tensors (names + `suffix`) from `src` into `units` (already sized, padding left
// untouched). Every tensor must be present, F32/F16/BF16 (exactly `require_dtype` when given), with
// exactly the layout's shape; errors name the file and the tensor.
// All tensors are validated before any is converted; the conversion runs on `pool` when given (tiles
// of kReadTileElems elements; page faults on the mapped files and the conversion both parallelize).
void read_unit_tensors(const SafetensorsSet& src, const ModelLayout& layout, const std::string& suffix,
                       UnitBuffers& units, std::optional<TensorDtype> require_dtype = std::nullopt,
                       ThreadPool* pool = nullptr);
inline constexpr int64_t kReadTileElems = int64_t{1} << 20;

// A pool for loading: every CPU this process may use, at most 32 (beyond that, memory bandwidth).
int load_threads();

// Fails (InputError naming the file and tensor) when `src` holds a tensor that is not in `expected`
// and not in `ignorable`.
void check_no_unexpected_tensors(const SafetensorsSet& src, const std::set<std::string>& expected,
                                 const std::set<std::string>& ignorable = {});

// Which of `parts` files each of the layout's tensors goes to (a model or checkpoint written in parts).
struct TensorSplit {
  int parts = 1;
  std::vector<std::vector<int>> part_of;  // [unit][tensor] -> part, non-decreasing in layout order
  // "<stem>.safetensors" for one part, else Hugging Face's "<stem>-00002-of-00004.safetensors" (part 1 of 4)
  std::string file(const std::string& stem, int part) const;
};
// `parts` contiguous groups of the layout's tensors, each about total/parts elements (a tensor goes to
// the group its middle element falls in; a group is empty when one tensor is larger than total/parts).
TensorSplit split_tensors_evenly(const ModelLayout& layout, int parts);
// A Hugging Face index (model.safetensors.index.json) of the split: every tensor name + suffix to its
// file "<stem>...", metadata.total_size at `bytes_per_element`.
std::string tensor_split_index_json(const ModelLayout& layout, const TensorSplit& split, const std::string& stem,
                                    const std::vector<std::string>& suffixes, int64_t bytes_per_element);

// The layout's tensors as writer inputs, views into `units` (names + `suffix`), in unit order.
std::vector<TensorToWrite> unit_tensors_to_write(const ModelLayout& layout, const UnitSpans& units,
                                                 const std::string& suffix);

}  // namespace slidedp
