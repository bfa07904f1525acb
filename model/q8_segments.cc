// Segments of 8-bit moment blocks; see q8_segments.h.
#include "model/q8_segments.h"

#include <algorithm>

#include "card/shard_range.h"
#include "common/error.h"
#include "common/q8_block.h"
#include "model/plan.h"

namespace slidedp {

std::vector<int64_t> q8_segment_bounds(const UnitLayout& unit, int64_t chunk_numel, int shard_pieces) {
  SLIDEDP_CHECK(chunk_numel > 0 && shard_pieces >= 1);
  const int64_t n = unit.flat_numel;
  std::vector<int64_t> bounds = {0, n};
  for (const TensorSpec& t : unit.tensors) bounds.insert(bounds.end(), {t.offset, t.offset + t.numel});
  for (int64_t b = 0; b < n; b += chunk_numel) {
    const int64_t count = std::min(chunk_numel, n - b);
    for (int r = 0; r < shard_pieces; ++r) bounds.push_back(b + shard_range(count, shard_pieces, r).begin);
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

int64_t q8_blocks_in(const std::vector<int64_t>& bounds, int64_t begin, int64_t end) {
  auto it = std::lower_bound(bounds.begin(), bounds.end(), begin);
  SLIDEDP_CHECK(it != bounds.end() && *it == begin, "8-bit moments: a range starts on a segment boundary");
  int64_t blocks = 0;
  for (; it + 1 != bounds.end() && *it < end; ++it) {
    SLIDEDP_CHECK(*(it + 1) <= end, "8-bit moments: a range ends on a segment boundary");
    blocks += (*(it + 1) - *it + kQ8Block - 1) / kQ8Block;
  }
  return blocks;
}

int64_t q8_model_blocks(const ModelLayout& layout, int64_t chunk_numel, int shard_pieces) {
  int64_t blocks = 0;
  for (const UnitLayout& u : layout.units)
    blocks += q8_blocks_in(q8_segment_bounds(u, chunk_numel, shard_pieces), 0, u.flat_numel);
  return blocks;
}

}  // namespace slidedp
